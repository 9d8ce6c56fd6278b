//! Collectives on GPU memory the caller owns, with no copy: cudarc's `CudaSlice<T>`,
//! `CudaView<T>` and `CudaViewMut<T>` (candle's CUDA storage is a `CudaSlice`), and device
//! memory from other stacks (libtorch through tch, a kernel library) through one `unsafe`
//! constructor, [`from_raw_device`].
//!
//! # Borrows
//! The rules of host slices ([`c10d_core::borrowed`]) hold for device memory too:
//! - **For one blocking call**, c10d-world's builders take `&mut CudaSlice<T>` and
//!   `CudaViewMut<T>` (read and written in place) and `&CudaSlice<T>` and `CudaView<T>` (read
//!   only); they have no `.start()`, as the buffer is borrowed just for the call.
//! - **Asynchronously**, inside a [`scope`]: [`CudaScope::view_mut`] / [`CudaScope::view`] make
//!   [`TensorView`]s (usable wherever a [`Tensor`] is) and keep the buffers borrowed until the
//!   scope ends. The scope then waits until no collective holds a view (a view is given back by
//!   the op's `Work::wait`, which only makes a stream wait; an op nobody waited on is waited
//!   for on the host until it finishes, fails or times out: with
//!   `TORCH_NCCL_ASYNC_ERROR_HANDLING=0`, or an op whose group was dropped while it could not
//!   leave the device, that wait has no bound) and cuts every view off, so that no handle can
//!   reach the memory after the borrow. As the scope borrows what it views for its whole life,
//!   a part of a buffer (`slice_mut(a..b)`) is cut before the scope is entered.
//! - A view is used on the scope's thread, with the scope's stream declared (as it is inside
//!   the scope unless the caller declares another): an op elsewhere is refused, as are ops in a
//!   coalesced block (launched at `end_coalescing`, possibly after the scope; c10d-world refuses
//!   borrowed memory in a `coalescing_manager` block too) and ops during CUDA graph capture (a
//!   replay would run after the scope). Host copies of a view (`to_vec`) run on its thread only.
//!
//! ```compile_fail
//! # fn f(stream: std::sync::Arc<cudarc::driver::CudaStream>, mut grads: cudarc::driver::CudaSlice<f32>) -> c10d_core::Result<()> {
//! c10d_nccl::caller_memory::scope(&stream, |s| {
//!     let g = s.view_mut(&mut grads)?;
//!     drop(grads); // error[E0505]: `grads` is still borrowed by the scope
//!     Ok(())
//! })
//! # }
//! ```
//!
//! # Ordering
//! A scope runs on one stream of one device: the caller's (the stream its kernels produced the
//! data on; c10d-world's blocking calls take the thread's declared stream, else the buffer's
//! own, `CudaSlice::stream()`). For the scope's duration that stream is the thread's declared
//! stream ([`crate::stream`]'s rule): each collective is ordered after the work queued on it,
//! and `Work::wait` makes it wait for the collective, without blocking the host. Where a
//! buffer's own stream is another stream, the scope's stream first waits for the work queued
//! there, and when the scope ends the buffer's stream waits for the scope's, so the buffer's
//! next use and its free (`cuMemFreeAsync` on its own stream) come after the collectives. When
//! the scope ends its stream also waits for every op that used a view, whichever stream waited
//! on the op's `Work`. cudarc's per-buffer events are used as well (`DevicePtr::device_ptr`),
//! so cudarc work on a third stream is ordered too where the context tracks events (cudarc
//! does once a context has made a second stream).
//!
//! candle's default CUDA device runs on the per-thread stream (`CU_STREAM_PER_THREAD`), which
//! names a different stream on each thread: run a tensor's collectives on the thread whose
//! kernels produced it, or synchronise between the threads.
//!
//! # Versions
//! cudarc 0.19 (built with its `f16` feature): the line candle 0.11 uses, so a candle program's
//! `CudaSlice` is this crate's. Another cudarc line is a different type to the compiler and
//! does not build against these functions. Element types: [`NcclElement`] (f32, f64, f16,
//! bf16, i8, u8, i32, i64).
//!
//! ```no_run
//! use c10d_core::{AllreduceOptions, Collectives};
//! # fn f(pg: &c10d_nccl::ProcessGroupNccl, ctx: std::sync::Arc<cudarc::driver::CudaContext>) -> c10d_core::Result<()> {
//! let stream = ctx.new_stream().unwrap();
//! let mut grads = stream.clone_htod(&vec![1.0f32; 1024]).unwrap();
//! c10d_nccl::caller_memory::scope(&stream, |s| {
//!     let g = s.view_mut(&mut grads)?;
//!     let work = pg.all_reduce(&[(*g).clone()], &AllreduceOptions::default())?;
//!     // ... queue other kernels on `stream` while NCCL runs ...
//!     work.wait() // the stream waits for the all_reduce; the host does not
//! })?;
//! let summed = stream.clone_dtoh(&grads).unwrap(); // ordered after the all_reduce
//! # Ok(()) }
//! ```

