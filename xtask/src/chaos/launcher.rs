//! The `launcher` layer: faults in the `c10drun` agents of a 2-node static job on 127.0.0.1
//! (`--nnodes 2`, 1 or 2 `c10d-bench all_reduce` workers per node, node 0 hosting the store):
//!
//! - `agent kill -9`: node 1's agent is killed. Its workers must die with it (they are spawned
//!   with `PR_SET_PDEATHSIG`), and node 0's agent must fail with a worker error naming a rank
//!   of node 1 and its exit barrier saying not every node finished.
//! - `agent SIGSTOP`: node 1's agent is stopped while its workers run a finite job to the end.
//!   Static rendezvous has no keep-alive, so the loss shows at the exit barrier: node 0's
//!   agent must end saying not every node finished, within the barrier's limit of its
//!   workers' end (with status 0, as torchrun's: its own workers succeeded).
//! - `store host killed`: node 0's agent (the store's host) is killed: its workers must die
//!   with it and node 1's agent must fail naming the unreachable store.
//!
//! Timeouts are short so that a trial takes seconds: `--rdzv-timeout 5` (the exit barrier
//! waits `rdzv_timeout + stop_timeout` = 7 s), `--stop-timeout 2`, `read_timeout=4` (every
//! agent store operation), and the run's op timeout for the workers.

use super::layer::{Ctx, Layer, TrialOut};
use super::{job, leaks, verdict};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const KILL: &str = "agent kill -9";
const STOP: &str = "agent SIGSTOP";
const STORE: &str = "store host killed";
/// The layer's kinds.
pub const KINDS: [&str; 3] = [KILL, STOP, STORE];

/// Seconds the nodes wait for each other (`--rdzv-timeout`).
const RDZV_S: u64 = 5;
/// Seconds between SIGTERM and SIGKILL of workers (`--stop-timeout`).
const STOP_S: u64 = 2;
/// Bound of every agent store operation (`read_timeout`).
const READ_S: u64 = 4;
/// Slack for a loaded 2-core machine: process exits, reaping and a late scheduler (agents poll
/// their workers and the store at most every second).
const SLACK: Duration = Duration::from_secs(5);
/// How soon the workers of a killed agent must be gone: `PR_SET_PDEATHSIG` delivers SIGKILL
/// as the parent dies; 2 s covers a loaded scheduler.
const ORPHAN_LIMIT: Duration = Duration::from_secs(2);

/// The layer, with the `c10drun` and `c10d-bench` binaries.
pub struct Launcher {
    c10drun: PathBuf,
    bench: PathBuf,
}

impl Launcher {
    /// The layer; `Err` when `c10drun` cannot be built.
    pub fn new(bench: PathBuf, c10drun: Result<PathBuf, String>) -> Result<Launcher, String> {
        Ok(Launcher {
            c10drun: c10drun?,
            bench,
        })
    }
}

impl Layer for Launcher {
    fn kinds(&self) -> Vec<&'static str> {
        KINDS.to_vec()
    }

    fn trial(&mut self, kind: &'static str, ctx: &mut Ctx<'_>) -> TrialOut {
        let nproc = ctx.rng.range(1, 2) as usize;
        let delay = Duration::from_millis(ctx.rng.range(100, 800));
        let mut out = TrialOut {
            desc: format!(
                "{kind}: 2 nodes × {nproc} all_reduce {}, fault {} ms into the job",
                if kind == STOP {
                    "1 MiB × 1500"
                } else {
                    "1 KiB"
                },
                delay.as_millis()
            ),
            ..Default::default()
        };
        let tmp =
            std::env::temp_dir().join(format!("c10d-chaos-{}-{}", std::process::id(), ctx.trial));
        let _ = std::fs::create_dir_all(&tmp);
        let logs = ctx.logs.join(format!("trial-{}-agents", ctx.trial));
        let shm_before = leaks::shm();
        let marker = job::marker(ctx.trial);
        let s = Static {
            c10drun: &self.c10drun,
            bench: &self.bench,
            nproc,
            // The stopped agent's job must end by itself, but only after the fault (drawn up to
            // 0.8 s in): 1,500 all_reduces of 1 MiB took about 1.8 s with 2 ranks and 4.5 s
            // with 4 here (bandwidth-bound, so far steadier than 1 KiB ones, which ran
            // 1.3–100 µs each), well under the 60 s cap on a loaded machine.
            iters: if kind == STOP { 1_500 } else { 1 << 30 },
            timeout_s: ctx.timeout.as_secs(),
            tmp: &tmp,
            logs: &logs,
            marker: &marker,
        };
        let mut nodes = Vec::new();
        run(kind, &s, delay, ctx.timeout, &mut nodes, &mut out);
        job::kill_all(&mut nodes);
        for (n, node) in nodes.iter().enumerate() {
            out.log += &format!(
                "=== node {n} agent (exit {:?})\n{}\n",
                node.exit,
                node.output()
            );
        }
        if !leaks::settle(&marker, ORPHAN_LIMIT) {
            out.problems
                .push("processes left after the agents were killed".into());
        }
        let pids: Vec<i32> = nodes.iter().map(|r| r.pid).collect();
        for l in leaks::check(&marker, &pids, &tmp, &shm_before) {
            out.problems.push(format!("leak: {l}"));
        }
        let _ = std::fs::remove_dir_all(&tmp);
        if out.problems.is_empty() {
            let _ = std::fs::remove_dir_all(&logs);
        }
        out
    }
}

