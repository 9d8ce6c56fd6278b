//! How a job ends on this node: the exit barrier the agents meet at, and the end of a job that
//! failed for good (tell the other nodes, print the summary, keep a hosted store up a moment).

use crate::agent::{self, AgentKeys, AgentStore, StoreFail};
use crate::attempt::{Ctx, StopReason};
use crate::output::say;
use crate::summary::print_summary;
use crate::worker::Worker;
use c10d_store::Store;
use std::time::{Duration, Instant};

/// The job failed for good: tells the other nodes this one is done, prints the summary, keeps a
/// hosted store up a moment for the other agents, and returns c10drun's exit status (128 +
/// signal after a signal, else 1).
pub(crate) fn finish_failed(
    ctx: &Ctx,
    store: &mut Option<AgentStore>,
    hosting: bool,
    reason: &StopReason,
    workers: &[Worker],
    elapsed: f64,
) -> i32 {
    let cfg = ctx.cfg;
    let mut notes = Vec::new();
    if let StopReason::StoreLost(_) = reason {
    } else if let Some(s) = store.as_mut() {
        if !hosting {
            let done = ctx.keys.done(ctx.attempt);
            if let Err(e) = s.bounded("the exit barrier", Duration::ZERO, move |st| {
                st.add(&done, 1)
            }) {
                notes.push(format!(
                    "{}; not waiting for the other nodes",
                    agent::fail_text(&e)
                ));
            }
        }
    }
    if let Some(why) = store.as_ref().and_then(|s| s.lost.clone()) {
        if notes.is_empty() && !matches!(reason, StopReason::StoreLost(_)) {
            notes.push(why);
        }
    }
    print_summary(ctx, workers, reason, elapsed, "job failed", &notes);
    if hosting {
        if let Some(s) = store.as_mut() {
            // Give the other agents a moment to read the failure before the store goes away.
            let grace = cfg.stop_timeout + Duration::from_secs(5);
            if let Err(msg) = exit_barrier(s, &ctx.keys, ctx.attempt, ctx.nnodes, grace) {
                say(&format!("exit barrier: {msg}"));
            }
        }
    }
    match reason {
        StopReason::Signal(sig) => 128 + sig,
        _ => 1,
    }
}

/// Marks this node done and waits (bounded by `timeout`, each store operation by the store
/// deadline) until all nodes are; the last one marks the run finished.
pub(crate) fn exit_barrier(
    s: &mut AgentStore,
    keys: &AgentKeys,
    attempt: u32,
    nnodes: usize,
    timeout: Duration,
) -> Result<(), String> {
    let done = keys.done(attempt);
    let n = s
        .bounded("the exit barrier", Duration::ZERO, move |st| {
            st.add(&done, 1)
        })
        .map_err(|e| agent::fail_text(&e))?;
    let finished = keys.finished(attempt);
    if n as usize >= nnodes {
        return s
            .bounded("the exit barrier", Duration::ZERO, move |st| {
                st.set(&finished, b"1")
            })
            .map_err(|e| agent::fail_text(&e));
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "not every node finished within {:.0} s",
                timeout.as_secs_f64()
            ));
        }
        let slice = left.min(Duration::from_secs(1));
        let f = finished.clone();
        match s.bounded("the exit barrier", slice, move |st| {
            st.wait_timeout(&[f.as_str()], slice)
        }) {
            Ok(()) => return Ok(()),
            Err(StoreFail::Op(_)) => continue,
            Err(e) => return Err(agent::fail_text(&e)),
        }
    }
}
