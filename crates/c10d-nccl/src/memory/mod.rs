//! Device memory behind CUDA tensors: [`CudaMemory`] is a [`DeviceStorage`] over one block of
//! CUDA's stream-ordered allocator, so that dropping a tensor never synchronises the device
//! (`cuMemFree` may: a watchdog thread releasing a timed-out op's tensors must not wait for the
//! device it is watching). A tensor's block comes from c10d-nccl's own pool (`pool.rs`) on a
//! per-device memory stream (waited for, so it is usable from any stream at once) and goes
//! back with `cuMemFreeAsync` on the thread's current stream when the tensor was made (its
//! declared stream, else the legacy default stream), after the work queued there before the
//! drop, as PyTorch's caching allocator frees a block to its allocation stream; an op's
//! temporary buffers are allocated and freed on the NCCL stream itself
//! ([`CudaMemory::alloc_on_stream`]). Where the device has no stream-ordered allocator,
//! `cuMemAlloc` / `cuMemFree` are used. As with PyTorch's caching allocator, a tensor used on
//! another stream than that one must not be dropped while that work may still run (c10d-nccl's
//! own ops hold their tensors until their end event).
//!
//! [`zeros`] / [`from_cpu`] / [`empty`] make `Device::Cuda(i)` tensors
//! (`torch.zeros(..., device="cuda:i")`, `tensor.to("cuda:i")`). Views (`narrow`, `reshape`,
//! `chunk`) and the lease rules are c10d-core's; a CUDA tensor reads back with
//! [`c10d_core::Tensor::to_cpu`] / `to_vec`.
//!
//! Host copies run on the calling thread's current stream ([`crate::stream`]) and return when
//! the bytes have arrived, so they are ordered after the collectives whose `Work` was waited on.
//!
//! A block that an on-device copy (`device_copy.rs`) used on another stream than its own is
//! freed on the device's free stream once that copy is done (PyTorch's `record_stream`), never
//! making an allocation wait.
//!
//! Children: `caller.rs`, the caller's memory as a storage (what `crate::caller_memory`'s
//! scopes and `from_raw_device` lend, with the rules its views follow); `device_copy.rs`, the
//! on-device copies, zeroing and zeroed allocation of both storages (`Tensor::copy_from`
//! between CUDA tensors of one device, `Tensor::zero_`, `Tensor::new_zeros`).

pub(crate) mod caller;
mod device_copy;

use crate::device::{self, driver_error};
use crate::pool::DevicePool;
use crate::stream;
use c10d_core::{DType, Device, DeviceStorage, Result, Tensor};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use std::any::Any;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// One block of device memory, freed when the last tensor over it is dropped.
pub struct CudaMemory {
    ctx: Arc<CudaContext>,
    device: Device,
    ptr: sys::CUdeviceptr,
    nbytes: usize,
    last_stream: AtomicU64,
    /// Where the block is freed: `None` for `cuMemAlloc`; an op's temporary buffer on the
    /// stream it was allocated on; a tensor on the thread's current stream when it was made
    /// (as PyTorch's caching allocator frees a block to its allocation stream), so that work
    /// the caller queued there before the drop still sees the block.
    ordered_on: Option<Arc<CudaStream>>,
    /// The end events of on-device copies that used the block on other streams
    /// (`device_copy`): the free is ordered after them (see [`CudaMemory::note_copy`]).
    uses: Mutex<Vec<Use>>,
}

/// One on-device copy's end event, with the stream it ran on (held, so its handle is not
/// reused while the entry lives) and the thread that queued it (`CU_STREAM_PER_THREAD` names
/// another stream on every thread).
struct Use {
    stream: Arc<CudaStream>,
    thread: std::thread::ThreadId,
    done: Arc<CudaEvent>,
}

/// Most streams a block keeps copy events of; past it the oldest is folded into the free stream.
const MAX_USES: usize = 8;

impl Use {
    /// The copy ending at `done`, queued on `s` by this thread.
    fn on(s: &Arc<CudaStream>, done: Arc<CudaEvent>) -> Use {
        Use {
            stream: s.clone(),
            thread: std::thread::current().id(),
            done,
        }
    }
}

