//! The GPU suite (`cargo xtask test-multigpu`; `harness = false`). Without a GPU it prints
//! `skipped: no GPU` and succeeds (fails instead when `C10D_REQUIRE_GPU=1`).
//!
//! The parent starts a TCP store on 127.0.0.1 (port 0) and runs the cases at every world size
//! of `C10D_GPU_WORLD_SIZES` (default: 1, 2 and 4), one process per rank. With at least as
//! many GPUs as ranks, rank r runs on `cuda:r` (`LOCAL_RANK=r`), so NCCL's intra-node
//! transports (P2P/NVLink, SHM) are exercised; with fewer, ranks share GPUs (`cuda:r % GPUs`)
//! and each gets its own `NCCL_HOSTID`, so NCCL treats them as separate hosts and joins them
//! through its socket transport over `lo` (it refuses two ranks on one device of one host).
//! Ranks run with `NCCL_DEBUG=INFO`; the parent reads their channel lines and prints, per
//! world size, which transports NCCL used. Every rank runs every case and reports
//! `ok`/`FAILED` per case; the parent prints one line per case and world size, then
//! `N passed, M failed`, and exits non-zero on a failure. `--list` prints every case.

mod gpu {
    pub mod caller;
    pub mod cases;
    pub mod faults;
    pub mod more;
    pub mod values;
}

use c10d_store::{ServerOptions, TcpStoreServer};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The checks the parent runs itself (the others run in every rank at every world size).
const PARENT_CASES: [&str; 6] = [
    "value_checks_reject_nan_and_offsets",
    "nccl_version_vs_pytorch",
    "watchdog_timeout_mode_0_fails_the_work_only",
    "watchdog_timeout_mode_1_aborts_and_tears_down",
    "watchdog_timeout_mode_2_aborts_the_communicator",
    "watchdog_timeout_mode_3_tears_the_process_down",
];