use crate::device;
pub(crate) use crate::memory::caller::{check_uses, note_end};
use crate::memory::caller::{lent, CallerMemory, Lent};
use crate::stream;
use c10d_core::{DType, Device, DistError, Element, Result, Tensor, TensorView};
use cudarc::driver::{sys, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, SyncOnDrop};
use std::any::Any;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// An element type NCCL reduces and moves that is also a cudarc device element: f32, f64,
/// `half::f16`, `half::bf16`, i8, u8, i32, i64 (`bool`, `i16` and complex are not: NCCL has
/// no such type, and a peer could send a byte that is not a valid `bool`).
pub trait NcclElement: Element + DeviceRepr {}

macro_rules! nccl_element {
    ($($t:ty),*) => {$( impl NcclElement for $t {} )*};
}
nccl_element!(f32, f64, half::f16, half::bf16, i8, u8, i32, i64);

/// The CUDA device whose primary context `stream` belongs to (the context c10d-nccl, NCCL and
/// the CUDA runtime use).
///
/// # Errors
/// A stream of another context (a non-primary one): its events could not order NCCL's stream.
fn device_of(stream: &CudaStream) -> Result<Device> {
    let device = Device::Cuda(stream.context().ordinal() as u32);
    if device::context(device)?.cu_ctx() != stream.context().cu_ctx() {
        return Err(DistError::invalid(format!(
            "the stream belongs to a CUDA context that is not the primary context of {device}; \
             c10d-nccl runs on primary contexts (cudarc's CudaContext::new)"
        )));
    }
    Ok(device)
}

/// One pointer attribute of `ptr` from the driver, written into a `T`.
///
/// # Safety
/// `T` must be the type the driver writes for `attr` (an `i32` for the device ordinal, a
/// `CUdeviceptr` for the range start, a `usize` for the range size).
unsafe fn pointer_attribute<T: Default>(
    attr: sys::CUpointer_attribute,
    ptr: sys::CUdeviceptr,
) -> std::result::Result<T, sys::CUresult> {
    let mut v = T::default();
    // SAFETY: the query only reads the driver's tables and writes one `T` (the caller's
    // contract) into `v`.
    let r = unsafe { sys::cuPointerGetAttribute((&mut v as *mut T).cast(), attr, ptr) };
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(v)
    } else {
        Err(r)
    }
}