/// Adds `u`, replacing the event of the same stream and thread (which `u` comes after).
fn record(uses: &mut Vec<Use>, u: Use) {
    uses.retain(|o| o.stream.cu_stream() != u.stream.cu_stream() || o.thread != u.thread);
    uses.push(u);
}

impl std::fmt::Debug for CudaMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaMemory({} bytes on {})", self.nbytes, self.device)
    }
}

impl CudaMemory {
    /// `nbytes` of uninitialised memory on `device` (no allocation for 0 bytes), from the
    /// stream-ordered allocator where the device has one (see the module docs).
    ///
    /// # Errors
    /// As [`device::context`]; "CUDA error in cuMemAllocFromPoolAsync: CUDA_ERROR_OUT_OF_MEMORY"
    /// and other driver errors.
    pub fn alloc(device: Device, nbytes: usize) -> Result<CudaMemory> {
        let pool = match DevicePool::of(device)? {
            Some(pool) if nbytes > 0 => pool,
            _ => return CudaMemory::alloc_sync(device, nbytes),
        };
        let m = CudaMemory::alloc_on_stream(device, nbytes, &pool.stream)?;
        // Usable from every stream once the allocation itself has completed.
        pool.stream
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))?;
        m.freed_on_current_stream()
    }

    /// The block of a tensor is freed on the thread's current stream (see `ordered_on`).
    fn freed_on_current_stream(mut self) -> Result<CudaMemory> {
        self.ordered_on = Some(stream::current_stream(self.device)?);
        Ok(self)
    }

    /// `nbytes` from `cuMemAlloc` (freed with `cuMemFree`): devices without a stream-ordered
    /// allocator, and empty tensors (no allocation).
    fn alloc_sync(device: Device, nbytes: usize) -> Result<CudaMemory> {
        let ctx = device::context(device)?;
        let ptr = if nbytes == 0 {
            0
        } else {
            ctx.bind_to_thread()
                .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
            // SAFETY: the device's context is bound to this thread; the size is non-zero.
            unsafe { result::malloc_sync(nbytes) }.map_err(|e| driver_error("cuMemAlloc", e))?
        };
        Ok(CudaMemory::block(ctx, device, ptr, nbytes, None))
    }

    /// `nbytes` from c10d-nccl's stream-ordered pool on `stream` (`pool.rs`; `cuMemAlloc`
    /// where the device has no stream-ordered allocator): usable by work queued on
    /// `stream` from now on, and freed on `stream` (`cuMemFreeAsync`, after the work queued
    /// there before the drop) when dropped. Whoever uses it elsewhere must order that use
    /// against `stream`.
    ///
    /// # Errors
    /// As [`device::context`]; the driver's error (out of memory included).
    pub fn alloc_on_stream(
        device: Device,
        nbytes: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<CudaMemory> {
        let pool = match DevicePool::of(device)? {
            Some(pool) if nbytes > 0 => pool,
            _ => return CudaMemory::alloc_sync(device, nbytes),
        };
        let ctx = device::context(device)?;
        ctx.bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        // SAFETY: a live stream of this device's context, bound to this thread; non-zero size;
        // the memory is only used by work ordered after this point on `stream`, and freed once
        // in `drop`, on `stream`.
        let ptr = unsafe { pool.alloc(nbytes, stream)? };
        Ok(CudaMemory::block(
            ctx,
            device,
            ptr,
            nbytes,
            Some(stream.clone()),
        ))
    }

    fn block(
        ctx: Arc<CudaContext>,
        device: Device,
        ptr: sys::CUdeviceptr,
        nbytes: usize,
        ordered_on: Option<Arc<CudaStream>>,
    ) -> CudaMemory {
        CudaMemory {
            ctx,
            device,
            ptr,
            nbytes,
            last_stream: AtomicU64::new(0),
            ordered_on,
            uses: Mutex::new(Vec::new()),
        }
    }

    /// `nbytes` of zeros on `device`, usable from every stream (the zeros included) when this
    /// returns: [`CudaMemory::alloc`] with the memset on the same stream before its wait.
    ///
    /// # Errors
    /// As [`CudaMemory::alloc`]; the driver's error of the memset.
    pub fn alloc_zeroed(device: Device, nbytes: usize) -> Result<CudaMemory> {
        let pool = match DevicePool::of(device)? {
            Some(pool) if nbytes > 0 => pool,
            _ => {
                let m = CudaMemory::alloc_sync(device, nbytes)?;
                if nbytes > 0 {
                    // SAFETY: the block was just allocated in this context (bound by
                    // `alloc_sync`), `nbytes` long, and nobody else uses it yet.
                    unsafe { result::memset_d8_sync(m.ptr, 0, nbytes) }
                        .map_err(|e| driver_error("cuMemsetD8", e))?;
                    // cuMemsetD8 may return before it ran (on the legacy stream, which
                    // non-blocking streams do not follow): wait, so any stream sees zeros.
                    m.ctx
                        .synchronize()
                        .map_err(|e| driver_error("cuCtxSynchronize", e))?;
                }
                return Ok(m);
            }
        };
        let m = CudaMemory::alloc_on_stream(device, nbytes, &pool.stream)?;
        // SAFETY: the block was just allocated on `pool.stream` (its context bound by
        // `alloc_on_stream`), `nbytes` long; the memset is queued there, after the allocation.
        unsafe { result::memset_d8_async(m.ptr, 0, nbytes, pool.stream.cu_stream()) }
            .map_err(|e| driver_error("cuMemsetD8Async", e))?;
        pool.stream
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))?;
        m.freed_on_current_stream()
    }

    /// Notes an on-device copy on `s` ending at `done` (PyTorch's `record_stream`): the block's
    /// free waits for it. One event per stream is kept (a later one on the same stream covers
    /// the earlier); past [`MAX_USES`] streams the oldest is folded into the device's free
    /// stream (which waits for it; an event recorded there then stands for it).
    fn note_copy(&self, s: &Arc<CudaStream>, done: &Arc<CudaEvent>) {
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        if uses.len() >= MAX_USES {
            let oldest = uses.remove(0);
            if let Some(folded) = self.fold(&oldest.done) {
                record(&mut uses, folded);
            }
        }
        record(&mut uses, Use::on(s, done.clone()));
    }

    /// `done` as an event of the device's free stream (made to wait for it); where that cannot
    /// be, the host waits for `done` and `None` is returned.
    fn fold(&self, done: &CudaEvent) -> Option<Use> {
        let folded = match DevicePool::of(self.device) {
            Ok(Some(pool)) => pool
                .free_stream
                .wait(done)
                .and_then(|()| pool.free_stream.record_event(None))
                .map(|e| Use::on(&pool.free_stream, Arc::new(e)))
                .ok(),
            _ => None,
        };
        if folded.is_none() {
            wait_on_host(done);
        }
        folded
    }

    /// Where the block is freed: its own stream when no copy on another stream used it; else
    /// the device's free stream, made to wait for those copies and for the block's own stream
    /// (for `cuMemAlloc` blocks, or when that fails, the host waits for the copies instead).
    fn free_stream(&self) -> Option<Arc<CudaStream>> {
        let uses = std::mem::take(&mut *self.uses.lock().unwrap_or_else(|e| e.into_inner()));
        let own = self.ordered_on.clone();
        let (Some(own_stream), false) = (&own, uses.is_empty()) else {
            uses.iter().for_each(|u| wait_on_host(&u.done));
            return own;
        };
        let free = match DevicePool::of(self.device) {
            Ok(Some(pool)) => pool.free_stream,
            _ => {
                uses.iter().for_each(|u| wait_on_host(&u.done));
                return own;
            }
        };
        let ordered = free
            .join(own_stream)
            .and_then(|()| uses.iter().try_for_each(|u| free.wait(&u.done)));
        if let Err(e) = ordered {
            log::warn!("c10d-nccl: ordering a free after device copies failed: {e:?}");
            uses.iter().for_each(|u| wait_on_host(&u.done));
            return own;
        }
        Some(free)
    }

    /// Host copies run on the calling thread's current stream of this device
    /// ([`stream::current_stream`]).
    fn host_copy_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        stream::current_stream(self.device)
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if self.nbytes == 0 {
            return;
        }
        let _ = self.ctx.bind_to_thread();
        let freed = match &self.free_stream() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once, here; every
            // collective using it holds a tensor (and so this storage) until its end event
            // fired or its communicator was aborted.
            None => unsafe { result::free_sync(self.ptr) },
            // SAFETY: `ptr` came from cuMemAllocAsync and is freed once, on its own stream `s`
            // after every use queued there (an op's temporary buffer is only used on `s`), or
            // on the free stream made to wait for that stream and for the device copies on
            // other streams (`free_stream`).
            Some(s) => unsafe { result::free_async(self.ptr, s.cu_stream()) },
        };
        if let Err(e) = freed {
            log::warn!(
                "c10d-nccl: freeing {} bytes of device memory failed: {e:?}",
                self.nbytes
            );
        }
    }
}

