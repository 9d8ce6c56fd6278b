//! The GPU suite (`cargo xtask test-multigpu`; `harness = false`). Without a GPU it prints
//! `skipped: no GPU` and succeeds (fails instead when `C10D_REQUIRE_GPU=1`).
//!
//! The parent starts a TCP store on 127.0.0.1 (port 0) and runs the cases at every world size
//! from 1 to `C10D_GPU_WORLD_SIZES` (default: 1, 2 and 4), one process per rank. Several ranks
//! share one GPU: each gets its own `NCCL_HOSTID`, so NCCL treats them as separate hosts and
//! joins them through its socket transport over `lo` (it refuses two ranks on one device of one
//! host). Every rank runs every case and reports `ok`/`FAILED` per case; the parent prints one
//! line per case and world size, then `N passed, M failed`, and exits non-zero on a failure.

mod gpu {
    pub mod cases;
    pub mod values;
}

use c10d_store::{ServerOptions, TcpStoreServer};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

fn main() {
    if let Ok(rank) = std::env::var("C10D_GPU_RANK") {
        std::process::exit(gpu::cases::worker(rank.parse().expect("rank")));
    }
    if std::env::var_os("C10D_GPU_TEARDOWN").is_some() {
        gpu::cases::teardown_child();
    }
    if std::env::var_os("C10D_GPU_NCCL_CHECK").is_some() {
        // In a process of its own: opening PyTorch's libnccl.so.2 next to the one the loader
        // picks would make the dynamic loader hand one for the other.
        match pytorch_nccl() {
            Some(Ok(line)) => println!("ok: {line}"),
            Some(Err(e)) => println!("FAILED: {e}"),
            None => println!("skipped: no PyTorch with CUDA here"),
        }
        return;
    }
    if c10d_nccl::cuda_device_count() == 0 {
        if std::env::var("C10D_REQUIRE_GPU").as_deref() == Ok("1") {
            eprintln!(
                "no GPU, but C10D_REQUIRE_GPU=1: {}",
                c10d_nccl::cuda::cuda_status().detail
            );
            std::process::exit(1);
        }
        println!("skipped: no GPU");
        return;
    }
    if let Err(e) = c10d_nccl::check_available() {
        eprintln!("NCCL unavailable: {e}");
        std::process::exit(1);
    }
    let sizes: Vec<usize> = std::env::var("C10D_GPU_WORLD_SIZES")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!(
        "NCCL {} from {}; {} GPU(s)",
        c10d_nccl::nccl_version().expect("version"),
        c10d_nccl::nccl_library().expect("library").location(),
        c10d_nccl::cuda_device_count()
    );
    let check = Command::new(std::env::current_exe().expect("current exe"))
        .env("C10D_GPU_NCCL_CHECK", "1")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| format!("FAILED: {e}"));
    println!("nccl_version_vs_pytorch {check}");
    let (mut passed, mut failed) = if check.starts_with("ok") {
        (1, 0)
    } else if check.starts_with("FAILED") {
        (0, 1)
    } else {
        (0, 0)
    };
    match teardown() {
        Ok(line) => {
            passed += 1;
            println!("watchdog_tears_the_process_down ok: {line}");
        }
        Err(e) => {
            failed += 1;
            println!("watchdog_tears_the_process_down FAILED: {e}");
        }
    }
    for w in sizes {
        let (p, f) = run_world(w);
        passed += p;
        failed += f;
    }
    println!("{passed} passed, {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 });
}

/// PyTorch's default `TORCH_NCCL_ASYNC_ERROR_HANDLING` (3): a one-rank job whose op can never
/// finish is ended by its watchdog with SIGABRT and the timeout message on stderr.
fn teardown() -> Result<String, String> {
    use std::os::unix::process::ExitStatusExt;
    let out = Command::new(std::env::current_exe().expect("current exe"))
        .env("C10D_GPU_TEARDOWN", "1")
        .env_remove("TORCH_NCCL_ASYNC_ERROR_HANDLING")
        .output()
        .map_err(|e| e.to_string())?;
    let err = String::from_utf8_lossy(&out.stderr);
    let aborted = out.status.signal() == Some(6);
    if aborted
        && err.contains("Watchdog caught collective operation timeout")
        && err.contains("taking the entire process down")
    {
        Ok(format!("child ended by SIGABRT ({})", out.status))
    } else {
        Err(format!(
            "child {}: stdout {:?} stderr {:?}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            err
        ))
    }
}

