//! `cargo xtask bench-scale [--ranks 32,64,128,256,512] [--hosts 8] [--torch 32] [--iters N]`:
//! the CPU engine at many ranks, across hosts (issue 38's benchmark; root only, for the network
//! namespaces).
//!
//! `--hosts` network namespaces on one bridge play the hosts (private addresses 10.231.38.x
//! that exist only inside them; removed at the end). For each total in `--ranks`, every host
//! runs `c10drun --nnodes H --node-rank h --nproc-per-node N/H` (static rendezvous, node 0
//! hosts the store) of:
//! 1. `scale_rank` (`crates/c10d-world/examples/scale_rank.rs`): times from the launch to the
//!    end of `init_process_group` and of the first all_reduce, `new_group` / `split_group` /
//!    2-D `init_device_mesh` timings, the most sockets a rank held while all-reducing, its
//!    peak memory; every element of every result checked;
//! 2. `c10d-bench all_reduce` (1 KiB to 256 KiB, every element checked), while this driver
//!    counts every rank process's sockets (`/proc/<pid>/fd`) every few ms.
//!
//! With `--torch`, the same `scale_rank` steps on PyTorch's Gloo (`scale_rank.py`, the torch
//! venv) at those totals, in the same run.

use crate::{cargo, run, Res};
use c10d_testing::{netns::Lan, procfs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The store's port inside the namespaces (private to them).
const PORT: &str = "29538";
/// Longest run of one job.
const JOB_LIMIT: Duration = Duration::from_secs(900);

struct Args {
    ranks: Vec<usize>,
    hosts: usize,
    torch: Vec<usize>,
    iters: usize,
}

fn list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.trim().parse().map_err(|_| format!("not a number: {s}")))
        .collect()
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        ranks: vec![32, 64, 128, 256, 512],
        hosts: 8,
        torch: vec![32],
        iters: 5,
    };
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        match k.as_str() {
            "--ranks" => a.ranks = list(v)?,
            "--hosts" => a.hosts = v.parse().map_err(|_| format!("bad --hosts {v}"))?,
            "--torch" => a.torch = list(v)?,
            "--iters" => a.iters = v.parse().map_err(|_| format!("bad --iters {v}"))?,
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if let Some(n) = a.ranks.iter().chain(&a.torch).find(|n| *n % a.hosts != 0) {
        return Err(format!("{n} ranks do not split over {} hosts", a.hosts));
    }
    Ok(a)
}

/// The built programs.
struct Bins {
    c10drun: PathBuf,
    bench: PathBuf,
    scale: PathBuf,
}

fn build() -> Result<Bins, String> {
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "c10d-run",
        "--bin",
        "c10drun",
        "-p",
        "c10d-tools",
        "--bin",
        "c10d-bench",
        "-p",
        "c10d-world",
        "--example",
        "scale_rank",
    ]))?;
    let t = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let p = |s: &str| {
        std::fs::canonicalize(format!("{t}/release/{s}")).map_err(|e| format!("{s}: {e}"))
    };
    Ok(Bins {
        c10drun: p("c10drun")?,
        bench: p("c10d-bench")?,
        scale: p("examples/scale_rank")?,
    })
}

