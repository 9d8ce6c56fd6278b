//! The summary `c10drun` prints on stderr when a worker group fails: the root cause (the failed
//! rank with its exit and its own error, another node's failure, a signal, a lost store), the
//! other failures, the workers c10drun stopped, and those that finished.

use crate::attempt::{Ctx, StopReason};
use crate::report::{describe_status, signal_name, worker_error_lines};
use crate::worker::Worker;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

/// Prints the summary under `heading`, with `notes` about the store at the end.
pub(super) fn print_summary(
    ctx: &Ctx,
    workers: &[Worker],
    reason: &StopReason,
    elapsed: f64,
    heading: &str,
    notes: &[String],
) {
    let mut lines = Vec::new();
    lines.push("=".repeat(72));
    lines.push(format!(
        "{heading}: {} (run id {}, node {}, {:.2} s)",
        ctx.cfg.display, ctx.cfg.run_id, ctx.node_rank, elapsed
    ));
    let root = root_cause(workers, reason);
    lines.extend(root_lines(workers, reason, root));
    lines.extend(worker_lines(workers, root));
    for n in notes {
        lines.push(format!("store: {n}"));
    }
    lines.push("=".repeat(72));
    let mut e = std::io::stderr().lock();
    for l in lines {
        let _ = writeln!(e, "c10drun: {l}");
    }
}

/// `rank R (local_rank L, pid P): <exit status>`.
fn fmt_worker(w: &Worker) -> String {
    let st = w
        .status
        .as_ref()
        .map(describe_status)
        .unwrap_or_else(|| "still running".into());
    format!(
        "rank {} (local_rank {}, pid {}): {}",
        w.rank, w.local_rank, w.pid, st
    )
}

/// The root-cause worker of a local failure. When a rank dies, its peers fail a moment later
/// with "connection lost" errors, and their exit may even be observed first. Among the failures
/// seen within ROOT_WINDOW of the first one, a death by a signal (crash, OOM kill, kill -9) is
/// the cause rather than an error exit; otherwise the earliest failure is.
fn root_cause(workers: &[Worker], reason: &StopReason) -> Option<usize> {
    const ROOT_WINDOW: Duration = Duration::from_millis(1000);
    let StopReason::LocalFailure(first) = reason else {
        return None;
    };
    let t0 = workers[*first].ended_at.unwrap_or_else(Instant::now);
    workers
        .iter()
        .enumerate()
        .filter(|(_, w)| w.failed() && w.ended_at.is_some_and(|t| t <= t0 + ROOT_WINDOW))
        .min_by_key(|(_, w)| (w.status.and_then(|s| s.signal()).is_none(), w.ended_at))
        .map(|(i, _)| i)
        .or(Some(*first))
}

/// The "root cause" lines.
fn root_lines(workers: &[Worker], reason: &StopReason, root: Option<usize>) -> Vec<String> {
    let mut lines = Vec::new();
    match (reason, root) {
        (StopReason::LocalFailure(_), Some(i)) => {
            lines.push("root cause (first observed failure):".into());
            lines.push(format!("  {}", fmt_worker(&workers[i])));
            lines.extend(worker_error_lines(&workers[i].error_file, &workers[i].tail));
        }
        (StopReason::RemoteFailure(msg), _) => {
            lines.push(format!("root cause: another node failed: {msg}"))
        }
        (StopReason::Signal(sig), _) => lines.push(format!(
            "root cause: c10drun received {}",
            signal_name(*sig)
        )),
        (StopReason::StoreLost(msg), _) => lines.push(format!("root cause: {msg}")),
        (StopReason::Membership(msg), _) => lines.push(format!("membership changed: {msg}")),
        _ => {}
    }
    lines
}

/// The other ended workers: further failures (with their errors), those c10drun stopped, and
/// the ranks that finished successfully.
fn worker_lines(workers: &[Worker], root: Option<usize>) -> Vec<String> {
    let mut others = Vec::new();
    let mut stopped = Vec::new();
    let mut ok = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        if Some(i) == root || w.status.is_none() {
            continue;
        }
        if w.status.is_some_and(|s| s.success()) {
            ok.push(w.rank.to_string());
        } else if w.stopped_by_us() {
            stopped.push(format!("  {} (stopped by c10drun)", fmt_worker(w)));
        } else {
            others.push(format!("  {}", fmt_worker(w)));
            others.extend(worker_error_lines(&w.error_file, &w.tail));
        }
    }
    let mut lines = Vec::new();
    if !others.is_empty() {
        lines.push("other failures:".into());
        lines.extend(others);
    }
    if !stopped.is_empty() {
        lines.push("stopped:".into());
        lines.extend(stopped);
    }
    if !ok.is_empty() {
        lines.push(format!("finished successfully: ranks [{}]", ok.join(", ")));
    }
    lines
}
