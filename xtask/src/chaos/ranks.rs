//! The `ranks` layer: faults in the ranks of a running `c10d-bench` job of 2–4 ranks (random
//! collective, size 64 B–4 MiB, TCP or local sockets, on this host or over two network
//! namespaces joined by a veth pair): `kill -9` of a rank, `SIGSTOP` of a rank, one of a
//! rank's peer connections destroyed with `ss -K`, a rank stopped for less than the op timeout
//! (a slow rank), or the link between the namespaces taken down. Every survivor must fail
//! with an error naming the culprit (dead and closed: within 1 s; silent: within the op
//! timeout + 1 s); a slow rank's job must finish correctly.

use super::layer::{Ctx, Layer, TrialOut};
use super::plan::{FaultKind, Plan};
use super::{hosts, inject, job, leaks, verdict};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The layer, with the `c10d-bench` binary and, where namespaces work, the two hosts.
pub struct Ranks {
    bench: PathBuf,
    pair: Option<hosts::HostPair>,
    /// `ss -K` can destroy sockets here (iproute2 installed; we are allowed to).
    can_close: bool,
}

impl Ranks {
    /// The layer over `bench`; says why link-down trials and two-host jobs are skipped when
    /// network namespaces are not available.
    pub fn new(bench: PathBuf) -> Ranks {
        let pair = match hosts::available().and_then(|()| hosts::HostPair::new()) {
            Ok(p) => Some(p),
            Err(why) => {
                println!("chaos: link-down trials and two-host jobs skipped: {why}");
                None
            }
        };
        let can_close = std::process::Command::new("ss")
            // Matches no TCP socket: only whether `ss` runs and takes -K here.
            .args(["-t", "-K", "dst", "0.0.0.0/32"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !can_close {
            println!("chaos: close-socket trials skipped: `ss -K` is not available here");
        }
        Ranks {
            bench,
            pair,
            can_close,
        }
    }

    /// Namespaces left behind by the run (checked once the layer is dropped).
    pub fn namespaces(&self) -> Vec<String> {
        self.pair
            .as_ref()
            .map(|p| p.names.to_vec())
            .unwrap_or_default()
    }
}

impl Layer for Ranks {
    fn kinds(&self) -> Vec<&'static str> {
        FaultKind::ALL
            .into_iter()
            .filter(|k| *k != FaultKind::LinkDown || self.pair.is_some())
            .filter(|k| *k != FaultKind::CloseSocket || self.can_close)
            .map(FaultKind::name)
            .collect()
    }

    fn trial(&mut self, kind: &'static str, ctx: &mut Ctx<'_>) -> TrialOut {
        let kind = FaultKind::named(kind).expect("one of this layer's kinds");
        let plan = Plan::draw(
            ctx.rng,
            kind,
            self.pair.is_some(),
            ctx.timeout.as_millis() as u64,
        );
        let fr = fr_dir(&ctx.logs, ctx.trial);
        let res = trial(
            ctx.trial,
            &plan,
            &self.bench,
            self.pair.as_ref(),
            ctx.timeout,
            &fr,
        );
        if res.problems.is_empty() {
            let _ = std::fs::remove_dir_all(&fr);
        }
        TrialOut {
            desc: plan.describe(),
            problems: res.problems,
            detect: res.seen.iter().filter_map(|s| s.detect).collect(),
            log: res.log,
        }
    }
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
pub(super) fn free_port() -> u16 {
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
