//! The `elastic` layer: membership changes of an elastic job (`c10drun --nnodes 1:3
//! --rdzv-backend c10d --max-restarts 0`, one worker per node, all on 127.0.0.1) that trains
//! the `ddp_elastic` example of c10d-ddp: a linear model, gradients through the DDP Reducer,
//! step and parameters checkpointed after every step, training resumed from the checkpoint
//! whenever the worker group is started again.
//!
//! - `elastic node joins`: one or two nodes run the job; one or two more join at random
//!   moments, the second one possibly while the first one's rendezvous round is still open.
//! - `elastic node leaves`: two or three nodes run the job; a node other than the store's host
//!   has its agent killed (`kill -9`) at a random moment, possibly right after a third node
//!   started to join (during that round).
//!
//! Verdict: every remaining agent ends with status 0 within the deadline; the checkpoint holds
//! the planned number of steps and parameters equal (within 1e-4; float sums in another order
//! differ by ~1e-6) to the same training in one process (`ddp_elastic --reference`); no agent
//! spent a restart (`--max-restarts 0`: a restart would show as "restarting" or fail the job);
//! the killed agent's workers died with it; nothing is left behind.

use super::launcher::{agent_env, children, orphans_after, store_port, wait_line};
use super::layer::{Ctx, Layer, TrialOut};
use super::{job, leaks};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const JOINS: &str = "elastic node joins";
const LEAVES: &str = "elastic node leaves";
/// The layer's kinds.
pub const KINDS: [&str; 2] = [JOINS, LEAVES];

/// Steps of the training and the milliseconds each sleeps: at least 5 s of training, so that
/// joins and leaves drawn in the first seconds land while it runs.
const STEPS: usize = 100;
const STEP_MS: u64 = 50;
/// A node is lost after `keep_alive_interval × keep_alive_max_attempt` = 2 s of silence.
const RDZV_CONF: &str =
    "last_call_timeout=0.5,keep_alive_interval=0.5,keep_alive_max_attempt=4,join_timeout=30,read_timeout=5";
/// The whole job's limit. Training takes 5 s; each membership change costs at most the loss
/// limit (2 s) + the last call (0.5 s) + stopping the workers (stop timeout 2 s) + starting
/// new ones and their gloo rendezvous (~3 s on a loaded 2-core machine): < 8 s, and a trial
/// has at most 3 changes, < 30 s in all; 120 s is four times that.
const JOB_LIMIT: Duration = Duration::from_secs(120);
/// Largest |difference| of a parameter against the single-process reference.
const TOLERANCE: f32 = 1e-4;

/// The layer, with `c10drun`, the example and its reference parameters.
pub struct Elastic {
    c10drun: PathBuf,
    example: PathBuf,
    reference: Vec<f32>,
}

