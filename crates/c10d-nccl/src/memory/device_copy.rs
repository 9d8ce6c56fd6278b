//! On-device copies, zeroing and zeroed allocation for c10d-nccl's two storages ([`super::CudaMemory`]
//! and the caller's memory of `caller.rs`, both [`OnDevice`]; the parent tells which a storage
//! is, [`super::on_device`], so this module does not know its sibling): what `Tensor::copy_from` between two CUDA
//! tensors of one device, `Tensor::zero_` and `Tensor::new_zeros` run (c10d-core's
//! [`DeviceStorage`] hooks), so that device-agnostic code such as DDP's Reducer keeps its
//! buckets on the GPU.
//!
//! # Ordering
//! The calling thread's stream rule ([`crate::stream`]) holds for these copies as for
//! collectives:
//! the copy is ordered after the work queued on the thread's current stream C (its declared
//! stream, else the legacy default stream) and only queued (the host does not wait); work
//! queued on C afterwards (a collective ordered after C, a kernel, a host copy) comes after it.
//!
//! The copy runs on the caller's memory's own stream where one side is the caller's memory (a
//! scope's stream for its views, checked by the scope's rules: its thread, before its end, no
//! write through a read-only view), else on the thread's current stream; that stream is joined
//! with the current stream both ways.
//!
//! While the thread's stream captures a CUDA graph, a copy is recorded into the graph on that
//! stream and nothing else happens (c10d-nccl's memory used there must outlive the graph's
//! replays, as with PyTorch's graph memory pools); the caller's memory is refused.
//!
//! # Lifetimes
//! Every copy records an event where it ends and hands it to both sides
//! ([`OnDevice::note_use`]): c10d-nccl's own memory orders its free after it (as PyTorch's
//! `record_stream`), the caller's memory makes its stream wait for it (so its owner's later work,
//! and a scope's end, come after the copy).
//!
//! Storages of other crates (no device pointer c10d-nccl can vouch for) are copied through the
//! host ([`copy_through_host`]).

use crate::device::driver_error;
use crate::stream;
use c10d_core::{copy_through_host, Device, DeviceStorage, DistError, Result};
use cudarc::driver::{result, sys, CudaEvent, CudaStream};
use std::sync::Arc;

/// What an on-device copy needs of one of c10d-nccl's storages.
pub(crate) trait OnDevice: DeviceStorage {
    /// The device address of the first byte.
    fn base(&self) -> sys::CUdeviceptr;
    /// The stream this storage's copies must run on, once checked for the access (`write`):
    /// the memory's own stream for the caller's memory, `None` for memory that follows the
    /// thread's current stream.
    ///
    /// # Errors
    /// The scope's refusals (another thread, after its end, a write through a read-only view).
    fn copy_stream(&self, write: bool) -> Result<Option<Arc<CudaStream>>>;
    /// Notes that work queued on `s` and ending at `done` used this memory: what reuses or frees
    /// it afterwards is ordered after `done`.
    ///
    /// # Errors
    /// The driver's error making a stream wait.
    fn note_use(&self, s: &Arc<CudaStream>, done: &Arc<CudaEvent>) -> Result<()>;
    /// True for the caller's memory (refused in CUDA graph capture).
    fn is_callers(&self) -> bool;
}

