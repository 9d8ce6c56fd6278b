//! The `gpu` layer: faults of c10d-nccl's jobs on c10d-gpusim, the simulated CUDA driver and
//! NCCL (no GPU needed). Each trial runs a 2-rank job of `chaos_rank` (c10d-nccl's example: a
//! group bound to one simulated device per rank, 2 s op timeout, a few all_reduces that must
//! work, then the faulted one) under one `TORCH_NCCL_ASYNC_ERROR_HANDLING` mode (a kind's
//! trials take modes 0, 1, 2, 3 in turn, so every 4 trials of a kind cover them), with one fault
//! on a drawn rank at a drawn op:
//! - `gpu hang`: `C10D_SIM_FAULTS=hang@R:N`, the op never completes (both ranks wait);
//! - `gpu async error`: `remote_error` or `system_error` (drawn), `ncclCommGetAsyncError`
//!   reports it and the op hangs until abort;
//! - `gpu rank dies`: `die`, the rank is SIGKILLed when its stream reaches the op;
//! - `gpu abort during op`: no injected fault; the rank aborts its group from another thread
//!   50–800 ms into the op, which its peer joins only after that abort;
//! - `gpu init hang`: `init_hang@R:1`, the rank's communicator init (at `bind`) never ends.
//!
//! What every trial checks (c10d-nccl's promises, `env.rs`'s `ErrorHandlingMode` and
//! `watchdog_thread.rs`):
//! - the faulted op (or init) never completes as a success, and fails within the timeout plus
//!   a slack (a hang: not before the timeout);
//! - per mode, for an op the watchdog fails (a hang, an async error, the peer of a dead or
//!   aborting rank): 1 and 3 end the process with SIGABRT and the "taking the entire process
//!   down (TORCH_NCCL_ASYNC_ERROR_HANDLING=M)" line, the waiter never hearing of the failure;
//!   2 reports the error to the caller's wait, keeps the process and aborts the communicator
//!   (the next op is refused as aborted), after which the op's memory is released; 0 reports
//!   the error, aborts nothing, and keeps the op's memory (its kernel may still run) until the
//!   program aborts the group itself, after which it is released;
//! - an abort on purpose ends the op with an "aborted" error and keeps the process in every
//!   mode; an init that does not finish fails `bind` with an error in every mode (no work is
//!   watched yet), keeping the process;
//! - a killed rank dies by SIGKILL;
//! - nothing is left behind (processes, temp files, shared memory).
//!
//! The op's memory is read by the rank itself (the simulator poisons freed device memory, so a
//! freed tensor reads as non-finite): `chaos_rank` drops its handle on the tensor at launch,
//! so only c10d-nccl keeps it.

use super::job::{self, Rank};
use super::layer::{Ctx, Layer, TrialOut, Turns};
use super::leaks;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The op timeout `chaos_rank` sets (ms).
const OP_TIMEOUT_MS: u128 = 2000;
/// Slack past the timeout for a failure to reach the caller: the watchdog polls every few
/// milliseconds and the simulated abort takes ~100 ms, but on a loaded 2-core machine (other
/// builds running) a thread can wait seconds for a core; 5 s has room for that without letting
/// a missed timeout pass.
const SLACK_MS: u128 = 5000;
/// The whole trial: two debug processes start (a store, a simulated device each), run a few
/// ops and end in ~3 s on an idle machine; 90 s is far past anything but a hang.
const TRIAL_LIMIT: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    Hang,
    AsyncError,
    Dies,
    Abort,
    InitHang,
}

/// Every kind: (name, fault, mode).
/// The names of [`KINDS`].
pub const KIND_NAMES: [&str; 5] = [
    "gpu hang",
    "gpu async error",
    "gpu rank dies",
    "gpu abort during op",
    "gpu init hang",
];

const KINDS: [(&str, Fault); 5] = [
    (KIND_NAMES[0], Fault::Hang),
    (KIND_NAMES[1], Fault::AsyncError),
    (KIND_NAMES[2], Fault::Dies),
    (KIND_NAMES[3], Fault::Abort),
    (KIND_NAMES[4], Fault::InitHang),
];