impl Elastic {
    /// The layer; `Err` when a program cannot be built or the reference run fails.
    pub fn new(
        c10drun: Result<PathBuf, String>,
        example: Result<PathBuf, String>,
    ) -> Result<Elastic, String> {
        let (c10drun, example) = (c10drun?, example?);
        let out = Command::new(&example)
            .args(["--reference", "--steps", &STEPS.to_string()])
            .output()
            .map_err(|e| format!("{}: {e}", example.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let reference = text
            .split(" params ")
            .nth(1)
            .map(params)
            .ok_or_else(|| format!("ddp_elastic --reference printed {text:?}"))?;
        Ok(Elastic {
            c10drun,
            example,
            reference,
        })
    }
}

/// Parameters written as hex bits, space-separated.
fn params(s: &str) -> Vec<f32> {
    s.split_whitespace()
        .filter_map(|h| u32::from_str_radix(h, 16).ok())
        .map(f32::from_bits)
        .collect()
}

impl Layer for Elastic {
    fn kinds(&self) -> Vec<&'static str> {
        KINDS.to_vec()
    }

    fn trial(&mut self, kind: &'static str, ctx: &mut Ctx<'_>) -> TrialOut {
        let plan = Plan::draw(kind, ctx);
        let mut out = TrialOut {
            desc: plan.describe(kind),
            ..Default::default()
        };
        let tmp =
            std::env::temp_dir().join(format!("c10d-chaos-{}-{}", std::process::id(), ctx.trial));
        let _ = std::fs::create_dir_all(&tmp);
        let dir = ctx.logs.join(format!("trial-{}-elastic", ctx.trial));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::create_dir_all(&dir);
        let shm_before = leaks::shm();
        let marker = job::marker(ctx.trial);
        let e = Env {
            c10drun: &self.c10drun,
            example: &self.example,
            ckpt: &dir.join("checkpoint"),
            logs: &dir,
            tmp: &tmp,
            marker: &marker,
            id: format!("chaos-{}", ctx.trial),
        };
        let mut nodes = Vec::new();
        run(&plan, &e, &self.reference, &mut nodes, &mut out);
        job::kill_all(&mut nodes);
        for (n, node) in nodes.iter().enumerate() {
            out.log += &format!(
                "=== node {n} agent (exit {:?})\n{}\n",
                node.exit,
                node.output()
            );
        }
        if !leaks::settle(&marker, Duration::from_secs(2)) {
            out.problems
                .push("processes left after the agents were killed".into());
        }
        let pids: Vec<i32> = nodes.iter().map(|r| r.pid).collect();
        for l in leaks::check(&marker, &pids, &tmp, &shm_before) {
            out.problems.push(format!("leak: {l}"));
        }
        let _ = std::fs::remove_dir_all(&tmp);
        if out.problems.is_empty() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        out
    }
}

/// What a trial does: nodes at the start, then nodes joining after delays, then (leaves) a
/// node killed after a delay.
struct Plan {
    /// Nodes started before the first event (the first one hosts the store).
    initial: usize,
    /// Delays (ms) before each joining node starts, each after the previous event.
    joins: Vec<u64>,
    /// Leaves: (index of the node whose agent is killed, delay in ms after the last event).
    kill: Option<(usize, u64)>,
}

impl Plan {
    fn draw(kind: &str, ctx: &mut Ctx<'_>) -> Plan {
        let rng = &mut *ctx.rng;
        if kind == JOINS {
            let initial = rng.range(1, 2) as usize;
            let n = if initial == 1 { rng.range(1, 2) } else { 1 } as usize;
            // The second join from 0 ms on: during the first join's rendezvous round.
            let joins = (0..n)
                .map(|i| {
                    if i == 0 {
                        rng.range(0, 2000)
                    } else {
                        rng.range(0, 1500)
                    }
                })
                .collect();
            Plan {
                initial,
                joins,
                kill: None,
            }
        } else {
            let during_join = rng.range(0, 1) == 1;
            let (initial, joins, delay) = if during_join {
                // A third node starts joining; a node is killed while that round may be open.
                (2, vec![rng.range(0, 1500)], rng.range(0, 800))
            } else {
                (rng.range(2, 3) as usize, Vec::new(), rng.range(0, 2000))
            };
            let nodes = initial + joins.len();
            let victim = rng.range(1, nodes as u64 - 1) as usize;
            Plan {
                initial,
                joins,
                kill: Some((victim, delay)),
            }
        }
    }

    fn describe(&self, kind: &str) -> String {
        let mut s = format!("{kind}: {} node(s) train {STEPS} steps", self.initial);
        for d in &self.joins {
            s += &format!(", +1 node after {d} ms");
        }
        if let Some((v, d)) = self.kill {
            s += &format!(", node {v}'s agent kill -9 after {d} ms");
        }
        s
    }
}

/// Where and how a trial's agents run.
struct Env<'a> {
    c10drun: &'a Path,
    example: &'a Path,
    ckpt: &'a Path,
    logs: &'a Path,
    tmp: &'a Path,
    marker: &'a str,
    id: String,
}

impl Env<'_> {
    /// Starts node `n`'s agent (`port` "0": it hosts the store and picks the port).
    fn start(&self, n: usize, port: &str) -> Result<job::Rank, String> {
        let mut cmd = Command::new(self.c10drun);
        cmd.args([
            "--nnodes",
            "1:3",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
        ])
        .arg("--rdzv-endpoint")
        .arg(format!("127.0.0.1:{port}"))
        .args(["--rdzv-id", &self.id, "--rdzv-conf", RDZV_CONF])
        .args(["--max-restarts", "0", "--stop-timeout", "2", "--no-python"])
        .arg("--log-dir")
        .arg(self.logs.join(format!("node{n}")))
        .arg(self.example)
        .arg("--checkpoint")
        .arg(self.ckpt)
        .args([
            "--steps",
            &STEPS.to_string(),
            "--step-ms",
            &STEP_MS.to_string(),
        ]);
        agent_env(&mut cmd, self.marker, self.tmp);
        job::spawn(&mut cmd).map_err(|e| format!("cannot start node {n}'s agent: {e}"))
    }
}

