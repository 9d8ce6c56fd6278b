//! A candle CPU tensor's elements as a typed slice: the span its layout covers in its storage,
//! which must be contiguous, in the element type c10d-rs collectives take.
//!
//! | candle dtype | slice | reductions |
//! |---|---|---|
//! | F32, F64, F16, BF16, U8, I16, I32, I64 | the same type | all |
//! | U32 | its bits as `i32` | SUM and PRODUCT (wrapping, bit-identical to `u32`); others refused |
//! | F8E4M3, F6E2M3, F6E3M2, F4, F8E8M0 | refused | |

use crate::checks::{span, unsupported};
use c10d_core::{DistError, ReduceOp, Result};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, Layout};
use half::{bf16, f16};

/// A tensor's elements, writable.
pub enum SliceMut<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
    U8(&'a mut [u8]),
    I16(&'a mut [i16]),
    I32(&'a mut [i32]),
    I64(&'a mut [i64]),
    /// A U32 tensor's bits.
    U32(&'a mut [i32]),
    /// A CUDA tensor's elements (feature `cuda`; `cuda_slices.rs`).
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda_slices::CudaMut<'a>),
}

/// A tensor's elements, read only.
pub enum SliceRef<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    U8(&'a [u8]),
    I16(&'a [i16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    /// A U32 tensor's bits.
    U32(&'a [i32]),
    /// A CUDA tensor's elements (feature `cuda`; `cuda_slices.rs`).
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda_slices::CudaRef<'a>),
}

/// The elements of `storage` under `layout`, writable.
///
/// # Errors
/// A non-contiguous layout or an unsupported dtype, naming `what`.
pub fn slice_mut<'a>(
    storage: &'a mut CpuStorage,
    layout: &Layout,
    what: &str,
) -> Result<SliceMut<'a>> {
    let r = span(layout, what)?;
    Ok(match storage {
        CpuStorage::F32(v) => SliceMut::F32(&mut v[r]),
        CpuStorage::F64(v) => SliceMut::F64(&mut v[r]),
        CpuStorage::F16(v) => SliceMut::F16(&mut v[r]),
        CpuStorage::BF16(v) => SliceMut::BF16(&mut v[r]),
        CpuStorage::U8(v) => SliceMut::U8(&mut v[r]),
        CpuStorage::I16(v) => SliceMut::I16(&mut v[r]),
        CpuStorage::I32(v) => SliceMut::I32(&mut v[r]),
        CpuStorage::I64(v) => SliceMut::I64(&mut v[r]),
        CpuStorage::U32(v) => SliceMut::U32(bytemuck::cast_slice_mut(&mut v[r])),
        other => return Err(unsupported(other.dtype(), what)),
    })
}

/// The elements of `storage` under `layout`, read only.
///
/// # Errors
/// A non-contiguous layout or an unsupported dtype, naming `what`.
pub fn slice_ref<'a>(storage: &'a CpuStorage, layout: &Layout, what: &str) -> Result<SliceRef<'a>> {
    let r = span(layout, what)?;
    Ok(match storage {
        CpuStorage::F32(v) => SliceRef::F32(&v[r]),
        CpuStorage::F64(v) => SliceRef::F64(&v[r]),
        CpuStorage::F16(v) => SliceRef::F16(&v[r]),
        CpuStorage::BF16(v) => SliceRef::BF16(&v[r]),
        CpuStorage::U8(v) => SliceRef::U8(&v[r]),
        CpuStorage::I16(v) => SliceRef::I16(&v[r]),
        CpuStorage::I32(v) => SliceRef::I32(&v[r]),
        CpuStorage::I64(v) => SliceRef::I64(&v[r]),
        CpuStorage::U32(v) => SliceRef::U32(bytemuck::cast_slice(&v[r])),
        other => return Err(unsupported(other.dtype(), what)),
    })
}

/// Whether `op` on a U32 tensor's `i32` bits gives the `u32` result: SUM and PRODUCT wrap the
/// same way in both; the others compare or divide differently.
///
/// # Errors
/// [`DistError::InvalidArgument`] for any other op, naming `what`.
pub fn check_u32_op(op: ReduceOp, what: &str) -> Result<()> {
    match op {
        ReduceOp::Sum | ReduceOp::Product => Ok(()),
        other => Err(DistError::invalid(format!(
            "c10d-candle: {what} with {other:?} on a U32 tensor is not supported (only SUM and PRODUCT)"
        ))),
    }
}

/// `$body` with `$v` bound to the slice of whichever element type `$s` holds.
macro_rules! each_mut {
    ($s:expr, |$v:ident| $body:expr) => {
        match $s {
            $crate::slices::SliceMut::F32($v) => $body,
            $crate::slices::SliceMut::F64($v) => $body,
            $crate::slices::SliceMut::F16($v) => $body,
            $crate::slices::SliceMut::BF16($v) => $body,
            $crate::slices::SliceMut::U8($v) => $body,
            $crate::slices::SliceMut::I16($v) => $body,
            $crate::slices::SliceMut::I32($v) => $body,
            $crate::slices::SliceMut::I64($v) => $body,
            $crate::slices::SliceMut::U32($v) => $body,
            #[cfg(feature = "cuda")]
            $crate::slices::SliceMut::Cuda(c) => match c {
                $crate::cuda_slices::CudaMut::F32($v) => $body,
                $crate::cuda_slices::CudaMut::F64($v) => $body,
                $crate::cuda_slices::CudaMut::F16($v) => $body,
                $crate::cuda_slices::CudaMut::BF16($v) => $body,
                $crate::cuda_slices::CudaMut::U8($v) => $body,
                $crate::cuda_slices::CudaMut::I32($v) => $body,
                $crate::cuda_slices::CudaMut::I64($v) => $body,
            },
        }
    };
}
pub(crate) use each_mut;