/// Checks a device pointer for [`from_raw_device`]: null or misaligned pointers, pointers the
/// driver does not know as memory of `device`, ranges that run past their allocation.
fn check_pointer(ptr: sys::CUdeviceptr, nbytes: usize, dtype: DType, device: Device) -> Result<()> {
    if nbytes == 0 {
        return Ok(());
    }
    if ptr == 0 || !ptr.is_multiple_of(dtype.size().min(8) as u64) {
        return Err(DistError::invalid(format!(
            "device pointer {ptr:#x} is null or not aligned for {dtype}"
        )));
    }
    use sys::CUpointer_attribute as A;
    // SAFETY: each attribute is read into the type the driver writes for it.
    let (ordinal, start, size) = unsafe {
        (
            pointer_attribute::<i32>(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
            pointer_attribute::<sys::CUdeviceptr>(A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr),
            pointer_attribute::<usize>(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr),
        )
    };
    let on = match ordinal {
        Ok(o) if o >= 0 && Device::Cuda(o as u32) == device => o,
        other => {
            return Err(DistError::invalid(format!(
                "pointer {ptr:#x} is not CUDA memory of {device} (the driver says {other:?})"
            )))
        }
    };
    if let (Ok(start), Ok(size)) = (start, size) {
        let end = ptr.checked_add(nbytes as u64);
        if end.is_none_or(|end| end > start + size as u64) {
            return Err(DistError::invalid(format!(
                "{nbytes} bytes at {ptr:#x} run past the end of their allocation on cuda:{on} \
                 ({size} bytes at {start:#x})"
            )));
        }
    }
    Ok(())
}

/// A CUDA tensor over device memory another stack owns — a libtorch tensor's `data_ptr()`, a
/// kernel library's buffer — without copying (`torch.as_tensor` over `__cuda_array_interface__`
/// in spirit). `owner` is kept alive until the last handle to the tensor (a collective's lease
/// included) is dropped; host copies (`to_vec`) run on `stream`. Collectives on it are ordered
/// by [`crate::stream`]'s rule: declare `stream` as the thread's stream
/// ([`stream::use_stream`]) to order them after it without blocking the host; with nothing
/// declared they are ordered after the legacy default stream, which does not wait for
/// non-blocking streams. A stream of another library is wrapped
/// with cudarc's `CudaContext::wrap_borrowed_stream`.
///
/// # Errors
/// [`DistError::InvalidArgument`] when `shape` × `dtype` overflows, `ptr` is null or
/// misaligned for `dtype`, the driver does not know `ptr` as memory of `stream`'s device, or
/// `stream` is not on a device's primary context.
///
/// # Safety
/// `ptr` must point to `numel(shape) × dtype.size()` bytes of device memory of `stream`'s
/// device that stay valid for reads and writes for as long as `owner` lives, and nobody may
/// touch them other than through the returned tensor's handles while a collective holds one
/// (until its `Work::wait`, or its completion) — the rule a `torch.Tensor` passed to a PyTorch
/// collective follows. `Work::wait` orders only the stream declared by the waiting thread after
/// the op (the host, when none is declared): work on any other stream, libtorch's current
/// stream included unless it is that one, must be ordered by the caller. With CUDA graph
/// capture, the tensor must be kept for as long as the graph may be replayed.
pub unsafe fn from_raw_device(
    ptr: u64,
    dtype: DType,
    shape: &[usize],
    stream: &Arc<CudaStream>,
    owner: Box<dyn Any + Send>,
) -> Result<Tensor> {
    let nbytes = shape
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
        .ok_or_else(|| DistError::invalid(format!("shape {shape:?} is too large")))?;
    let device = device_of(stream)?;
    check_pointer(ptr, nbytes, dtype, device)?;
    let storage = CallerMemory {
        device,
        ptr,
        nbytes,
        stream: stream.clone(),
        last_stream: AtomicU64::new(0),
        lent: None,
        _owner: Mutex::new(owner),
    };
    Tensor::from_device_storage(Arc::new(storage), dtype, shape)
}

/// The stream a blocking call on a buffer whose own stream is `own` runs its scope on: the
/// thread's declared stream on the buffer's device, else `own` (the module docs' rule, used by
/// c10d-world's builders).
///
/// # Errors
/// As [`stream::declared_stream`].
pub fn blocking_call_stream(own: &Arc<CudaStream>) -> Result<Arc<CudaStream>> {
    let device = Device::Cuda(own.context().ordinal() as u32);
    Ok(stream::declared_stream(device)?.unwrap_or_else(|| own.clone()))
}

/// The scope of [`scope`]: makes tensor views of cudarc buffers, borrowed until it ends.
pub struct CudaScope<'scope, 'env: 'scope> {
    stream: Arc<CudaStream>,
    device: Device,
    /// Every view made, cut off from its memory when the scope ends.
    views: Mutex<Vec<Tensor>>,
    /// The buffers' own streams where they differ from the scope's: joined both ways.
    buffer_streams: Mutex<Vec<Arc<CudaStream>>>,
    /// cudarc's records of the buffers' use on the scope's stream, made when the scope ends
    /// (`end` empties it; no drop glue, as its items borrow the scope itself).
    uses: ManuallyDrop<Mutex<Vec<SyncOnDrop<'scope>>>>,
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
    /// Not `Sync`: views are made, used and given back on the scope's thread.
    one_thread: PhantomData<*const ()>,
}