/// The layer: `chaos_rank` and the directory of the simulated libraries.
pub struct Gpu {
    rank_bin: PathBuf,
    libs: PathBuf,
    /// Per kind (index in `KINDS`): its trials take the four `TORCH_NCCL_ASYNC_ERROR_HANDLING`
    /// modes in turn, the first drawn, so every 4 trials of it cover them all.
    modes: [Turns; KINDS.len()],
}

impl Gpu {
    /// Builds the simulator (laid out as `test-multigpu --simulated` does) and `chaos_rank`.
    ///
    /// # Errors
    /// Why the layer cannot run here (a build that failed).
    pub fn new() -> Result<Gpu, String> {
        let libs = crate::gpusim::layout(&crate::gpusim::build_simulator()?)?;
        let mut cmd = crate::cargo();
        cmd.args([
            "build",
            "--message-format=json",
            "-p",
            "c10d-nccl",
            "--example",
            "chaos_rank",
        ]);
        let rank_bin = crate::built_executable(&mut cmd, "chaos_rank")?;
        let libs = std::fs::canonicalize(&libs).map_err(|e| format!("{}: {e}", libs.display()))?;
        Ok(Gpu {
            rank_bin,
            libs,
            modes: Default::default(),
        })
    }
}

/// What was drawn for one trial.
struct Plan {
    fault: Fault,
    mode: i32,
    victim: usize,
    /// The faulted all_reduce (from 1; the ones before it must work).
    op: u64,
    /// `C10D_SIM_FAULTS`, when the simulator injects the fault.
    spec: Option<String>,
    /// The victim's abort, ms into the op.
    abort_ms: u64,
    seed: u64,
}

impl Layer for Gpu {
    fn kinds(&self) -> Vec<&'static str> {
        KINDS.iter().map(|k| k.0).collect()
    }

    fn trial(&mut self, kind: &'static str, ctx: &mut Ctx<'_>) -> TrialOut {
        let i = KINDS
            .iter()
            .position(|k| k.0 == kind)
            .expect("one of this layer's kinds");
        let (fault, mode) = (KINDS[i].1, self.modes[i].next(4, ctx.rng) as i32);
        let victim = ctx.rng.range(0, 1) as usize;
        let op = ctx.rng.range(2, 4);
        let spec = match fault {
            Fault::Hang => Some(format!("hang@{victim}:{op}")),
            Fault::AsyncError => {
                let k = ["remote_error", "system_error"][ctx.rng.range(0, 1) as usize];
                Some(format!("{k}@{victim}:{op}"))
            }
            Fault::Dies => Some(format!("die@{victim}:{op}")),
            Fault::InitHang => Some(format!("init_hang@{victim}:1")),
            Fault::Abort => None,
        };
        let plan = Plan {
            fault,
            mode,
            victim,
            op,
            spec,
            abort_ms: ctx.rng.range(50, 800),
            seed: ctx.rng.range(1, 1 << 30),
        };
        let desc = match (&plan.spec, fault) {
            (Some(s), Fault::InitHang) => format!("mode {mode}, C10D_SIM_FAULTS={s}"),
            (Some(s), _) => format!("mode {mode}, C10D_SIM_FAULTS={s} (op {op} of rank {victim})"),
            (None, _) => format!(
                "mode {mode}, rank {victim} aborts {} ms into op {op}",
                plan.abort_ms
            ),
        };
        let fr = ctx.logs.join(format!("trial-{}-fr", ctx.trial));
        let mut out = self.run(&plan, ctx.trial, &fr);
        out.desc = desc;
        if out.problems.is_empty() {
            let _ = std::fs::remove_dir_all(&fr);
        }
        out
    }
}

