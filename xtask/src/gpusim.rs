//! `cargo xtask test-multigpu --simulated [--filter SUBSTRING]`: the GPU suites on c10d-gpusim,
//! the simulated CUDA driver and NCCL (no GPU needed; CI runs it).
//!
//! The simulator library is laid out under the names the real ones are found by
//! (`target/gpusim/libcuda.so{,.1}` on `LD_LIBRARY_PATH`, `libnccl.so.2` as
//! `C10D_NCCL_LIBRARY`), so c10d-nccl's own code runs unchanged. Runs, with seeded random
//! delays before every stream operation (`C10D_SIM_DELAY_US`, default 50; `C10D_SIM_SEED`,
//! default 1):
//! 1. the suites (`gpu`, `gpu_world`) at world sizes 1, 2, 4 and 8, one simulated device per
//!    rank (`C10D_GPU_WORLD_SIZES` overrides);
//! 2. `gpu` at world 2 with both ranks on one device (distinct `NCCL_HOSTID`s), and at world
//!    2 with every non-blocking `ncclGroupEnd` answering `ncclInProgress` (graph capture
//!    included: c10d-nccl's communicators are non-blocking by default);
//! 3. `c10d-bench --backend nccl`, every op with its result check;
//! 4. the sabotage check: the ordering cases again with `C10D_SIM_DROP_STREAM_WAITS=1`
//!    (`cuStreamWaitEvent` ignored); they must fail, which proves they can.
//!
//! With `--filter`, only the `gpu` cases whose names contain the substring run (steps 1, 2).

use crate::{build_gpu_tests, built_artifact, built_executable, cargo, run_gpu_binaries, Res};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The cases that check ordering between streams: each must fail when stream waits are
/// dropped.
/// (Found by running the whole suite with waits dropped: these fail on their data; the cases
/// that park a stream fail too, but as a consequence of the first failures.)
const ORDERING_CASES: &str = "ordered_after_a_late_producer,cuda_graph_capture_replayed_three_times,cudarc_slices_every_dtype,cudarc_views_and_parts_of_buffers";

/// Links the simulator library `lib` under the names the real libraries are found by, in
/// `target/gpusim`; returns that directory.
pub(crate) fn layout(lib: &Path) -> Result<PathBuf, String> {
    let dir = lib
        .parent()
        .and_then(Path::parent)
        .ok_or("no target directory")?
        .join("gpusim");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for name in ["libcuda.so", "libcuda.so.1", "libnccl.so.2"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        // Links, not copies: the dynamic loader then opens one library for both names, so the
        // simulated NCCL queues its work on the simulated driver's streams.
        std::os::unix::fs::symlink(lib, &link).map_err(|e| format!("{}: {e}", link.display()))?;
    }
    Ok(dir)
}

/// Builds c10d-gpusim's shared library; returns its path.
pub(crate) fn build_simulator() -> Result<PathBuf, String> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--message-format=json",
        "-p",
        "c10d-gpusim",
        "--lib",
    ]);
    built_artifact(&mut cmd, "c10d_gpusim", "shared library", |l| {
        l.split('"')
            .find(|p| p.ends_with("libc10d_gpusim.so"))
            .map(PathBuf::from)
    })
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

/// Runs the simulated suites; see the module documentation.
pub fn test_simulated(args: &[String]) -> Res {
    let filter = args
        .iter()
        .position(|a| a == "--filter")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let dir = layout(&build_simulator()?)?;
    let binaries = build_gpu_tests(false)?;
    let mut bench = cargo();
    bench.args([
        "build",
        "--message-format=json",
        "-p",
        "c10d-tools",
        "--bin",
        "c10d-bench",
    ]);
    let bench = built_executable(&mut bench, "c10d-bench")?;
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    };
    let mut base: Vec<(String, String)> = vec![
        ("LD_LIBRARY_PATH".into(), ld),
        (
            "C10D_NCCL_LIBRARY".into(),
            dir.join("libnccl.so.2").display().to_string(),
        ),
        ("C10D_SIM_SEED".into(), env_or("C10D_SIM_SEED", "1")),
        (
            "C10D_SIM_DELAY_US".into(),
            env_or("C10D_SIM_DELAY_US", "50"),
        ),
        ("C10D_SIM_GPUS".into(), "8".into()),
        (
            "C10D_GPU_WORLD_SIZES".into(),
            env_or("C10D_GPU_WORLD_SIZES", "1,2,4,8"),
        ),
    ];
    if let Some(f) = &filter {
        base.push(("C10D_GPU_CASES".into(), f.clone()));
    }
    let with = |extra: &[(&str, &str)]| {
        let mut v = base.clone();
        for (k, val) in extra {
            v.retain(|(name, _)| name != k);
            v.push((k.to_string(), val.to_string()));
        }
        v
    };
    println!(
        "c10d-gpusim: simulated CUDA and NCCL from {}",
        dir.display()
    );
    let suites: &[PathBuf] = if filter.is_some() {
        &binaries[..1]
    } else {
        &binaries
    };
    let (mut passed, mut failed) = run_gpu_binaries(suites, &base);
    println!("c10d-gpusim: world 2 on one shared device");
    let shared = with(&[("C10D_SIM_GPUS", "1"), ("C10D_GPU_WORLD_SIZES", "2")]);
    let (p, f) = run_gpu_binaries(&binaries[..1], &shared);
    (passed, failed) = (passed + p, failed + f);
    println!("c10d-gpusim: world 2, non-blocking ncclGroupEnd answering ncclInProgress");
    let in_progress = with(&[
        ("C10D_GPU_WORLD_SIZES", "2"),
        ("C10D_SIM_GROUP_END_IN_PROGRESS", "1"),
    ]);
    let (p, f) = run_gpu_binaries(&binaries[..1], &in_progress);
    (passed, failed) = (passed + p, failed + f);
    if filter.is_none() {
        let (p, f) = crate::bench_every_op_with(&bench, &base);
        (passed, failed) = (passed + p, failed + f);
        match sabotage(&binaries[0], &with(&[("C10D_GPU_WORLD_SIZES", "2")])) {
            Ok(line) => {
                passed += 1;
                println!("sabotage_drop_stream_waits ok: {line}");
            }
            Err(e) => {
                failed += 1;
                println!("sabotage_drop_stream_waits FAILED: {e}");
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        return Err(format!("{failed} simulated GPU test(s) failed"));
    }
    Ok(())
}

/// The ordering cases with `cuStreamWaitEvent` ignored: Ok (naming the failed cases) when
/// every one of them failed.
fn sabotage(bin: &Path, envs: &[(String, String)]) -> Result<String, String> {
    let out = Command::new(bin)
        .env("C10D_REQUIRE_GPU", "1")
        .env("C10D_GPU_CASES", ORDERING_CASES)
        .env("C10D_SIM_DROP_STREAM_WAITS", "1")
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .output()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let failed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("world ") && l.contains(" FAILED"))
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    let missed: Vec<&str> = ORDERING_CASES
        .split(',')
        .filter(|c| !failed.iter().any(|f| f.contains(c)))
        .collect();
    if missed.is_empty() {
        Ok(format!(
            "with cuStreamWaitEvent dropped these failed as they must: {}",
            failed.join(", ")
        ))
    } else {
        Err(format!(
            "with cuStreamWaitEvent dropped these still passed: {}",
            missed.join(", ")
        ))
    }
}
