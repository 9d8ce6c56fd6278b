//! `cargo xtask chaos --trials N [--seed S] [--timeout SECS]`: the fault-injection harness.
//!
//! Each trial starts a `c10d-bench` job of 2–4 ranks (random collective, size 64 B–4 MiB,
//! TCP or local sockets, all on this host or spread over two network namespaces joined by a
//! veth pair), waits a random time once the job runs, then injects one fault: `kill -9` of a
//! rank, `SIGSTOP` of a rank, one of a rank's peer connections destroyed with `ss -K`, a rank
//! stopped for less than the op timeout (a slow rank), or the link between the namespaces taken
//! down. It then checks that every survivor failed with an error naming the culprit (dead and
//! closed: within 1 s; silent: within the op timeout + 1 s), or for a slow rank that the job
//! finished correctly, that nothing hung past the trial's deadline and that nothing was left
//! behind (processes, temp files, shared memory, sockets, namespaces). The last line reads
//! `chaos: K of N trials ok`; the exit status is 1 when K < N. Without root or `ip netns`,
//! link-down trials and the two-host layout are skipped (said so at the start).

mod hosts;
mod inject;
mod job;
mod leaks;
mod plan;

/// Every op `c10d-bench` runs (its names).
pub use plan::OPS as BENCH_OPS;
mod report;
mod rng;
mod verdict;

use plan::{FaultKind, Plan};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Options of a run.
struct Opts {
    trials: usize,
    seed: u64,
    timeout: Duration,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        trials: 20,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        timeout: Duration::from_secs(3),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--trials" => o.trials = val("--trials")? as usize,
            "--seed" => o.seed = val("--seed")?,
            "--timeout" => o.timeout = Duration::from_secs(val("--timeout")?.max(1)),
            other => {
                return Err(format!(
                    "chaos: unknown argument {other}; usage: cargo xtask chaos --trials N [--seed S] [--timeout SECS]"
                ))
            }
        }
    }
    Ok(o)
}

/// Runs the harness; exits the process with status 1 when a trial failed.
///
/// # Errors
/// Bad arguments, or `c10d-bench` could not be built.
pub fn chaos(
    args: &[String],
    bench: impl FnOnce() -> Result<PathBuf, String>,
) -> Result<(), String> {
    let o = parse(args)?;
    let bench = bench()?;
    let pair = match hosts::available().and_then(|()| hosts::HostPair::new()) {
        Ok(p) => Some(p),
        Err(why) => {
            println!("chaos: link-down trials and two-host jobs skipped: {why}");
            None
        }
    };
    let mut kinds = vec![
        FaultKind::Kill,
        FaultKind::Stop,
        FaultKind::CloseSocket,
        FaultKind::Slow,
    ];
    if pair.is_some() {
        kinds.push(FaultKind::LinkDown);
    }
    println!(
        "chaos: {} trials, seed {}, op timeout {} s",
        o.trials,
        o.seed,
        o.timeout.as_secs()
    );
    // Logs of an earlier run would be mistaken for this one's.
    let _ = std::fs::remove_dir_all("target/chaos");
    let _ = std::fs::create_dir_all("target/chaos");
    let logs = std::fs::canonicalize("target/chaos").map_err(|e| format!("target/chaos: {e}"))?;
    let mut rng = rng::Rng::new(o.seed);
    let mut tally = report::Tally::default();
    let mut ok = 0;
    for t in 0..o.trials {
        let plan = Plan::draw(
            &mut rng,
            &kinds,
            pair.is_some(),
            o.timeout.as_millis() as u64,
        );
        let res = trial(
            t,
            &plan,
            &bench,
            pair.as_ref(),
            o.timeout,
            &fr_dir(&logs, t),
        );
        let detect: Vec<Duration> = res.seen.iter().filter_map(|s| s.detect).collect();
        let worst = detect.iter().max().map(|d| format!("{} ms", d.as_millis()));
        let good = res.problems.is_empty();
        ok += usize::from(good);
        println!(
            "trial {t:>3} {}  {}; detected in {}",
            if good { "ok  " } else { "FAIL" },
            plan.describe(),
            worst.unwrap_or_else(|| "-".into())
        );
        let fr = fr_dir(&logs, t);
        if good {
            let _ = std::fs::remove_dir_all(&fr);
        } else {
            let log = logs.join(format!("trial-{t}.log"));
            let _ = std::fs::write(&log, &res.log);
            for p in &res.problems {
                println!("    {}", p.lines().next().unwrap_or(""));
            }
            println!(
                "    (output of every rank: {}; flight-recorder dumps: {})",
                log.display(),
                fr.display()
            );
        }
        tally.add(plan.kind, good, detect.into_iter());
    }
    let leaked_ns = pair.as_ref().map(|p| p.names.clone()).unwrap_or_default();
    drop(pair);
    tally.print(o.timeout);
    let left: Vec<String> = hosts::list()
        .into_iter()
        .filter(|n| leaked_ns.contains(n))
        .collect();
    if !left.is_empty() {
        println!("chaos: namespaces left behind: {}", left.join(", "));
        ok = 0;
    }
    println!("chaos: {ok} of {} trials ok", o.trials);
    if ok < o.trials {
        std::process::exit(1);
    }
    Ok(())
}