impl Gpu {
    fn run(&self, plan: &Plan, t: usize, fr: &Path) -> TrialOut {
        let mut out = TrialOut::default();
        let tmp = std::env::temp_dir().join(format!("c10d-chaos-{}-{t}", std::process::id()));
        let _ = std::fs::create_dir_all(&tmp);
        let _ = std::fs::create_dir_all(fr);
        let shm_before = leaks::shm();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(29500);
        let ld = match std::env::var("LD_LIBRARY_PATH") {
            Ok(old) if !old.is_empty() => format!("{}:{old}", self.libs.display()),
            _ => self.libs.display().to_string(),
        };
        let mut ranks: Vec<Rank> = Vec::new();
        for r in 0..2usize {
            let mut cmd = Command::new(&self.rank_bin);
            cmd.env("RANK", r.to_string())
                .env("MASTER_PORT", port.to_string())
                .env("CHAOS_FAULT_OP", plan.op.to_string())
                .env("TORCH_NCCL_ASYNC_ERROR_HANDLING", plan.mode.to_string())
                .env_remove("NCCL_ASYNC_ERROR_HANDLING")
                .env_remove("TORCH_NCCL_BLOCKING_WAIT")
                .env_remove("NCCL_BLOCKING_WAIT")
                .env("LD_LIBRARY_PATH", &ld)
                .env("C10D_NCCL_LIBRARY", self.libs.join("libnccl.so.2"))
                .env("C10D_SIM_GPUS", "2")
                .env("C10D_SIM_DELAY_US", "50")
                .env("C10D_SIM_SEED", plan.seed.to_string())
                .env("C10D_CHAOS_TRIAL", job::marker(t))
                .env("TMPDIR", &tmp)
                .env("TORCH_FR_DUMP_TEMP_FILE", fr.join("comm_lib_trace_rank_"))
                .env_remove("RUST_LOG");
            match &plan.spec {
                Some(s) => cmd.env("C10D_SIM_FAULTS", s),
                None => cmd.env_remove("C10D_SIM_FAULTS"),
            };
            if plan.fault == Fault::Abort {
                if r == plan.victim {
                    cmd.env("CHAOS_ABORT_MS", plan.abort_ms.to_string());
                } else {
                    cmd.env("CHAOS_AFTER_ABORT", "1");
                }
            }
            match job::spawn(&mut cmd) {
                Ok(rank) => ranks.push(rank),
                Err(e) => {
                    out.problems.push(format!("cannot start rank {r}: {e}"));
                    break;
                }
            }
        }
        if ranks.len() == 2 && !job::wait(&mut ranks, &[0, 1], Instant::now() + TRIAL_LIMIT) {
            out.problems.push(format!(
                "hang: ranks still running {} s after they started",
                TRIAL_LIMIT.as_secs()
            ));
        }
        job::kill_all(&mut ranks);
        if ranks.len() == 2 {
            for (r, rank) in ranks.iter().enumerate() {
                let (problems, detect) = judge(plan, r, rank);
                out.problems
                    .extend(problems.into_iter().map(|p| format!("rank {r}: {p}")));
                out.detect.extend(detect);
            }
        }
        for (r, rank) in ranks.iter().enumerate() {
            out.log += &format!(
                "=== rank {r} (exit {:?}, signal {:?})\n{}\n",
                rank.exit,
                rank.signal,
                rank.output()
            );
        }
        let pids: Vec<i32> = ranks.iter().map(|r| r.pid).collect();
        for l in leaks::check(&job::marker(t), &pids, &tmp, &shm_before) {
            out.problems.push(format!("leak: {l}"));
        }
        let _ = std::fs::remove_dir_all(&tmp);
        out
    }
}

