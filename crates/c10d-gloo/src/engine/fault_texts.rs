//! The error texts of failed ops: a panic's text, a list of ranks, an op or point-to-point op
//! that failed on this rank, an error that blames peers. A leaf of the engine: faults handling,
//! the algorithms' `Comm`, matching and the drive loops all word their errors with it.

use super::op_info::OpInfo;
use super::Ident;
use c10d_core::{DistError, ErrorContext, OpType};

/// The message of a caught panic ("" when it is not a string).
pub(super) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// "1, 3, 4".
pub(super) fn rank_list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// "{op} (seq n) on rank r failed: {e}", carrying the op's [`ErrorContext`] (with the ranks
/// `e` blamed).
pub(super) fn op_failed(info: &OpInfo, id: &Ident, e: &DistError) -> DistError {
    p2p_failed(info.op, info.seq, id, e)
}

/// [`op_failed`] for a send or receive (or any op known by type and sequence number).
pub(super) fn p2p_failed(op: OpType, seq: u64, id: &Ident, e: &DistError) -> DistError {
    let rank = id.rank;
    let peers = e.context().map(|c| c.peers.clone()).unwrap_or_default();
    e.map_message(|m| format!("{op} (seq {seq}) on rank {rank} failed: {m}"))
        .with_context(ErrorContext::op(&id.group_name, rank, op, seq).blaming(peers))
}

/// `e` blaming `peers` (group ranks), for a program to read (see [`ErrorContext`]).
pub(crate) fn blaming(e: DistError, peers: impl IntoIterator<Item = usize>) -> DistError {
    let ctx = e.context().cloned().unwrap_or_default().blaming(peers);
    e.with_context(ctx)
}