/// Where PyTorch with CUDA is installed (`C10D_TORCH_PYTHON`, else `/opt/torch/.venv`): the
/// NCCL of its wheel, found by our loader, must be the version `torch.cuda.nccl.version()`
/// reports; also says whether the NCCL this process loaded is that one. `None` without PyTorch.
fn pytorch_nccl() -> Option<Result<String, String>> {
    let python = std::env::var("C10D_TORCH_PYTHON")
        .ok()
        .or_else(|| Some("/opt/torch/.venv/bin/python".to_string()))
        .filter(|p| std::path::Path::new(p).exists())?;
    let out = Command::new(&python)
        .args([
            "-c",
            "import torch; print('.'.join(map(str, torch.cuda.nccl.version())))",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let torch_version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let py = python.clone();
    let var = move |k: &str| match k {
        "C10D_TORCH_PYTHON" => Some(py.clone()),
        "PATH" => Some(String::new()),
        _ => None,
    };
    let env = c10d_nccl::loader::SearchEnv {
        var: &var,
        soname: "libc10d-test-no-such-nccl.so.2",
        python_timeout: std::time::Duration::from_secs(60),
    };
    let found = match c10d_nccl::loader::locate(&env, &mut |t| c10d_nccl::NcclLibrary::open(t)) {
        Ok(f) => f,
        Err(e) => return Some(Err(format!("PyTorch's NCCL not found by the loader: {e}"))),
    };
    let wheel = found.value.version().to_string();
    if wheel != torch_version {
        return Some(Err(format!(
            "{} is NCCL {wheel}, torch.cuda.nccl.version() says {torch_version}",
            found.target
        )));
    }
    Some(Ok(format!(
        "PyTorch's NCCL {torch_version} found by the loader at {} (the suite runs on the NCCL the loader picks first; C10D_NCCL_LIBRARY chooses)",
        found.target
    )))
}

/// How long one world size may run (`C10D_GPU_WORLD_LIMIT_S`, default 300 s).
fn world_limit() -> std::time::Duration {
    let s = std::env::var("C10D_GPU_WORLD_LIMIT_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    std::time::Duration::from_secs(s)
}

/// Runs every case at world size `w`; (passed, failed) counted per case (a case passes when
/// every rank passed it).
fn run_world(w: usize) -> (usize, usize) {
    let server = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..ServerOptions::default()
    })
    .expect("store server");
    let exe = std::env::current_exe().expect("current exe");
    let start = Instant::now();
    let children: Vec<_> = (0..w)
        .map(|r| {
            Command::new(&exe)
                .env("C10D_GPU_RANK", r.to_string())
                .env("C10D_GPU_WORLD", w.to_string())
                .env("C10D_GPU_STORE_PORT", server.port().to_string())
                .env("NCCL_HOSTID", format!("c10d-rank-{r}"))
                .env("NCCL_SOCKET_IFNAME", "lo")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn rank")
        })
        .collect();
    let mut results: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut order = Vec::new();
    let deadline = Instant::now() + world_limit();
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    std::thread::spawn(move || {
        while Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        for p in pids {
            // The world ran past its limit: end every rank (their pipes then close).
            let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
        }
    });
    for mut c in children {
        let out = c.stdout.take().expect("piped");
        for line in BufReader::new(out)
            .lines()
            .map_while(std::result::Result::ok)
        {
            let verbose = std::env::var_os("C10D_GPU_VERBOSE").is_some();
            if verbose {
                println!("  [{w}] {line}");
            }
            if let Some(rest) = line.strip_prefix("case ") {
                let (name, verdict) = rest.split_once(' ').unwrap_or((rest, ""));
                if !results.contains_key(name) {
                    order.push(name.to_string());
                }
                results
                    .entry(name.into())
                    .or_default()
                    .push(verdict.to_string());
            } else if !verbose && !line.starts_with("start ") {
                println!("  {line}");
            }
        }
        let status = c.wait().expect("wait rank");
        if !status.success() {
            results
                .entry("process-exit".into())
                .or_default()
                .push(format!("FAILED: a rank exited with {status}"));
            if !order.contains(&"process-exit".to_string()) {
                order.push("process-exit".into());
            }
        }
    }
    let (mut p, mut f) = (0, 0);
    for name in order {
        let verdicts = &results[&name];
        let bad: Vec<_> = verdicts.iter().filter(|v| !v.starts_with("ok")).collect();
        if bad.is_empty() && verdicts.len() == w {
            p += 1;
            println!(
                "world {w}: {name} ok {}",
                verdicts[0].trim_start_matches("ok").trim()
            );
        } else {
            f += 1;
            println!(
                "world {w}: {name} FAILED ({} of {w} ranks reported) {:?}",
                verdicts.len(),
                bad
            );
        }
    }
    println!("world {w}: done in {:.1} s", start.elapsed().as_secs_f64());
    (p, f)
}