/// Runs `f` with a [`CudaScope`] on `stream` (declared as the thread's stream on its device
/// while `f` runs, see the module docs); when `f` returns or panics, waits until no collective
/// holds a view made in the scope, orders `stream` and the buffers' own streams after the
/// collectives, cuts the views off and restores the thread's previously declared stream, which
/// (or the legacy default stream where none was declared) is then made to wait for `stream`:
/// work queued after the scope (a collective, a copy, a DDP bucket's all_reduce) comes after
/// what the scope queued on its stream. The wait is bounded by the timeouts of the collectives
/// still in flight (see the module docs for the exceptions).
///
/// # Errors
/// `f`'s error; a `stream` not on a device's primary context.
pub fn scope<'env, F, R>(stream: &Arc<CudaStream>, f: F) -> Result<R>
where
    F: for<'scope> FnOnce(&'scope CudaScope<'scope, 'env>) -> Result<R>,
{
    let device = device_of(stream)?;
    let declared = stream::use_stream(device, stream.clone())?;
    let s = CudaScope {
        stream: stream.clone(),
        device,
        views: Mutex::new(Vec::new()),
        buffer_streams: Mutex::new(Vec::new()),
        uses: ManuallyDrop::new(Mutex::new(Vec::new())),
        scope: PhantomData,
        env: PhantomData,
        one_thread: PhantomData,
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&s)));
    s.end();
    drop(declared);
    join_after_scope(device, stream);
    match result {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// The thread's current stream on `device` after a scope waits for the scope's `stream` (on
/// the device; on the host where that fails).
fn join_after_scope(device: Device, stream: &Arc<CudaStream>) {
    let joined = stream::current_stream(device).and_then(|current| {
        if current.cu_stream() == stream.cu_stream() {
            return Ok(());
        }
        current
            .join(stream)
            .map_err(|e| crate::device::driver_error("cuStreamWaitEvent", e))
    });
    if let Err(e) = joined {
        log::warn!("c10d-nccl: ordering after a caller_memory scope on the device failed ({e}); waiting on the host");
        let _ = stream.synchronize();
    }
}

impl<'scope> CudaScope<'scope, '_> {
    /// The scope's stream: what its collectives are ordered after.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A 1-D tensor over `buf` (a `CudaSlice<T>` or `CudaViewMut<T>`), read and written in
    /// place by collectives.
    ///
    /// # Errors
    /// A buffer on another device than the scope's stream.
    pub fn view_mut<T: NcclElement>(
        &'scope self,
        buf: &'scope mut impl DevicePtrMut<T>,
    ) -> Result<TensorView<'scope>> {
        let n = buf.len();
        self.view_mut_shaped(buf, &[n])
    }

    /// As [`CudaScope::view_mut`], with a shape (row-major).
    ///
    /// # Errors
    /// As [`CudaScope::view_mut`]; a shape that does not hold `buf.len()` elements.
    pub fn view_mut_shaped<T: NcclElement>(
        &'scope self,
        buf: &'scope mut impl DevicePtrMut<T>,
        shape: &[usize],
    ) -> Result<TensorView<'scope>> {
        self.check(buf.stream(), buf.len(), shape)?;
        self.join_buffer_stream(buf.stream())?;
        let len = buf.len();
        let (ptr, used) = buf.device_ptr_mut(&self.stream);
        self.lock_uses().push(used);
        self.adopt::<T>(ptr, len, shape, true)
    }

    /// A read-only 1-D tensor over `buf` (a `CudaSlice<T>` or `CudaView<T>`): inputs of
    /// collectives; an op that would write it fails.
    ///
    /// # Errors
    /// As [`CudaScope::view_mut`].
    pub fn view<T: NcclElement>(
        &'scope self,
        buf: &'scope impl DevicePtr<T>,
    ) -> Result<TensorView<'scope>> {
        self.view_shaped(buf, &[buf.len()])
    }

    /// As [`CudaScope::view`], with a shape (row-major).
    ///
    /// # Errors
    /// As [`CudaScope::view_mut_shaped`].
    pub fn view_shaped<T: NcclElement>(
        &'scope self,
        buf: &'scope impl DevicePtr<T>,
        shape: &[usize],
    ) -> Result<TensorView<'scope>> {
        self.check(buf.stream(), buf.len(), shape)?;
        self.join_buffer_stream(buf.stream())?;
        let (ptr, used) = buf.device_ptr(&self.stream);
        self.lock_uses().push(used);
        self.adopt::<T>(ptr, buf.len(), shape, false)
    }

    fn check(&self, owner: &CudaStream, len: usize, shape: &[usize]) -> Result<()> {
        let on = Device::Cuda(owner.context().ordinal() as u32);
        if on != self.device || owner.context().cu_ctx() != self.stream.context().cu_ctx() {
            return Err(DistError::invalid(format!(
                "a buffer on {on} in a scope on {}: a scope's buffers are on its stream's device, \
                 in its primary context",
                self.device
            )));
        }
        if shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(len) {
            return Err(DistError::invalid(format!(
                "shape {shape:?} does not hold the buffer's {len} elements"
            )));
        }
        Ok(())
    }

    fn adopt<T: NcclElement>(
        &'scope self,
        ptr: sys::CUdeviceptr,
        len: usize,
        shape: &[usize],
        writable: bool,
    ) -> Result<TensorView<'scope>> {
        let storage = Arc::new(CallerMemory {
            device: self.device,
            ptr,
            nbytes: len * std::mem::size_of::<T>(),
            stream: self.stream.clone(),
            last_stream: AtomicU64::new(0),
            lent: Some(Lent {
                thread: std::thread::current().id(),
                ends: Mutex::new(Vec::new()),
                given_back: AtomicBool::new(false),
                writable,
            }),
            _owner: Mutex::new(Box::new(())),
        });
        let t = if writable {
            Tensor::from_device_storage(storage, T::DTYPE, shape)?
        } else {
            Tensor::from_read_only_device_storage(storage, T::DTYPE, shape)?
        };
        self.views
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t.clone());
        // SAFETY: the buffer is borrowed for 'scope (mutably for a writable view, so nobody
        // else touches it; shared for a read-only one, which the engine only reads); `end`
        // revokes the tensor before `scope` returns, i.e. before that borrow ends.
        Ok(unsafe { TensorView::new_unchecked(t) })
    }

    fn lock_uses(&self) -> std::sync::MutexGuard<'_, Vec<SyncOnDrop<'scope>>> {
        self.uses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Orders the scope's stream after the work queued on a buffer's own stream, when that is
    /// another stream (without relying on cudarc's event tracking, which is off in a context
    /// that only ever used one stream, as candle's default device does); `end` joins back.
    fn join_buffer_stream(&self, own: &Arc<CudaStream>) -> Result<()> {
        if own.cu_stream() == self.stream.cu_stream() {
            return Ok(());
        }
        self.stream
            .join(own)
            .map_err(|e| crate::device::driver_error("cuStreamWaitEvent", e))?;
        let mut streams = self
            .buffer_streams
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !streams.iter().any(|s| s.cu_stream() == own.cu_stream()) {
            streams.push(own.clone());
        }
        Ok(())
    }

    /// Ends the scope: waits until no collective holds a view (each op was waited on, or has
    /// finished or failed), makes the scope's stream wait for every op that used a view
    /// (whichever stream waited on its `Work`), cuts the views off, makes the buffers' own
    /// streams wait for the scope's, and records the buffers' use for cudarc's event tracking.
    /// A stream that cannot be made to wait is replaced by a host wait.
    fn end(&self) {
        let views = std::mem::take(&mut *self.views.lock().unwrap_or_else(|e| e.into_inner()));
        views.iter().for_each(Tensor::revoke);
        // A capture begun inside the scope turns the waits below into graph dependencies; a
        // host synchronisation would invalidate it, so none is attempted then.
        let capturing = crate::capture::is_capturing(&self.stream).unwrap_or(true);
        for l in views.iter().filter_map(lent) {
            l.given_back.store(true, Ordering::Release);
            let ends = std::mem::take(&mut *l.ends.lock().unwrap_or_else(|e| e.into_inner()));
            for end in ends {
                if self.stream.wait(&end).is_err() && !capturing {
                    let _ = end.synchronize();
                }
            }
        }
        let streams = std::mem::take(
            &mut *self
                .buffer_streams
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for own in streams {
            if own.join(&self.stream).is_err() && !capturing {
                let _ = self.stream.synchronize();
            }
        }
        drop(std::mem::take(&mut *self.lock_uses()));
    }
}