impl DeviceStorage for CudaMemory {
    fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let s = self.host_copy_stream()?;
        // SAFETY: `ptr` is the start of this live allocation of `nbytes` bytes.
        unsafe { copy_to_host(&s, self.ptr, self.nbytes, offset, dst) }
    }
    fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        let s = self.host_copy_stream()?;
        // SAFETY: as in `copy_to_host`.
        unsafe { copy_from_host(&s, self.ptr, self.nbytes, offset, src) }
    }
    device_copy::device_storage_methods!();
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `storage` as one of c10d-nccl's storages (this module's [`CudaMemory`] or the caller's memory
/// of `caller.rs`), if it is one: what an on-device copy needs of its source.
fn on_device(storage: &dyn DeviceStorage) -> Option<&dyn device_copy::OnDevice> {
    let any = storage.as_any();
    if let Some(m) = any.downcast_ref::<CudaMemory>() {
        return Some(m);
    }
    any.downcast_ref::<caller::CallerMemory>()
        .map(|m| m as &dyn device_copy::OnDevice)
}

impl device_copy::OnDevice for CudaMemory {
    fn base(&self) -> sys::CUdeviceptr {
        self.ptr
    }
    fn copy_stream(&self, _write: bool) -> Result<Option<Arc<CudaStream>>> {
        Ok(None)
    }
    fn is_callers(&self) -> bool {
        false
    }
    fn note_use(&self, s: &Arc<CudaStream>, done: &Arc<CudaEvent>) -> Result<()> {
        if self
            .ordered_on
            .as_ref()
            .is_none_or(|o| o.cu_stream() != s.cu_stream())
        {
            self.note_copy(s, done);
        }
        Ok(())
    }
}