fn main() {
    if std::env::args().any(|a| a == "--list") {
        PARENT_CASES.iter().for_each(|c| println!("{c}"));
        SIM_FAULTS
            .iter()
            .for_each(|(k, _)| println!("simulated_fault_{k} (on c10d-gpusim only)"));
        for (name, _) in gpu::cases::cases() {
            println!("{name} (every world size)");
        }
        return;
    }
    if let Ok(rank) = std::env::var("C10D_GPU_RANK") {
        std::process::exit(gpu::cases::worker(rank.parse().expect("rank")));
    }
    if std::env::var_os("C10D_GPU_TEARDOWN").is_some() {
        gpu::faults::teardown_child();
    }
    if std::env::var_os("C10D_GPU_SIMFAULT").is_some() {
        gpu::faults::simulated_fault_child();
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
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())
        .and_then(|c| output_within(c, std::time::Duration::from_secs(120)))
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
    let mut verdict = |name: &str, r: Result<String, String>| match r {
        Ok(line) => {
            passed += 1;
            println!("{name} ok: {line}");
        }
        Err(e) => {
            failed += 1;
            println!("{name} FAILED: {e}");
        }
    };
    verdict(
        PARENT_CASES[0],
        gpu::values::self_check().map(|()| "NaN and a shift by one element fail the check".into()),
    );
    for (mode, name) in PARENT_CASES[2..].iter().enumerate() {
        verdict(name, teardown(mode as i32));
    }
    if simulated() {
        for (kind, spec) in SIM_FAULTS {
            verdict(
                &format!("simulated_fault_{kind}"),
                simulated_fault(kind, spec),
            );
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

/// The simulator's injected faults, as `C10D_SIM_FAULTS` spells them for rank 0 (the second
/// NCCL op, or the first communicator init).
const SIM_FAULTS: [(&str, &str); 5] = [
    ("hang", "hang@0:2"),
    ("remote_error", "remote_error@0:2"),
    ("system_error", "system_error@0:2"),
    ("die", "die@0:2"),
    ("init_hang", "init_hang@0:1"),
];

/// Whether the NCCL loaded is c10d-gpusim (its cases inject faults only it knows).
fn simulated() -> bool {
    c10d_nccl::nccl_library().is_ok_and(|l| l.location().contains("gpusim"))
}

/// A one-rank job meeting an injected fault (see `faults::simulated_fault_child`): the faulty
/// op (or init) must fail with an error and never pass; a killed rank is killed.
fn simulated_fault(kind: &str, spec: &str) -> Result<String, String> {
    use std::os::unix::process::ExitStatusExt;
    let start = Instant::now();
    let child = Command::new(std::env::current_exe().expect("current exe"))
        .env("C10D_GPU_SIMFAULT", kind)
        .env("C10D_SIM_FAULTS", spec)
        .env("RANK", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let out = output_within(child, std::time::Duration::from_secs(60))?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let took = start.elapsed().as_secs_f64();
    let ok = if kind == "die" {
        out.status.signal() == Some(9)
    } else {
        out.status.success() && stdout.starts_with("failed:")
    };
    if ok {
        Ok(format!("{} after {took:.1} s: {stdout}", out.status))
    } else {
        Err(format!(
            "child {}: {stdout:?} stderr {:?}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `TORCH_NCCL_ASYNC_ERROR_HANDLING=mode` on a one-rank job whose op can never finish
/// (1 s timeout): modes 1 and 3 (3 is PyTorch's default) end the process with SIGABRT and the
/// timeout message on stderr; modes 0 and 2 fail the work and keep the process, 2 aborting the
/// communicator and 0 not. Says how long it took.
fn teardown(mode: i32) -> Result<String, String> {
    use std::os::unix::process::ExitStatusExt;
    let start = Instant::now();
    let child = Command::new(std::env::current_exe().expect("current exe"))
        .env("C10D_GPU_TEARDOWN", "1")
        .env("TORCH_NCCL_ASYNC_ERROR_HANDLING", mode.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let out = output_within(child, std::time::Duration::from_secs(30))?;
    let took = start.elapsed();
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let tears_down = mode == 1 || mode == 3;
    let ok = if tears_down {
        out.status.signal() == Some(6)
            && err.contains("Watchdog caught collective operation timeout")
            && err.contains("taking the entire process down")
    } else {
        out.status.success()
    };
    if ok {
        Ok(format!(
            "child {} after {:.1} s (1 s op timeout){}",
            out.status,
            took.as_secs_f64(),
            stdout
                .lines()
                .last()
                .map(|l| format!(": {l}"))
                .unwrap_or_default()
        ))
    } else {
        Err(format!(
            "child {}: stdout {stdout:?} stderr {err:?}",
            out.status
        ))
    }
}

/// The child's output, or an error once it has run for `limit` (it is killed then).
fn output_within(
    child: std::process::Child,
    limit: std::time::Duration,
) -> Result<std::process::Output, String> {
    let pid = child.id();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = done.clone();
    let guard = std::thread::spawn(move || {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if seen.load(std::sync::atomic::Ordering::Acquire) {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        true
    });
    let out = child.wait_with_output().map_err(|e| e.to_string());
    done.store(true, std::sync::atomic::Ordering::Release);
    if guard.join().unwrap_or(false) {
        return Err(format!("the child ran past {limit:?} and was killed"));
    }
    out
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

/// How long one world size may run (`C10D_GPU_WORLD_LIMIT_S`, default 180 s).
fn world_limit() -> std::time::Duration {
    let s = std::env::var("C10D_GPU_WORLD_LIMIT_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(180);
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
    let gpus = c10d_nccl::cuda_device_count().max(1);
    let own_devices = gpus >= w;
    println!(
        "world {w}: {}",
        if own_devices {
            "each rank on its own GPU (cuda:LOCAL_RANK)".to_string()
        } else {
            format!("{w} ranks on {gpus} GPU(s), one NCCL_HOSTID per rank")
        }
    );
    let transports = Arc::new(Mutex::new(BTreeSet::new()));
    let mut children: Vec<_> = (0..w)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            cmd.env("C10D_GPU_RANK", r.to_string())
                .env("C10D_GPU_WORLD", w.to_string())
                .env("C10D_GPU_STORE_PORT", server.port().to_string())
                .env("C10D_GPU_DEVICE", (r % gpus).to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("NCCL_DEBUG", "INFO")
                // NCCL prints to stdout by default, where the case verdicts go.
                .env("NCCL_DEBUG_FILE", "/dev/stderr")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if !own_devices {
                cmd.env("NCCL_HOSTID", format!("c10d-rank-{r}"))
                    .env("NCCL_SOCKET_IFNAME", "lo")
                    // The socket transport, as the suite says: not an InfiniBand loopback.
                    .env("NCCL_NET", "Socket")
                    .env("NCCL_IB_DISABLE", "1");
            }
            cmd.spawn().expect("spawn rank")
        })
        .collect();
    let readers: Vec<_> = children
        .iter_mut()
        .map(|c| {
            let err = c.stderr.take().expect("piped");
            let seen = transports.clone();
            std::thread::spawn(move || read_nccl_stderr(err, &seen))
        })
        .collect();
    let mut results: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut order = Vec::new();
    let deadline = Instant::now() + world_limit();
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let over = finished.clone();
    let killer = std::thread::spawn(move || {
        while Instant::now() < deadline {
            if over.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        for p in pids {
            // The world ran past its limit: end every rank (their pipes then close).
            let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
        }
    });
    // Every rank's stdout is read at once (one thread each): a rank blocked on a full pipe
    // would stall the collectives of the others.
    let outputs: Vec<_> = children
        .iter_mut()
        .map(|c| {
            let out = c.stdout.take().expect("piped");
            std::thread::spawn(move || {
                BufReader::new(out)
                    .lines()
                    .map_while(std::result::Result::ok)
                    .collect::<Vec<String>>()
            })
        })
        .collect();
    let verbose = std::env::var_os("C10D_GPU_VERBOSE").is_some();
    for (rank, (c, lines)) in children.iter_mut().zip(outputs).enumerate() {
        let lines = lines.join().unwrap_or_default();
        // The case a rank had started but not finished when it ended (killed at the limit).
        let started = lines.iter().rev().find_map(|l| l.strip_prefix("start "));
        let finished_it = |name: &str| {
            lines
                .iter()
                .any(|l| l.starts_with(&format!("case {name} ")))
        };
        if let Some(name) = started.filter(|n| !finished_it(n)) {
            println!("  world {w} rank {rank}: ended inside case {name}");
        }
        for line in &lines {
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
    finished.store(true, std::sync::atomic::Ordering::Release);
    let _ = killer.join();
    let (mut p, mut f) = (0, 0);
    // Cases no rank reported (a rank died or was killed before them) fail too.
    for (name, _) in gpu::cases::cases() {
        if !results.contains_key(&name) {
            results.insert(name.clone(), vec!["FAILED: not reached".into()]);
            order.push(name);
        }
    }
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
    readers.into_iter().for_each(|h| drop(h.join()));
    let used: Vec<String> = lock(&transports).iter().cloned().collect();
    println!(
        "world {w}: NCCL transports used: {}",
        if used.is_empty() {
            "none reported (one rank, or NCCL_DEBUG lines missing)".into()
        } else {
            used.join(", ")
        }
    );
    if !own_devices {
        // Ranks sharing a GPU are joined by the socket transport, as the suite sets them up
        // (NCCL_NET=Socket, NCCL_IB_DISABLE=1): another transport means another setup.
        let name = "socket_transport_between_ranks_sharing_a_gpu";
        if !used.is_empty() && used.iter().all(|t| t == "NET/Socket") {
            p += 1;
            println!("world {w}: {name} ok");
        } else {
            f += 1;
            println!("world {w}: {name} FAILED: transports reported: {used:?}");
        }
    }
    println!("world {w}: done in {:.1} s", start.elapsed().as_secs_f64());
    (p, f)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Passes a rank's stderr through, except NCCL's INFO lines, whose channel connections
/// (`... via P2P/CUMEM/read`, `via SHM/direct/direct`, `via NET/Socket/0`) name the transport:
/// those are collected (first two parts of the name) into `seen`.
fn read_nccl_stderr(err: std::process::ChildStderr, seen: &Mutex<BTreeSet<String>>) {
    let verbose = std::env::var_os("C10D_GPU_VERBOSE").is_some();
    for line in BufReader::new(err)
        .lines()
        .map_while(std::result::Result::ok)
    {
        if !line.contains("NCCL INFO") {
            eprintln!("{line}");
            continue;
        }
        if verbose {
            eprintln!("{line}");
        }
        if let Some(rest) = line.split(" via ").nth(1) {
            let name: Vec<&str> = rest
                .split_whitespace()
                .next()
                .unwrap_or("")
                .split('/')
                .take(2)
                .collect();
            lock(seen).insert(name.join("/"));
        }
    }
}
