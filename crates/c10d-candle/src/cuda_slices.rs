//! A candle CUDA tensor's elements as cudarc views of its `CudaSlice` (feature `cuda`): the
//! span its layout covers, which must be contiguous. c10d-world's builders take these views
//! directly (`c10d_nccl::caller_memory`): no copy, ordered after the thread's declared stream,
//! else the buffer's own stream, which is candle's device stream. For candle's default device
//! that is the per-thread stream (`CU_STREAM_PER_THREAD`), a different stream on each thread:
//! run a tensor's collectives on the thread whose kernels produced it.
//!
//! | candle dtype | on CUDA |
//! |---|---|
//! | F32, F64, F16, BF16, U8, I32, I64 | the same type, every reduction NCCL has for it |
//! | U32, I16 | refused (c10d-rs has no u32 dtype, NCCL no int16) |
//! | F8E4M3, F6E2M3, F6E3M2, F4, F8E8M0 | refused |

use crate::checks::{span, unsupported};
use c10d_core::{DistError, Result};
use c10d_nccl::cudarc::driver::{CudaView, CudaViewMut};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
use candle_core::{DType, Layout};
use half::{bf16, f16};

/// A CUDA tensor's elements, writable.
pub enum CudaMut<'a> {
    F32(CudaViewMut<'a, f32>),
    F64(CudaViewMut<'a, f64>),
    F16(CudaViewMut<'a, f16>),
    BF16(CudaViewMut<'a, bf16>),
    U8(CudaViewMut<'a, u8>),
    I32(CudaViewMut<'a, i32>),
    I64(CudaViewMut<'a, i64>),
}

/// A CUDA tensor's elements, read only.
pub enum CudaRef<'a> {
    F32(CudaView<'a, f32>),
    F64(CudaView<'a, f64>),
    F16(CudaView<'a, f16>),
    BF16(CudaView<'a, bf16>),
    U8(CudaView<'a, u8>),
    I32(CudaView<'a, i32>),
    I64(CudaView<'a, i64>),
}

fn refused(dtype: DType, what: &str) -> DistError {
    match dtype {
        DType::U32 | DType::I16 => DistError::invalid(format!(
            "c10d-candle: {what} does not take {dtype:?} CUDA tensors (c10d-rs has no u32 dtype \
             and NCCL no int16; convert with .to_dtype(), e.g. to I64 or I32)"
        )),
        other => unsupported(other, what),
    }
}

/// The elements of `storage` under `layout`, writable.
///
/// # Errors
/// A non-contiguous layout or a dtype the table refuses, naming `what`.
pub fn cuda_slice_mut<'a>(
    storage: &'a mut CudaStorage,
    layout: &Layout,
    what: &str,
) -> Result<CudaMut<'a>> {
    let r = span(layout, what)?;
    let dtype = storage.dtype();
    Ok(match &mut storage.slice {
        CudaStorageSlice::F32(s) => CudaMut::F32(s.slice_mut(r)),
        CudaStorageSlice::F64(s) => CudaMut::F64(s.slice_mut(r)),
        CudaStorageSlice::F16(s) => CudaMut::F16(s.slice_mut(r)),
        CudaStorageSlice::BF16(s) => CudaMut::BF16(s.slice_mut(r)),
        CudaStorageSlice::U8(s) => CudaMut::U8(s.slice_mut(r)),
        CudaStorageSlice::I32(s) => CudaMut::I32(s.slice_mut(r)),
        CudaStorageSlice::I64(s) => CudaMut::I64(s.slice_mut(r)),
        _ => return Err(refused(dtype, what)),
    })
}

/// The elements of `storage` under `layout`, read only.
///
/// # Errors
/// As [`cuda_slice_mut`].
pub fn cuda_slice_ref<'a>(
    storage: &'a CudaStorage,
    layout: &Layout,
    what: &str,
) -> Result<CudaRef<'a>> {
    let r = span(layout, what)?;
    Ok(match &storage.slice {
        CudaStorageSlice::F32(s) => CudaRef::F32(s.slice(r)),
        CudaStorageSlice::F64(s) => CudaRef::F64(s.slice(r)),
        CudaStorageSlice::F16(s) => CudaRef::F16(s.slice(r)),
        CudaStorageSlice::BF16(s) => CudaRef::BF16(s.slice(r)),
        CudaStorageSlice::U8(s) => CudaRef::U8(s.slice(r)),
        CudaStorageSlice::I32(s) => CudaRef::I32(s.slice(r)),
        CudaStorageSlice::I64(s) => CudaRef::I64(s.slice(r)),
        _ => return Err(refused(storage.dtype(), what)),
    })
}