/// The number in `line` after `prefix` up to the next space.
fn number_after(line: &str, prefix: &str) -> Option<u128> {
    line.split_once(prefix)?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The problems of rank `r` and its detection time (fault to its error), if it saw one.
fn judge(plan: &Plan, r: usize, rank: &Rank) -> (Vec<String>, Option<Duration>) {
    let mut p = Vec::new();
    let text = rank.output();
    let has = |s: &str| text.lines().any(|l| l.contains(s));
    let line = |s: &str| text.lines().find(|l| l.contains(s)).map(str::to_string);
    if has("outcome: completed") {
        p.push("the faulted op completed as a success".into());
    }
    if has("went wrong") {
        p.push("an op before the fault went wrong".into());
    }
    if has("panicked") {
        p.push("panicked".into());
    }
    if has("not torn down") {
        p.push(format!(
            "mode {} must end the process after a failure; it went on",
            plan.mode
        ));
    }
    let victim = r == plan.victim;
    // The rank's failure: `outcome: failed after MS ms: ERROR`.
    let failed = line("outcome: failed after ");
    let ms = failed
        .as_deref()
        .and_then(|l| number_after(l, "failed after "));
    // From the op's launch; an aborting rank's fault is its abort, `abort_ms` into the op.
    let since = if plan.fault == Fault::Abort && victim {
        u128::from(plan.abort_ms)
    } else {
        0
    };
    let detect = ms.map(|m| Duration::from_millis(m.saturating_sub(since) as u64));
    if plan.fault == Fault::Dies && victim {
        if rank.signal != Some(libc::SIGKILL) || !has("injected fault Die") {
            p.push(format!(
                "the rank meant to die ended with exit {:?}, signal {:?}",
                rank.exit, rank.signal
            ));
        }
        return (p, None);
    }
    // Whether the op's failure goes through the watchdog's response (else it is returned to
    // the caller in every mode: an init that did not finish, an abort on purpose).
    let watched = !(plan.fault == Fault::InitHang || (plan.fault == Fault::Abort && victim));
    let tears_down = watched && (plan.mode == 1 || plan.mode == 3);
    if tears_down {
        let want = format!(
            "taking the entire process down (TORCH_NCCL_ASYNC_ERROR_HANDLING={})",
            plan.mode
        );
        if rank.signal != Some(libc::SIGABRT) || !has(&want) {
            p.push(format!(
                "mode {} must end the process with SIGABRT and \"{want}\": exit {:?}, signal {:?}",
                plan.mode, rank.exit, rank.signal
            ));
        }
        if failed.is_some() {
            p.push("the waiter heard of the failure before the tear-down".into());
        }
        // Detection: from the last good op's line to the process's end.
        let before = rank.line_with(&format!("ok {}", plan.op - 1)).map(|l| l.0);
        let d = before.zip(rank.exited_at).map(|(a, b)| b.duration_since(a));
        if let Some(d) = d {
            if d.as_millis() > OP_TIMEOUT_MS + SLACK_MS {
                p.push(format!("torn down only {} ms after the op", d.as_millis()));
            }
        }
        return (p, d);
    }
    if rank.exit != Some(Some(0)) || !has("exit: 0") {
        p.push(format!(
            "the process must go on to its end: exit {:?}, signal {:?}",
            rank.exit, rank.signal
        ));
    }
    let Some(failed) = failed else {
        p.push("no failure reported to the caller".into());
        return (p, None);
    };
    let ms = ms.unwrap_or(u128::MAX);
    let expect = match plan.fault {
        Fault::InitHang => "ncclCommInitRankConfig",
        Fault::Abort if victim => "abort",
        Fault::Hang => "Watchdog caught collective operation timeout",
        _ => "",
    };
    let named = if expect.is_empty() {
        failed.contains("Watchdog caught collective operation timeout")
            || failed.contains("NCCL error")
    } else {
        failed.contains(expect)
    };
    if !named {
        p.push(format!("unexpected error: {failed}"));
    }
    let at_least = match plan.fault {
        Fault::Hang | Fault::InitHang => OP_TIMEOUT_MS,
        Fault::Abort if victim => u128::from(plan.abort_ms),
        _ => 0,
    };
    if ms < at_least || ms > OP_TIMEOUT_MS + SLACK_MS {
        p.push(format!(
            "failed after {ms} ms; expected between {at_least} and {} ms",
            OP_TIMEOUT_MS + SLACK_MS
        ));
    }
    if plan.fault == Fault::InitHang {
        return (p, detect);
    }
    // The op's memory: mode 0 aborts nothing, so its kernel may still run: it must be held.
    if plan.mode == 0 && !(plan.fault == Fault::Abort && victim) && !has("memory: held") {
        p.push("mode 0: the failed op's memory was released without an abort".into());
    }
    let want_aborted = plan.mode == 2 || (plan.fault == Fault::Abort && victim);
    if !has(&format!("aborted: {want_aborted}")) {
        p.push(format!(
            "the communicator must {}be aborted after the failure",
            if want_aborted { "" } else { "not " }
        ));
    }
    if !has(" ms after abort") {
        p.push("the failed op's memory was not released after the abort".into());
    }
    (p, detect)
}
