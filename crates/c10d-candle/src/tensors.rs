//! A candle tensor as a c10d-rs [`c10d_core::Tensor`], for the c10d-rs APIs that take c10d-rs
//! tensors rather than candle ones: DDP's Reducer (`Reducer::new`'s parameters,
//! `mark_variable_ready_with_grad`, copying averaged gradients out of its buckets),
//! `Tensor::copy_from`, a `ProcessGroup`'s ops.
//!
//! [`with_tensor`] lends the candle tensor's own storage (no copy) for one closure, as
//! c10d-world's [`c10d_world::Buffer`]s lend memory: host memory through
//! `c10d_core::borrowed::scope`, CUDA memory through `c10d_nccl::caller_memory::scope` on the
//! thread's declared stream, else the storage's stream (candle's device stream), so what the
//! closure queues is ordered after candle's kernels and candle's later kernels after it. [`empty_like`] makes a c10d-rs tensor
//! of the same dtype, shape and device.

use crate::checks::unsupported;
use crate::inplace::{device_refused, on_elements};
use crate::slices::{each_mut, SliceMut};
use c10d_core::{DType, DistError, Result, Tensor};
use std::cell::RefCell;

/// Runs `f` with `t` as a c10d-rs tensor over `t`'s own storage (no copy): `t`'s shape, its
/// dtype (U32 as I32 bits), its device, writable. Writes through it (a `copy_from`, an
/// in-place collective) change `t` and every candle tensor sharing its storage. The memory is
/// lent as c10d-world's buffers lend it ([`c10d_world::Buffer`]): CUDA tensors (feature `cuda`)
/// through a `c10d_nccl::caller_memory::scope` on the thread's declared stream, else candle's
/// stream for the storage, declared while `f` runs; handles cloned out of `f` stop working when
/// it returns.
///
/// `f` must not use `t` through candle: candle holds `t`'s storage lock while `f` runs, and a
/// candle op on `t` there would wait for itself.
///
/// # Errors
/// A tensor that is not contiguous, of a dtype or on a device this build does not take (see
/// the [crate docs](crate)); `f`'s error.
pub fn with_tensor<R>(t: &candle_core::Tensor, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
    let dims = t.dims().to_vec();
    let f = RefCell::new(Some(f));
    let out = RefCell::new(None);
    // The tensor over the elements, shaped as `t`: what `f` gets, once.
    let run = |flat: &Tensor| -> Result<()> {
        let f = f.borrow_mut().take().ok_or_else(|| {
            DistError::invalid("c10d-candle: with_tensor's closure was asked to run twice")
        })?;
        *out.borrow_mut() = Some(f(&flat.reshape(&dims)?)?);
        Ok(())
    };
    // c10d-world's buffers lend the memory: a borrow scope for host slices, a
    // `caller_memory::scope` for cudarc views.
    on_elements(t, "with_tensor", &|s: SliceMut<'_>| {
        each_mut!(s, |v| c10d_world::Buffer::with_tensor(v, run))
    })?;
    out.into_inner()
        .ok_or_else(|| DistError::invalid("c10d-candle: with_tensor's closure did not run"))
}

/// A c10d-rs tensor with `t`'s dtype (U32 as I32), shape and device (`torch.empty_like`):
/// zeros on the CPU, uninitialised `c10d_nccl::memory` on CUDA (feature `cuda`). What
/// `Reducer::new` takes for a candle model's parameters (it reads their dtype, shape and device).
///
/// # Errors
/// A dtype or device this build does not take; CUDA's allocation error.
pub fn empty_like(t: &candle_core::Tensor) -> Result<Tensor> {
    let dtype = c10d_dtype(t.dtype(), "empty_like")?;
    match t.device().location() {
        candle_core::DeviceLocation::Cpu => Ok(Tensor::zeros(dtype, t.dims())),
        #[cfg(feature = "cuda")]
        candle_core::DeviceLocation::Cuda { gpu_id } => {
            let device = c10d_core::Device::Cuda(gpu_id as u32);
            c10d_nccl::memory::empty(dtype, t.dims(), device)
        }
        _ => Err(device_refused(t, "empty_like")),
    }
}

/// The c10d-rs dtype of a candle dtype (U32 as I32 bits).
///
/// # Errors
/// The fp8, fp6 and fp4 dtypes, naming `what`.
pub fn c10d_dtype(dtype: candle_core::DType, what: &str) -> Result<DType> {
    use candle_core::DType as C;
    Ok(match dtype {
        C::F32 => DType::F32,
        C::F64 => DType::F64,
        C::F16 => DType::F16,
        C::BF16 => DType::BF16,
        C::U8 => DType::U8,
        C::I16 => DType::I16,
        C::I32 | C::U32 => DType::I32,
        C::I64 => DType::I64,
        other => return Err(unsupported(other, what)),
    })
}
