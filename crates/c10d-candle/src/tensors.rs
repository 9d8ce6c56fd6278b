//! A candle tensor as a c10d-rs [`c10d_core::Tensor`], for the c10d-rs APIs that take c10d-rs
//! tensors rather than candle ones: DDP's Reducer (`Reducer::new`'s parameters,
//! `mark_variable_ready_with_grad`, copying averaged gradients out of its buckets),
//! `Tensor::copy_from`, a `ProcessGroup`'s ops.
//!
//! [`with_tensor`] lends the candle tensor's own storage (no copy) for one closure: host memory
//! through `c10d_core::borrowed::scope`, CUDA memory through `c10d_nccl::caller_memory::scope`
//! on the storage's stream (candle's device stream), so what the closure queues is ordered after
//! candle's kernels and candle's later kernels after it. [`empty_like`] makes a c10d-rs tensor
//! of the same dtype, shape and device.

use crate::inplace::{device_refused, on_elements};
use crate::slices::{each_mut, unsupported, SliceMut};
use c10d_core::{DType, DistError, Element, Result, Tensor};
use std::cell::RefCell;

/// Memory lent as a c10d-rs tensor of `dims` for one call of `f`.
trait Lend {
    fn lend(self, dims: &[usize], f: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()>;
}

impl<T: Element> Lend for &mut [T] {
    fn lend(self, dims: &[usize], f: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()> {
        c10d_core::borrowed::scope(|s| {
            let v = s.view_mut_shaped(self, dims)?;
            f(&v)
        })
    }
}

#[cfg(feature = "cuda")]
impl<T: c10d_nccl::caller_memory::NcclElement> Lend
    for c10d_nccl::cudarc::driver::CudaViewMut<'_, T>
{
    fn lend(mut self, dims: &[usize], f: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()> {
        use c10d_nccl::cudarc::driver::DeviceSlice;
        let stream = self.stream().clone();
        c10d_nccl::caller_memory::scope(&stream, |s| {
            let v = s.view_mut_shaped(&mut self, dims)?;
            f(&v)
        })
    }
}

/// Runs `f` with `t` as a c10d-rs tensor over `t`'s own storage (no copy): `t`'s shape, its
/// dtype (U32 as I32 bits), its device, writable. Writes through it (a `copy_from`, an
/// in-place collective) change `t` and every candle tensor sharing its storage. CUDA tensors
/// (feature `cuda`) are lent on candle's stream for the storage, which is the thread's declared
/// stream while `f` runs (see `c10d_nccl::caller_memory::scope`); handles cloned out of `f`
/// stop working when it returns.
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
    let run = RefCell::new(|ct: &Tensor| -> Result<()> {
        let f = f.borrow_mut().take().ok_or_else(|| {
            DistError::invalid("c10d-candle: with_tensor's closure was asked to run twice")
        })?;
        *out.borrow_mut() = Some(f(ct)?);
        Ok(())
    });
    on_elements(t, "with_tensor", &|s: SliceMut<'_>| {
        let run = &mut *run.borrow_mut();
        each_mut!(s, |v| v.lend(&dims, run))
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