/// Entry point.
pub fn bench_scale(args: &[String]) -> Res {
    let a = parse(args)?;
    let bins = build()?;
    let lan = match Lan::new("scale", 38, a.hosts) {
        Ok(l) => l,
        Err(why) => {
            println!("bench-scale skipped: cannot make network namespaces ({why})");
            return Ok(());
        }
    };
    let py = crate::provision_torch_once();
    println!(
        "# {} hosts (network namespaces on one bridge); every element of every result checked",
        a.hosts
    );
    let on = Cluster {
        lan: &lan,
        bins: &bins,
        hosts: a.hosts,
    };
    let iters = [("C10D_SCALE_ITERS", a.iters.to_string())];
    for &n in &a.ranks {
        let prog = [bins.scale.to_string_lossy().to_string()];
        report("c10d-rs", n, &on.job(n, &prog, &iters, None)?);
        let bench = [
            bins.bench.to_string_lossy().to_string(),
            "all_reduce".into(),
            "-b".into(),
            "1K".into(),
            "-e".into(),
            "256K".into(),
            "-f".into(),
            "16".into(),
            "-n".into(),
            "10".into(),
        ];
        let out = on.job(n, &bench, &[], Some("c10d-bench"))?;
        report("c10d-bench all_reduce", n, &out);
    }
    for &n in &a.torch {
        let Ok(py) = &py else {
            println!(
                "# PyTorch baseline skipped: {}",
                py.as_ref().err().map_or("", |e| e)
            );
            break;
        };
        let script = std::fs::canonicalize("crates/c10d-world/benches/scale_rank.py")
            .map_err(|e| e.to_string())?;
        let prog = [
            py.to_string_lossy().to_string(),
            script.to_string_lossy().to_string(),
        ];
        report(
            "PyTorch Gloo",
            n,
            &on.job(n, &prog, &iters, Some("python"))?,
        );
    }
    Ok(())
}

/// What one job gave: rank 0's output, the driver's socket and memory counts, wall time.
struct JobOut {
    text: String,
    ok: bool,
    wall: Duration,
    /// The most sockets any watched process held, its peak resident set (MiB).
    sockets: usize,
    rss_mib: f64,
}

