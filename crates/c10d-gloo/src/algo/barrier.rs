//! Barrier (dissemination) and monitored barrier (through rank 0).

use crate::engine::Comm;
use c10d_core::{DistError, Result};
use std::time::Duration;

/// Dissemination barrier: in round k (distance d = 2^k) send an empty frame to r + d and wait
/// for one from r − d. After ⌈log₂ n⌉ rounds every rank has heard, transitively, from all.
pub(crate) fn dissemination(comm: &mut Comm<'_>) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let mut d = 1usize;
    let mut round = 0u32;
    while d < n {
        let to = (r + d) % n;
        let from = (r + n - d) % n;
        comm.exchange(&[(to, round, &[])], &mut [(from, round, &mut [])])?;
        d <<= 1;
        round += 1;
    }
    Ok(())
}

/// Monitored barrier: every rank reports to rank 0, which then releases everyone. Rank 0 names
/// the ranks that did not arrive within `timeout` (all of them with `wait_all_ranks`, else the
/// lowest), with PyTorch's texts.
pub(crate) fn monitored(
    comm: &mut Comm<'_>,
    timeout: Duration,
    wait_all_ranks: bool,
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    if n == 1 {
        return Ok(());
    }
    let deadline = crate::engine::deadline_after(timeout);
    comm.with_posts(|posts| {
    if r != 0 {
        let ids = [posts.signal(0, 0), posts.await_signal(0, 1)];
        return posts.wait_or_missing(&ids, deadline).map_err(|(_, e)| {
            let why = e.map(|e| format!(" Original exception: {e}")).unwrap_or_default();
            DistError::backend(format!(
                "Rank {r} successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.{why}"
            ))
        });
    }
    if timeout.is_zero() {
        return Err(DistError::backend(
            "Rank 0 timed out in monitoredBarrier after 0 ms",
        ));
    }
    let ids: Vec<u64> = (1..n).map(|p| posts.await_signal(p, 0)).collect();
    if let Err((missing, e)) = posts.wait_or_missing(&ids, deadline) {
        let ms = timeout.as_millis();
        let why = e
            .map(|e| format!(" Original exception: {e}"))
            .unwrap_or_default();
        if missing.is_empty() {
            return Err(DistError::backend(format!(
                "Rank 0 failed in monitoredBarrier.{why}"
            )));
        }
        return Err(DistError::backend(if wait_all_ranks {
            let list = missing
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            format!("Ranks {list} failed to pass monitoredBarrier in {ms} ms{why}")
        } else {
            format!(
                "Rank {} failed to pass monitoredBarrier in {ms} ms{why}",
                missing[0]
            )
        }));
    }
    for p in 1..n {
        posts.signal(p, 1);
    }
    posts.wait_all()
    })
}
