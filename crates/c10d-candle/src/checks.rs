//! The checks every tensor passes before a collective touches its elements, CPU or CUDA: the
//! contiguous span its layout covers, and the error for a dtype c10d-rs does not take. A leaf:
//! `slices.rs` and `cuda_slices.rs` both use it.

use c10d_core::{DistError, Result};
use candle_core::{DType, Layout};

/// The span of `layout` in its storage.
///
/// # Errors
/// [`DistError::InvalidArgument`] for a non-contiguous layout, naming `what`.
pub(crate) fn span(layout: &Layout, what: &str) -> Result<std::ops::Range<usize>> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(a..b),
        None => Err(DistError::invalid(format!(
            "c10d-candle: {what} needs a contiguous tensor, got shape {:?} with strides {:?}; \
             call .contiguous() first",
            layout.shape().dims(),
            layout.stride()
        ))),
    }
}

pub(crate) fn unsupported(dtype: DType, what: &str) -> DistError {
    DistError::invalid(format!(
        "c10d-candle: {what} does not take {dtype:?} tensors (supported: f32, f64, f16, bf16, \
         u8, u32, i16, i32, i64)"
    ))
}