/// Waits on the host for a device copy's end event (logged if that fails).
fn wait_on_host(done: &CudaEvent) {
    if let Err(e) = done.synchronize() {
        log::warn!("c10d-nccl: waiting for a device copy failed: {e:?}");
    }
}

/// `offset..offset + len` must lie inside an allocation of `nbytes`.
fn check_range(nbytes: usize, offset: usize, len: usize) -> Result<()> {
    if offset.checked_add(len).is_none_or(|end| end > nbytes) {
        return Err(c10d_core::DistError::invalid(format!(
            "copy of {len} bytes at offset {offset} is outside a {nbytes}-byte CUDA allocation"
        )));
    }
    Ok(())
}

/// Runs `copy` on `stream` (its context bound to this thread) and waits for it.
fn copy_and_wait(
    stream: &CudaStream,
    what: &str,
    copy: impl FnOnce(sys::CUstream) -> std::result::Result<(), cudarc::driver::DriverError>,
) -> Result<()> {
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    copy(stream.cu_stream()).map_err(|e| driver_error(what, e))?;
    stream
        .synchronize()
        .map_err(|e| driver_error("cuStreamSynchronize", e))
}

/// Copies `dst.len()` bytes from `offset` bytes into the device allocation at `base` (of
/// `nbytes`) to `dst`, on `stream`, and waits for them (a [`DeviceStorage::copy_to_host`]).
///
/// # Safety
/// `base` must be the start of `nbytes` bytes of live device memory of `stream`'s context.
///
/// # Errors
/// A range outside the allocation; the driver's error.
pub(crate) unsafe fn copy_to_host(
    stream: &CudaStream,
    base: sys::CUdeviceptr,
    nbytes: usize,
    offset: usize,
    dst: &mut [u8],
) -> Result<()> {
    check_range(nbytes, offset, dst.len())?;
    if dst.is_empty() {
        return Ok(());
    }
    let src = base + offset as u64;
    // SAFETY: [src, src + len) lies inside the allocation (checked above, live by the
    // caller's contract); `dst` is a writable host slice that outlives the copy, which is
    // waited for before returning.
    copy_and_wait(stream, "cuMemcpyDtoHAsync", |s| unsafe {
        result::memcpy_dtoh_async(dst, src, s)
    })
}