/// How the agents of a static 2-node job run.
struct Static<'a> {
    c10drun: &'a Path,
    bench: &'a Path,
    nproc: usize,
    iters: usize,
    timeout_s: u64,
    tmp: &'a Path,
    logs: &'a Path,
    marker: &'a str,
}

impl Static<'_> {
    /// Starts node `node`'s agent (`port` "0": node 0 picks the store's port).
    fn start(&self, node: usize, port: &str) -> Result<job::Rank, String> {
        let mut cmd = Command::new(self.c10drun);
        let (nproc, rank, rdzv, stop) = (
            self.nproc.to_string(),
            node.to_string(),
            RDZV_S.to_string(),
            STOP_S.to_string(),
        );
        let (iters, t) = (self.iters.to_string(), self.timeout_s.to_string());
        // A finite job moves 1 MiB per op (see `iters`); the endless ones 1 KiB.
        let size = if self.iters < 1 << 30 { "1M" } else { "1K" };
        cmd.args([
            "--nnodes",
            "2",
            "--node-rank",
            &rank,
            "--nproc-per-node",
            &nproc,
        ])
        .args(["--master-addr", "127.0.0.1", "--master-port", port])
        .args([
            "--run-id",
            "chaos",
            "--rdzv-timeout",
            &rdzv,
            "--stop-timeout",
            &stop,
        ])
        .arg("--rdzv-conf")
        .arg(format!("read_timeout={READ_S}"))
        .arg("--log-dir")
        .arg(self.logs.join(format!("node{node}")))
        .arg(self.bench)
        .args([
            "all_reduce",
            "-b",
            size,
            "-e",
            size,
            "-n",
            &iters,
            "--timeout",
            &t,
        ]);
        agent_env(&mut cmd, self.marker, self.tmp);
        job::spawn(&mut cmd).map_err(|e| format!("cannot start node {node}'s agent: {e}"))
    }
}

/// The environment every agent of a trial gets (its workers inherit it).
pub(super) fn agent_env(cmd: &mut Command, marker: &str, tmp: &Path) {
    cmd.env("C10D_CHAOS_TRIAL", marker)
        .env("TMPDIR", tmp)
        .env_remove("RUST_LOG");
}

