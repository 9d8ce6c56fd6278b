//! On-device copies, zeroing and zeroed allocation for c10d-nccl's two storages ([`CudaMemory`]
//! and the caller's memory of `caller_memory`): what `Tensor::copy_from` between two CUDA
//! tensors of one device, `Tensor::zero_` and `Tensor::new_zeros` run (c10d-core's
//! [`DeviceStorage`] hooks), so that device-agnostic code such as DDP's Reducer keeps its
//! buckets on the GPU.
//!
//! # Which stream
//! - A view of a `caller_memory::scope` is copied on the scope's stream, under the scope's rules
//!   (its thread, before it ends, never written through a read-only view), after the ops that
//!   used it, as its host copies are.
//! - c10d-nccl's own memory follows the calling thread's current stream ([`crate::stream`]).
//! - When the thread declared no stream for the device, the host waits for the copy before the
//!   call returns (the crate's safe default: work the caller queues next, on any stream, sees
//!   it); with a declared stream the copy is only queued there, as `Tensor.copy_` on CUDA.
//!
//! Storages of other crates (no device pointer c10d-nccl can vouch for) are copied through the
//! host ([`copy_through_host`]).

use super::CudaMemory;
use crate::device::driver_error;
use crate::stream;
use c10d_core::{copy_through_host, Device, DeviceStorage, DistError, Result};
use cudarc::driver::{result, sys, CudaStream};
use std::sync::Arc;

/// What an on-device copy needs of one of c10d-nccl's storages.
pub(crate) trait OnDevice: DeviceStorage {
    /// The device address of the first byte.
    fn base(&self) -> sys::CUdeviceptr;
    /// The stream this storage's copies must run on, once checked for the access (`write`):
    /// a scope's stream for its views, `None` for memory that follows the current stream.
    ///
    /// # Errors
    /// The scope's refusals (another thread, after its end, a write through a read-only view).
    fn copy_stream(&self, write: bool) -> Result<Option<Arc<CudaStream>>>;
}

/// `storage` as one of c10d-nccl's storages, if it is one.
fn on_device(storage: &dyn DeviceStorage) -> Option<&dyn OnDevice> {
    let any = storage.as_any();
    if let Some(m) = any.downcast_ref::<CudaMemory>() {
        return Some(m);
    }
    super::caller::as_on_device(any)
}

/// [`DeviceStorage::copy_from_device`] for `dst`, one of c10d-nccl's storages.
///
/// # Errors
/// A range outside either storage; the scope's refusals; the driver's error.
pub(crate) fn copy<D: OnDevice>(
    dst: &D,
    offset: usize,
    src: &dyn DeviceStorage,
    src_offset: usize,
    nbytes: usize,
) -> Result<()> {
    let Some(from) = on_device(src).filter(|s| s.device() == dst.device()) else {
        return copy_through_host(dst, offset, src, src_offset, nbytes);
    };
    check_range(dst, offset, nbytes)?;
    check_range(from, src_offset, nbytes)?;
    if nbytes == 0 {
        return Ok(());
    }
    let s = copy_stream(
        dst.device(),
        dst.copy_stream(true)?,
        from.copy_stream(false)?,
    )?;
    let (d, f) = (dst.base() + offset as u64, from.base() + src_offset as u64);
    // SAFETY: both ranges lie inside live allocations of this device (checked above; each
    // storage keeps its memory alive while it exists, and the caller holds both); the copy is
    // queued on a stream of their context, after the work that produced `src`.
    unsafe { result::memcpy_dtod_async(d, f, nbytes, s.cu_stream()) }
        .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))?;
    finish(dst.device(), &s)
}

/// [`DeviceStorage::fill_zero`] for `dst`, one of c10d-nccl's storages.
///
/// # Errors
/// A range outside the storage; the scope's refusals; the driver's error.
pub(crate) fn zero<D: OnDevice>(dst: &D, offset: usize, nbytes: usize) -> Result<()> {
    check_range(dst, offset, nbytes)?;
    if nbytes == 0 {
        return Ok(());
    }
    let s = copy_stream(dst.device(), dst.copy_stream(true)?, None)?;
    // SAFETY: the range lies inside `dst`'s live allocation (checked above); bytes of zero are
    // a valid value of every element type c10d-rs has.
    unsafe { result::memset_d8_async(dst.base() + offset as u64, 0, nbytes, s.cu_stream()) }
        .map_err(|e| driver_error("cuMemsetD8Async", e))?;
    finish(dst.device(), &s)
}

/// [`DeviceStorage::alloc_zeroed`]: `nbytes` of c10d-nccl's own memory on `device`, zeroed.
///
/// # Errors
/// As [`CudaMemory::alloc`] and [`zero`].
pub(crate) fn alloc_zeroed(device: Device, nbytes: usize) -> Result<Arc<dyn DeviceStorage>> {
    let mem = CudaMemory::alloc(device, nbytes)?;
    zero(&mem, 0, nbytes)?;
    Ok(Arc::new(mem))
}

/// The stream a copy runs on (see the module docs): the destination's scope stream, else the
/// source's, else the thread's current stream; a destination stream first waits for the
/// source's.
fn copy_stream(
    device: Device,
    dst: Option<Arc<CudaStream>>,
    src: Option<Arc<CudaStream>>,
) -> Result<Arc<CudaStream>> {
    let s = match (dst, src) {
        (Some(d), Some(s)) if d.cu_stream() != s.cu_stream() => {
            d.join(&s)
                .map_err(|e| driver_error("cuStreamWaitEvent", e))?;
            d
        }
        (Some(d), _) => d,
        (None, Some(s)) => s,
        (None, None) => stream::current_stream(device)?,
    };
    s.context()
        .bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    Ok(s)
}

/// Waits on the host for `s` when the thread declared no stream for `device`.
fn finish(device: Device, s: &CudaStream) -> Result<()> {
    if stream::declared_stream(device)?.is_some() {
        return Ok(());
    }
    s.synchronize()
        .map_err(|e| driver_error("cuStreamSynchronize", e))
}

fn check_range(s: &dyn DeviceStorage, offset: usize, len: usize) -> Result<()> {
    if offset.checked_add(len).is_none_or(|end| end > s.nbytes()) {
        return Err(DistError::invalid(format!(
            "device copy of {len} bytes at offset {offset} is outside a {}-byte CUDA allocation",
            s.nbytes()
        )));
    }
    Ok(())
}