/// Copies `src` to `offset` bytes into the device allocation at `base`, as [`copy_to_host`].
///
/// # Safety
/// As [`copy_to_host`].
///
/// # Errors
/// As [`copy_to_host`].
pub(crate) unsafe fn copy_from_host(
    stream: &CudaStream,
    base: sys::CUdeviceptr,
    nbytes: usize,
    offset: usize,
    src: &[u8],
) -> Result<()> {
    check_range(nbytes, offset, src.len())?;
    if src.is_empty() {
        return Ok(());
    }
    let dst = base + offset as u64;
    // SAFETY: as in `copy_to_host`, with the host slice read instead.
    copy_and_wait(stream, "cuMemcpyHtoDAsync", |s| unsafe {
        result::memcpy_htod_async(dst, src, s)
    })
}

/// Queues `dst ← src` (two CUDA tensors of one device and byte size) on `stream`; nothing for
/// empty tensors.
///
/// # Safety
/// Both tensors must stay alive, and `dst` unread and unwritten by anyone else, until the copy
/// has run on `stream`, which must belong to their device.
///
/// # Errors
/// The driver's error.
pub(crate) unsafe fn copy_async(dst: &Tensor, src: &Tensor, stream: sys::CUstream) -> Result<()> {
    if src.nbytes() == 0 {
        return Ok(());
    }
    debug_assert_eq!(dst.nbytes(), src.nbytes());
    let (d, s) = (dst.device_ptr().unwrap_or(0), src.device_ptr().unwrap_or(0));
    // SAFETY: both ranges lie inside live allocations (they are views of CUDA tensors of this
    // byte size); lifetime and stream as the caller guarantees.
    unsafe { result::memcpy_dtod_async(d, s, src.nbytes(), stream) }
        .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
}

/// An uninitialised CUDA tensor (`torch.empty(shape, dtype=dtype, device=device)`).
///
/// # Errors
/// As [`CudaMemory::alloc`].
pub fn empty(dtype: DType, shape: &[usize], device: Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mem = CudaMemory::alloc(device, n * dtype.size())?;
    Tensor::from_device_storage(Arc::new(mem), dtype, shape)
}

/// An uninitialised CUDA tensor from the stream-ordered allocator on `stream` (see
/// [`CudaMemory::alloc_on_stream`]): an op's temporary buffer.
///
/// # Errors
/// As [`CudaMemory::alloc_on_stream`].
pub(crate) fn empty_on_stream(
    dtype: DType,
    numel: usize,
    device: Device,
    stream: &Arc<CudaStream>,
) -> Result<Tensor> {
    let mem = CudaMemory::alloc_on_stream(device, numel * dtype.size(), stream)?;
    Tensor::from_device_storage(Arc::new(mem), dtype, &[numel])
}

/// A CUDA tensor of zeros (`torch.zeros(shape, dtype=dtype, device=device)`).
///
/// # Errors
/// As [`from_cpu`].
pub fn zeros(dtype: DType, shape: &[usize], device: Device) -> Result<Tensor> {
    from_cpu(&Tensor::zeros(dtype, shape), device)
}

/// A CUDA copy of a CPU tensor (`tensor.to(device)`); a CUDA tensor is copied through the host.
///
/// # Errors
/// As [`CudaMemory::alloc`]; a busy source; a failed copy.
pub fn from_cpu(t: &Tensor, device: Device) -> Result<Tensor> {
    let out = empty(t.dtype(), t.shape(), device)?;
    out.copy_from(t)?;
    Ok(out)
}