/// What one trial found.
struct Outcome {
    problems: Vec<String>,
    seen: Vec<verdict::Seen>,
    /// Every rank's output, for the log of a failed trial.
    log: String,
}

/// Where the ranks of trial `t` dump their flight records (kept only when the trial failed).
fn fr_dir(logs: &Path, t: usize) -> PathBuf {
    logs.join(format!("trial-{t}-fr"))
}

/// A free port on 127.0.0.1 for rank 0's store.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(29500)
}

fn trial(
    t: usize,
    plan: &Plan,
    bench: &Path,
    pair: Option<&hosts::HostPair>,
    timeout: Duration,
    fr: &Path,
) -> Outcome {
    let _ = std::fs::create_dir_all(fr);
    let fr_prefix = fr.join("comm_lib_trace_rank_");
    let tmp = std::env::temp_dir().join(format!("c10d-chaos-{}-{t}", std::process::id()));
    let _ = std::fs::create_dir_all(&tmp);
    let shm_before = leaks::shm();
    // Inside the namespaces nothing else listens.
    let port = if plan.split.is_some() {
        29500
    } else {
        free_port()
    };
    let ns = pair.map(|p| &p.names);
    let mut out = Outcome {
        problems: Vec::new(),
        seen: Vec::new(),
        log: String::new(),
    };
    let mut ranks = match job::start(
        plan,
        &job::Setup {
            bench,
            ns,
            port,
            timeout_s: timeout.as_secs(),
            tmp: &tmp,
            fr_prefix: &fr_prefix,
            trial: t,
        },
    ) {
        Ok(r) => r,
        Err(e) => {
            out.problems.push(e);
            return out;
        }
    };
    run_fault(plan, &mut ranks, pair, port, timeout, &mut out);
    job::kill_all(&mut ranks);
    if plan.kind == FaultKind::LinkDown {
        if let Some(p) = pair {
            if let Err(e) = p.set_link(true) {
                out.problems
                    .push(format!("cannot bring the link up again: {e}"));
            }
        }
    }
    for (r, rank) in ranks.iter().enumerate() {
        out.log += &format!("=== rank {r} (exit {:?})\n{}\n", rank.exit, rank.output());
    }
    let pids: Vec<i32> = ranks.iter().map(|r| r.pid).collect();
    for l in leaks::check(&job::marker(t), &pids, &tmp, &shm_before) {
        out.problems.push(format!("leak: {l}"));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    out
}

/// Waits for the job to run, injects the fault, waits for the outcome and judges it.
fn run_fault(
    plan: &Plan,
    ranks: &mut [job::Rank],
    pair: Option<&hosts::HostPair>,
    port: u16,
    timeout: Duration,
    out: &mut Outcome,
) {
    let start = Instant::now() + Duration::from_secs(60);
    while ranks[0].line_with("# c10d-bench").is_none() {
        if Instant::now() > start || ranks.iter_mut().any(|r| r.poll()) {
            out.problems.push("the job did not start".into());
            out.problems.extend(verdict::early_exits(ranks));
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(plan.delay_ms));
    let early = verdict::early_exits(ranks);
    if !early.is_empty() {
        out.problems.extend(early);
        return;
    }
    let inj = match inject::inject(plan, ranks, pair, port) {
        Ok(i) => i,
        Err(e) => {
            out.problems.push(format!("fault not injected: {e}"));
            return;
        }
    };
    let end = verdict::deadline(plan, inj.at, timeout);
    if !job::wait(ranks, &inj.survivors, end) {
        out.problems.push(format!(
            "hang: survivors still running {} s after the fault",
            end.duration_since(inj.at).as_secs()
        ));
    }
    let v = verdict::judge(plan, ranks, &inj, timeout);
    out.problems.extend(v.problems);
    out.seen = v.seen;
}
