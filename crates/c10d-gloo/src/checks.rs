//! Argument checks of the ops: c10d-core's shared [`Checks`] (PyTorch's texts, prefixed
//! `"ProcessGroupGloo::<op>: "`), plus the one thing only this backend requires: tensors in
//! host memory.

use c10d_core::checks::{At, Checks};
use c10d_core::*;

/// The class name PyTorch's messages carry.
const NAME: &str = "ProcessGroupGloo";

/// The shared checks for rank `rank` of a group of `size`.
pub(crate) fn checks(rank: usize, size: usize) -> Checks<'static> {
    Checks {
        backend: NAME,
        rank,
        size,
    }
}

/// Op `op` of this backend.
pub(crate) fn at(op: &str) -> At<'_> {
    At { backend: NAME, op }
}

/// Every tensor of `ts` is in host memory ("unsupported device type …").
pub(crate) fn cpu<'t>(op: &str, ts: impl IntoIterator<Item = &'t Tensor>) -> Result<()> {
    at(op).cpu(ts)
}

pub(crate) fn nbytes(ts: &[Tensor]) -> u64 {
    ts.iter().map(|t| t.nbytes() as u64).sum()
}
