//! Argument checks of the ops, with PyTorch's texts prefixed `"ProcessGroupGloo::<op>: "`:
//! the shared ones of `c10d_core::checks`, plus what only a CPU backend checks.

use c10d_core::checks::At;
use c10d_core::*;

pub(crate) fn inval(op: &str, msg: impl std::fmt::Display) -> DistError {
    at(op).invalid(msg)
}

/// The shared checks of c10d-core, prefixed "ProcessGroupGloo::{op}: ".
pub(crate) fn at(op: &str) -> At<'_> {
    At {
        backend: "ProcessGroupGloo",
        op,
    }
}

/// Input/output pairs of a `*_tensor_coalesced` op: non-empty lists of one length, all on CPU.
pub(crate) fn check_coalesced_pairs(op: &str, outputs: &[Tensor], inputs: &[Tensor]) -> Result<()> {
    at(op).pairs(outputs, inputs)?;
    let refs: Vec<&Tensor> = inputs.iter().chain(outputs).collect();
    check_cpu(op, &refs)
}

/// The root's tensor list of gather (`kind` "output") or scatter (`kind` "input").
pub(crate) fn check_root_list(op: &str, lists: &[Vec<Tensor>], n: usize, kind: &str) -> Result<()> {
    at(op).root_list(lists, n, kind)
}

pub(crate) fn check_cpu(op: &str, ts: &[&Tensor]) -> Result<()> {
    if ts.iter().any(|t| !t.is_cpu()) {
        return Err(inval(op, "unsupported device type"));
    }
    Ok(())
}

/// "invalid tensor type" / "invalid tensor size" against `proto`.
pub(crate) fn check_same(op: &str, ts: &[&Tensor], proto: &Tensor) -> Result<()> {
    at(op).same(ts, proto)
}

pub(crate) fn check_op(op: &str, rop: ReduceOp, dtype: DType) -> Result<()> {
    rop.check_dtype(dtype)
        .map_err(|e| e.with_prefix(&format!("ProcessGroupGloo::{op}: ")))
}

/// `reduce`'s argument checks: root rank and tensor in range, one CPU tensor, op valid for
/// its dtype.
pub(crate) fn check_reduce(tensors: &[Tensor], opts: &ReduceOptions, size: usize) -> Result<()> {
    const OP: &str = "reduce";
    at(OP).root(opts.root_rank, size)?;
    if opts.root_tensor >= tensors.len() {
        return Err(inval(
            OP,
            format!("invalid root tensor: {}", opts.root_tensor),
        ));
    }
    at(OP).single(tensors)?;
    check_cpu(OP, &[&tensors[0]])?;
    check_op(OP, opts.reduce_op, tensors[0].dtype())
}

pub(crate) fn nbytes(ts: &[Tensor]) -> u64 {
    ts.iter().map(|t| t.nbytes() as u64).sum()
}
