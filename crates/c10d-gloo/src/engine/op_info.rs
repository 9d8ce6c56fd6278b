//! [`OpInfo`]: what identifies a collective on the wire and in error texts (its index among
//! the group's collectives, its sequence number, op, dtype and size). A leaf of the engine.

use c10d_core::{DType, OpType};

/// What a collective frame is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpInfo {
    /// Index among the group's collectives (equal on every rank).
    pub coll_seq: u64,
    /// PyTorch sequence number on this rank.
    pub seq: u64,
    pub op: OpType,
    pub dtype: DType,
    /// Total bytes of this rank's op (mismatch detection and messages).
    pub total: u64,
}