fn report(what: &str, n: usize, o: &JobOut) {
    let status = if o.ok { "ok" } else { "FAILED" };
    println!(
        "## {what}, {n} ranks: {status}, wall {:.2} s",
        o.wall.as_secs_f64()
    );
    if o.sockets > 0 {
        println!(
            "#   watched from outside: at most {} sockets per rank, peak RSS {:.1} MiB",
            o.sockets, o.rss_mib
        );
    }
    for l in o
        .text
        .lines()
        .filter(|l| l.contains("scale:") || l.starts_with("[rank 0]"))
    {
        println!("{l}");
    }
    if !o.ok {
        println!(
            "{}",
            o.text
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// The hosts and the programs a job runs with.
struct Cluster<'a> {
    lan: &'a Lan,
    bins: &'a Bins,
    hosts: usize,
}

impl Cluster<'_> {
    /// Runs `prog` on every host under `c10drun` (`n / hosts` ranks each); watches processes whose
    /// name starts with `watch` (sockets, memory) while it runs. Every node's and worker's output
    /// goes to a temporary folder, kept (and its first error lines added to the text) when the job
    /// fails.
    fn job(
        &self,
        n: usize,
        prog: &[String],
        env: &[(&str, String)],
        watch: Option<&str>,
    ) -> Result<JobOut, String> {
        let t0 = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let logs =
            std::env::temp_dir().join(format!("c10d-bench-scale-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
        let mut children: Vec<Child> = Vec::new();
        for h in 0..self.hosts {
            children.push(self.node(h, n, prog, env, &logs, t0)?);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let peaks = Arc::new(Mutex::new((0usize, 0f64)));
        let watcher = watch.map(|name| {
            let (stop, peaks, name) = (stop.clone(), peaks.clone(), name.to_string());
            std::thread::spawn(move || watch_procs(&name, &stop, &peaks))
        });
        let ok = wait_all(&mut children, started + JOB_LIMIT);
        stop.store(true, Ordering::Relaxed);
        if let Some(w) = watcher {
            let _ = w.join();
        }
        let mut text = std::fs::read_to_string(logs.join("node0.txt")).unwrap_or_default();
        if ok {
            let _ = std::fs::remove_dir_all(&logs);
        } else {
            text += &format!(
                "# logs of every node and worker kept in {}\n",
                logs.display()
            );
            text += &first_errors(&logs);
        }
        let (sockets, rss_mib) = *peaks.lock().unwrap_or_else(|e| e.into_inner());
        Ok(JobOut {
            text,
            ok,
            wall: started.elapsed(),
            sockets,
            rss_mib,
        })
    }

    /// Starts host `h`'s `c10drun` of `prog` (`n / hosts` ranks), its console in
    /// `logs/node<h>.txt` and its workers' logs under `logs/node<h>/`; `t0`: the launch time.
    fn node(
        &self,
        h: usize,
        n: usize,
        prog: &[String],
        env: &[(&str, String)],
        logs: &Path,
        t0: Duration,
    ) -> Result<Child, String> {
        let (lan, hosts) = (self.lan, self.hosts);
        let console =
            std::fs::File::create(logs.join(format!("node{h}.txt"))).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &lan.names[h]])
            .arg(&self.bins.c10drun)
            .args([
                "--nnodes",
                &hosts.to_string(),
                "--node-rank",
                &h.to_string(),
            ])
            .args(["--nproc-per-node", &(n / hosts).to_string()])
            .args(["--master-addr", &lan.addr(0), "--master-port", PORT])
            .args([
                "--rdzv-timeout",
                "300",
                "--local-ranks-filter",
                "0",
                "--tee",
                "3",
            ])
            // 512 ranks on 2 cores starve the agents now and then: a store operation of an
            // agent may take longer than the default 10 s there.
            .args(["--rdzv-conf", "read_timeout=60"])
            .arg("--log-dir")
            .arg(logs.join(format!("node{h}")))
            .arg("--no-python")
            .args(prog)
            .env("C10D_SCALE_T0_NS", t0.as_nanos().to_string())
            .env("C10D_SCALE_HOSTS", hosts.to_string())
            .env("GLOO_SOCKET_IFNAME", format!("e{h}"))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(console.try_clone().map_err(|e| e.to_string())?)
            .stderr(console);
        cmd.spawn()
            .map_err(|e| format!("cannot start c10drun: {e}"))
    }
}

/// The first lines that look like an error in any file below `dir` (a failed job's logs).
fn first_errors(dir: &Path) -> String {
    let mut files = vec![dir.to_path_buf()];
    let mut out = String::new();
    while let Some(p) = files.pop() {
        if let Ok(d) = std::fs::read_dir(&p) {
            files.extend(d.flatten().map(|e| e.path()));
            continue;
        }
        let Ok(t) = std::fs::read_to_string(&p) else {
            continue;
        };
        let hit = |l: &&str| {
            ["rror", "failed", "Timed out", "panicked", "refused"]
                .iter()
                .any(|k| l.contains(k))
                && !l.contains("SIGTERM")
        };
        for l in t.lines().filter(hit).take(3) {
            out += &format!("# {}: {l}\n", p.display());
        }
        if out.lines().count() > 40 {
            break;
        }
    }
    out
}

/// Waits for every child until `deadline` (then kills them all); whether all succeeded.
fn wait_all(children: &mut [Child], deadline: Instant) -> bool {
    let mut ok = true;
    for c in children.iter_mut() {
        loop {
            match c.try_wait() {
                Ok(Some(st)) => {
                    ok &= st.success();
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    ok = false;
                    break;
                }
            }
        }
    }
    ok
}

/// Every few ms until `stop`: for each process named `name*`, its sockets and resident set;
/// keeps the largest of each.
fn watch_procs(name: &str, stop: &AtomicBool, peaks: &Mutex<(usize, f64)>) {
    while !stop.load(Ordering::Relaxed) {
        for pid in procs_named(name) {
            let pid = pid.to_string();
            let s = procfs::sockets(&pid);
            let rss = procfs::status_kib(&pid, "VmRSS").map_or(0.0, |kb| kb as f64 / 1024.0);
            let mut p = peaks.lock().unwrap_or_else(|e| e.into_inner());
            p.0 = p.0.max(s);
            p.1 = p.1.max(rss);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn procs_named(name: &str) -> Vec<u32> {
    let Ok(d) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    d.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim().starts_with(name))
        })
        .collect()
}