/// What both storages' `impl DeviceStorage` blocks share: the accessors of their `device`,
/// `ptr`, `nbytes` and `last_stream` fields, and the on-device hooks (`copy_from_device`,
/// `fill_zero`, `alloc_zeroed`) of a storage implementing [`OnDevice`].
macro_rules! device_storage_methods {
    () => {
        fn device(&self) -> c10d_core::Device {
            self.device
        }
        fn device_ptr(&self) -> u64 {
            self.ptr
        }
        fn nbytes(&self) -> usize {
            self.nbytes
        }
        fn last_stream(&self) -> Option<u64> {
            let s = self.last_stream.load(std::sync::atomic::Ordering::Relaxed);
            Some(s).filter(|&s| s != 0)
        }
        fn record_stream(&self, stream: u64) {
            self.last_stream
                .store(stream, std::sync::atomic::Ordering::Relaxed);
        }
        fn copy_from_device(
            &self,
            offset: usize,
            src: &dyn c10d_core::DeviceStorage,
            src_offset: usize,
            nbytes: usize,
        ) -> c10d_core::Result<()> {
            $crate::memory::device_copy::copy(self, offset, src, src_offset, nbytes)
        }
        fn fill_zero(&self, offset: usize, nbytes: usize) -> c10d_core::Result<()> {
            $crate::memory::device_copy::zero(self, offset, nbytes)
        }
        fn alloc_zeroed(
            &self,
            nbytes: usize,
        ) -> c10d_core::Result<std::sync::Arc<dyn c10d_core::DeviceStorage>> {
            let mem = $crate::memory::CudaMemory::alloc_zeroed(self.device(), nbytes)?;
            Ok(std::sync::Arc::new(mem))
        }
    };
}
pub(crate) use device_storage_methods;

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
    let Some(from) = super::on_device(src).filter(|s| s.device() == dst.device()) else {
        return copy_through_host(dst, offset, src, src_offset, nbytes);
    };
    check_range(dst, offset, nbytes)?;
    check_range(from, src_offset, nbytes)?;
    if nbytes == 0 {
        return Ok(());
    }
    let (d, f) = (dst.base() + offset as u64, from.base() + src_offset as u64);
    run(dst.device(), &[(dst, true), (from, false)], |s| {
        // SAFETY: both ranges lie inside live allocations of this device (checked above); each
        // side orders its free or reuse after the copy's end event (`note_use`, called by
        // `run` once the copy is queued), and the copy runs after the work that produced `src`.
        unsafe { result::memcpy_dtod_async(d, f, nbytes, s.cu_stream()) }
            .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
    })
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
    let at = dst.base() + offset as u64;
    run(dst.device(), &[(dst, true)], |s| {
        // SAFETY: the range lies inside `dst`'s live allocation (checked above), whose free or
        // reuse is ordered after the fill (`note_use`); bytes of zero are a valid value of every
        // element type c10d-rs has.
        unsafe { result::memset_d8_async(at, 0, nbytes, s.cu_stream()) }
            .map_err(|e| driver_error("cuMemsetD8Async", e))
    })
}

/// Queues `work` on the stream the module docs name for `sides` (each with whether it is
/// written), ordered by the thread's stream rule, and hands its end event to every side.
fn run(
    device: Device,
    sides: &[(&dyn OnDevice, bool)],
    work: impl FnOnce(&CudaStream) -> Result<()>,
) -> Result<()> {
    let current = stream::current_stream(device)?;
    if crate::capture::is_capturing(&current)? {
        return run_captured(&current, sides, work);
    }
    let own = sides
        .iter()
        .map(|(m, write)| m.copy_stream(*write))
        .collect::<Result<Vec<_>>>()?;
    let s = own.iter().flatten().next().unwrap_or(&current).clone();
    s.context()
        .bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    for o in own.iter().flatten().chain([&current]) {
        if o.cu_stream() != s.cu_stream() {
            s.join(o)
                .map_err(|e| driver_error("cuStreamWaitEvent", e))?;
        }
    }
    work(&s)?;
    let done = match s.record_event(None) {
        Ok(e) => Arc::new(e),
        Err(e) => {
            // Nothing can be ordered after the copy on the device: finish it on the host.
            let _ = s.synchronize();
            return Err(driver_error("cuEventRecord", e));
        }
    };
    // Every side and the thread's stream learn of the copy, even when one of them fails; a
    // stream that cannot wait for it on the device gets the host's wait instead.
    let noted: Vec<Result<()>> = sides.iter().map(|(m, _)| m.note_use(&s, &done)).collect();
    let waited = if current.cu_stream() != s.cu_stream() {
        current
            .wait(&done)
            .or_else(|_| done.synchronize())
            .map_err(|e| driver_error("cuEventSynchronize", e))
    } else {
        Ok(())
    };
    noted.into_iter().collect::<Result<()>>()?;
    waited
}

/// A copy while the thread's stream `d` captures a CUDA graph: recorded into the graph on `d`,
/// with no event and no wait (as a captured collective). The caller's memory is refused: a
/// replay would run after its scope or owner gave it back.
fn run_captured(
    d: &CudaStream,
    sides: &[(&dyn OnDevice, bool)],
    work: impl FnOnce(&CudaStream) -> Result<()>,
) -> Result<()> {
    if sides.iter().any(|(m, _)| m.is_callers()) {
        return Err(DistError::invalid(
            "a copy of the caller's memory (caller_memory) cannot be captured in a CUDA graph \
             (a replay would run after the memory was given back); capture c10d_nccl::memory \
             tensors",
        ));
    }
    work(d)
}

fn check_range(s: &dyn DeviceStorage, offset: usize, len: usize) -> Result<()> {
    super::check_range(s.nbytes(), offset, len)
}
