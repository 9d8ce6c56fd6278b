//! How DDP's own reduction averages a bucket: the reduce op for its buffer. A leaf: the
//! Reducer's buckets and the default comm hooks both use it.

use c10d_core::{ReduceOp, Tensor};

/// How DDP's own reduction averages `buffer`: host buffers were divided by the group size on
/// the way in (PyTorch's `div_` before the sum) and are summed; device buffers, which the Reducer
/// cannot scale without kernels of its own, are averaged by the collective (`ReduceOp::Avg`:
/// NCCL multiplies floats by 1/size before summing, the same pre-division; a CPU backend staging
/// device tensors sums, then divides).
pub(crate) fn average_op(buffer: &Tensor) -> ReduceOp {
    if buffer.is_cpu() {
        ReduceOp::Sum
    } else {
        ReduceOp::Avg
    }
}