/// Waits for the line of `p` containing `needle` (false when `p` exits first or `limit`
/// passes).
pub(super) fn wait_line(
    p: &mut job::Rank,
    needle: &str,
    limit: Duration,
) -> Option<(Instant, String)> {
    let end = Instant::now() + limit;
    loop {
        if let Some(l) = p.line_with(needle) {
            return Some(l);
        }
        if p.poll() || Instant::now() > end {
            return p.line_with(needle);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The store port an agent hosting it printed (`store listening on 127.0.0.1:PORT`).
pub(super) fn store_port(p: &mut job::Rank) -> Result<String, String> {
    let prefix = "store listening on 127.0.0.1:";
    let (_, line) = wait_line(p, prefix, Duration::from_secs(60))
        .ok_or("the store's host did not say where the store listens")?;
    Ok(line
        .split(prefix)
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or("")
        .to_string())
}

/// Pids of the live children of `pid`.
pub(super) fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(d) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in d.flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ppid …`: comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|s| s.parse::<i32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// Whether process `pid` still exists (zombies count as gone).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

/// Waits until none of `pids` is alive; the ones left after `limit`.
pub(super) fn orphans_after(pids: &[i32], limit: Duration) -> Vec<i32> {
    let end = Instant::now() + limit;
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || Instant::now() > end {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn run(
    kind: &str,
    s: &Static,
    delay: Duration,
    timeout: Duration,
    nodes: &mut Vec<job::Rank>,
    out: &mut TrialOut,
) {
    let started = s.start(0, "0").and_then(|mut n0| {
        let port = store_port(&mut n0);
        nodes.push(n0);
        let n1 = s.start(1, &port?)?;
        nodes.push(n1);
        Ok(())
    });
    if let Err(e) = started {
        out.problems.push(e);
        return;
    }
    if wait_line(
        &mut nodes[0],
        "[rank 0]: # c10d-bench",
        Duration::from_secs(60),
    )
    .is_none()
    {
        out.problems.push("the job did not start".into());
        return;
    }
    std::thread::sleep(delay);
    for (n, node) in nodes.iter_mut().enumerate() {
        if node.poll() {
            out.problems.push(format!(
                "node {n}'s agent ended before the fault ({:?})",
                node.exit
            ));
        }
    }
    if !out.problems.is_empty() {
        return;
    }
    let victim = if kind == STORE { 0 } else { 1 };
    let survivor = 1 - victim;
    let workers = children(nodes[victim].pid);
    if workers.len() != s.nproc {
        out.problems.push(format!(
            "node {victim}'s agent has {} worker(s), not {}",
            workers.len(),
            s.nproc
        ));
    }
    let at = Instant::now();
    nodes[victim].signal(if kind == STOP {
        libc::SIGSTOP
    } else {
        libc::SIGKILL
    });
    if kind != STOP {
        let left = orphans_after(&workers, ORPHAN_LIMIT);
        if !left.is_empty() {
            out.problems.push(format!(
                "workers {left:?} of the killed agent of node {victim} outlived it by {} s",
                ORPHAN_LIMIT.as_secs()
            ));
        }
    }
    // The survivor's deadline, from the fault:
    // - node 1 killed: its workers' peers see the connections close at once (or, at worst,
    //   within the op timeout), node 0's agent stops its other workers (stop timeout) and
    //   waits at the exit barrier (rdzv + stop timeout);
    // - node 1 stopped: node 0's workers run the rest of the finite job (bounded separately
    //   below) before the same exit barrier; 60 s caps the job on a loaded machine;
    // - the store's host killed: node 1's agent's next store operation fails (the connection
    //   closes at once; at worst its read timeout).
    let limit = match kind {
        KILL => timeout + Duration::from_secs(STOP_S + RDZV_S + STOP_S) + SLACK,
        STOP => Duration::from_secs(60 + RDZV_S + STOP_S) + SLACK,
        _ => Duration::from_secs(READ_S) + SLACK,
    };
    if !job::wait(nodes, &[survivor], at + limit) {
        out.problems.push(format!(
            "hang: node {survivor}'s agent still running {} s after the fault",
            limit.as_secs()
        ));
        return;
    }
    let done = nodes[survivor].exited_at.unwrap_or_else(Instant::now);
    out.detect.push(done.duration_since(at));
    // A stopped agent's workers still finish the job, and so do node 0's: as torchrun's, node
    // 0's agent then only warns that the exit barrier was not reached (status 0).
    if kind != STOP && (nodes[survivor].exit == Some(Some(0)) || nodes[survivor].exit.is_none()) {
        out.problems.push(format!(
            "node {survivor}'s agent ended with {:?}, not an error",
            nodes[survivor].exit
        ));
    }
    let text = nodes[survivor].output();
    match kind {
        KILL => {
            let lost: Vec<usize> = (s.nproc..2 * s.nproc).collect();
            let names = text
                .lines()
                .filter(|l| l.contains("error: "))
                .map(verdict::blamed)
                .any(|b| !b.is_empty() && b.iter().all(|r| lost.contains(r)));
            if !names {
                out.problems.push(format!(
                    "no worker of node 0 named a rank of node 1 ({lost:?})"
                ));
            }
            barrier_failed(&text, out);
        }
        STOP => {
            barrier_failed(&text, out);
            // From node 0's workers' end (the result row of rank 0) to its agent's exit: the
            // exit barrier's limit (rdzv + stop timeout) plus the slack.
            let row = nodes[survivor]
                .lines
                .lock()
                .expect("lines")
                .iter()
                .find(|(_, l)| l.starts_with("[rank 0]:") && l.contains(" 1048576 "))
                .map(|(t, _)| *t);
            let bound = Duration::from_secs(RDZV_S + STOP_S) + SLACK;
            match row {
                Some(t) if done.duration_since(t) > bound => out.problems.push(format!(
                    "node 0's agent ended {:.1} s after its workers finished (bound {} s)",
                    done.duration_since(t).as_secs_f64(),
                    bound.as_secs()
                )),
                Some(_) => {}
                None => out
                    .problems
                    .push("node 0's workers did not finish the job".into()),
            }
        }
        _ => {
            if !text.contains(" is unreachable") || !text.contains("the store at 127.0.0.1:") {
                out.problems
                    .push("node 1's agent did not name the unreachable store".into());
            }
        }
    }
}

/// The survivor's agent must say the other node did not reach the exit barrier.
fn barrier_failed(text: &str, out: &mut TrialOut) {
    if !text.contains("exit barrier: not every node finished") {
        out.problems
            .push("node 0's agent did not say that node 1 never reached the exit barrier".into());
    }
}
