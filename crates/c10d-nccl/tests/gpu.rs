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
    let (mut passed, mut failed) = (0, 0);
    for w in sizes {
        let (p, f) = run_world(w);
        passed += p;
        failed += f;
    }
    println!("{passed} passed, {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 });
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