/// The first line of any node containing `needle` read after `at`.
fn first_after(nodes: &[job::Rank], needle: &str, at: Instant) -> Option<Instant> {
    nodes
        .iter()
        .filter_map(|n| {
            n.lines
                .lock()
                .expect("lines")
                .iter()
                .find(|(t, l)| *t > at && l.contains(needle))
                .map(|(t, _)| *t)
        })
        .min()
}

fn run(plan: &Plan, e: &Env, reference: &[f32], nodes: &mut Vec<job::Rank>, out: &mut TrialOut) {
    let t0 = Instant::now();
    let port = match e.start(0, "0").and_then(|mut a| {
        let p = store_port(&mut a);
        nodes.push(a);
        p
    }) {
        Ok(p) => p,
        Err(err) => {
            out.problems.push(err);
            return;
        }
    };
    let start = |nodes: &mut Vec<job::Rank>, out: &mut TrialOut| match e.start(nodes.len(), &port) {
        Ok(n) => {
            nodes.push(n);
            true
        }
        Err(err) => {
            out.problems.push(err);
            false
        }
    };
    for _ in 1..plan.initial {
        if !start(nodes, out) {
            return;
        }
    }
    // Training has begun on all initial nodes.
    let ready = format!("world {} rank", plan.initial);
    if wait_line(&mut nodes[0], &ready, Duration::from_secs(60)).is_none() {
        out.problems
            .push(format!("the job did not start on {} node(s)", plan.initial));
        return;
    }
    let mut faults = Vec::new();
    for d in &plan.joins {
        std::thread::sleep(Duration::from_millis(*d));
        faults.push(Instant::now());
        if !start(nodes, out) {
            return;
        }
    }
    let mut killed = None;
    if let Some((v, d)) = plan.kill {
        std::thread::sleep(Duration::from_millis(d));
        let workers = children(nodes[v].pid);
        faults.push(Instant::now());
        nodes[v].signal(libc::SIGKILL);
        let _ = nodes[v].child.wait();
        nodes[v].exit = Some(None);
        killed = Some(v);
        let left = orphans_after(&workers, Duration::from_secs(2));
        if !left.is_empty() {
            out.problems.push(format!(
                "workers {left:?} of node {v}'s killed agent outlived it by 2 s"
            ));
        }
    }
    let rest: Vec<usize> = (0..nodes.len()).filter(|n| Some(*n) != killed).collect();
    if !job::wait(nodes, &rest, t0 + JOB_LIMIT) {
        out.problems.push(format!(
            "hang: the job was still running {} s after it started",
            JOB_LIMIT.as_secs()
        ));
        return;
    }
    // Detection: from each membership change to the first worker group started after it.
    for at in faults {
        if let Some(t) = first_after(nodes, "ddp_elastic: world ", at) {
            out.detect.push(t.duration_since(at));
        }
    }
    for &n in &rest {
        let node = &nodes[n];
        if node.exit != Some(Some(0)) {
            out.problems.push(format!(
                "node {n}'s agent ended with {:?}, not 0",
                node.exit
            ));
        }
        if node.output().contains("restarting") {
            out.problems.push(format!(
                "node {n}'s agent spent a restart on a membership change"
            ));
        }
    }
    let ckpt = std::fs::read_to_string(e.ckpt).unwrap_or_default();
    let mut it = ckpt.splitn(2, ' ');
    let step = it.next().and_then(|s| s.trim().parse::<usize>().ok());
    let got = params(it.next().unwrap_or(""));
    if step != Some(STEPS) {
        out.problems
            .push(format!("the checkpoint holds step {step:?}, not {STEPS}"));
    }
    let worst = got
        .iter()
        .zip(reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    if got.len() != reference.len() || worst > TOLERANCE || worst.is_nan() {
        out.problems.push(format!(
            "parameters {got:?} differ from the reference {reference:?} (max |diff| {worst})"
        ));
    }
    if !nodes.iter().any(|n| {
        n.output()
            .contains(&format!("ddp_elastic: done {STEPS} steps"))
    }) {
        out.problems
            .push("no rank 0 said the training was done".into());
    }
}
