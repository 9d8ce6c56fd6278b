//! The caller's memory as a [`DeviceStorage`]: device memory some other owner keeps alive
//! (a cudarc buffer lent by a `caller_memory::scope`, or a raw pointer given to
//! `caller_memory::from_raw_device`), with the rules a scope's views follow on every op, host
//! copy and device copy (see `crate::caller_memory` for the API).

use c10d_core::{Device, DeviceStorage, DistError, OpType, Result, Tensor};
use cudarc::driver::{sys, CudaEvent, CudaStream};
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Device memory some other owner keeps alive: a [`DeviceStorage`] that frees nothing.
pub(crate) struct CallerMemory {
    pub(crate) device: Device,
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) nbytes: usize,
    /// Where host copies run (the memory's stream).
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) last_stream: AtomicU64,
    /// Set for a view of a [`scope`]: memory lent until the scope ends.
    pub(crate) lent: Option<Lent>,
    /// Kept alive as long as the storage ([`from_raw_device`]'s `owner`).
    pub(crate) _owner: Mutex<Box<dyn Any + Send>>,
}

/// What a scope's view carries: where it may be used, and the end events of the ops that used
/// it, which the scope's stream waits for when the scope ends.
pub(crate) struct Lent {
    /// The scope's thread: ops and host copies on the view run there (the scope's stream may be
    /// a per-thread stream, which names another stream on another thread).
    pub(crate) thread: std::thread::ThreadId,
    pub(crate) ends: Mutex<Vec<Arc<CudaEvent>>>,
    /// Set when the scope gave the memory back: no op or host copy any more.
    pub(crate) given_back: AtomicBool,
    /// False for a shared borrow (`view`): never written, even through another tensor made
    /// over this storage.
    pub(crate) writable: bool,
}

/// The memory of a scope's view (its `lent` is set), if `t` is one.
pub(crate) fn lent_memory(t: &Tensor) -> Option<&CallerMemory> {
    t.device_storage()?
        .as_any()
        .downcast_ref::<CallerMemory>()
        .filter(|m| m.lent.is_some())
}

pub(crate) fn lent(t: &Tensor) -> Option<&Lent> {
    lent_memory(t)?.lent.as_ref()
}

/// Refuses an op that would use a scope's view where its borrow cannot be kept: inside a
/// coalesced block (launched at `end_coalescing`, possibly after the scope), during CUDA graph
/// capture (a replay would run after the scope), on another thread than the scope's, or with
/// another stream declared than the scope's (the op would not be ordered after the caller's
/// work, nor the scope's end after the op).
///
/// # Errors
/// [`DistError::InvalidArgument`] naming the op and the reason.
pub(crate) fn check_uses(
    kind: OpType,
    (inputs, outputs): (&[Tensor], &[Tensor]),
    in_block: bool,
    declared: Option<&CudaStream>,
    capturing: bool,
) -> Result<()> {
    let written = |l: &Lent| outputs.iter().filter_map(lent).any(|o| std::ptr::eq(o, l));
    for m in inputs.iter().chain(outputs).filter_map(lent_memory) {
        let Some(l) = &m.lent else { continue };
        let why = if l.given_back.load(Ordering::Acquire) {
            "is used after its scope gave the memory back"
        } else if !l.writable && written(l) {
            "borrowed read-only (`view`) is an op's output"
        } else if in_block {
            "cannot join a coalesced block (its ops launch at end_coalescing, which the scope may not outlive); use c10d_nccl::memory tensors in the block"
        } else if capturing {
            "cannot be captured in a CUDA graph (a replay would run after the scope gave the memory back); capture c10d_nccl::memory tensors"
        } else if l.thread != std::thread::current().id() {
            "is used on another thread than its scope's"
        } else if declared.map(|s| s.cu_stream()) != Some(m.stream.cu_stream()) {
            "is used with another stream declared than its scope's"
        } else {
            continue;
        };
        return Err(DistError::invalid(format!(
            "ProcessGroupNCCL::{kind}: a view of caller_memory::scope {why}"
        )));
    }
    Ok(())
}

/// Notes `end` (an op's end event) on every scope view among `tensors`: the scope's stream
/// waits for it when the scope ends, whichever stream waited on the op's `Work`.
pub(crate) fn note_end(tensors: &[Tensor], end: &Arc<CudaEvent>) {
    for l in tensors.iter().filter_map(lent) {
        l.ends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(end.clone());
    }
}

impl CallerMemory {
    /// Host copies of a scope's view: on its thread, before the scope ends.
    fn check_copy(&self, write: bool) -> Result<()> {
        let Some(l) = &self.lent else { return Ok(()) };
        if write && !l.writable {
            return Err(DistError::invalid(
                "tensor views memory borrowed read-only (caller_memory::scope's `view`): it cannot be written",
            ));
        }
        if l.given_back.load(Ordering::Acquire) {
            return Err(DistError::invalid(
                "tensor viewed borrowed memory that has been given back to its owner (its caller_memory::scope ended)",
            ));
        }
        if l.thread != std::thread::current().id() {
            return Err(DistError::invalid(
                "a view of caller_memory::scope is copied to or from the host on its scope's thread only",
            ));
        }
        // The copy runs on the scope's stream: after the ops on the view, even those whose
        // `Work` another stream waited on. Once waited for, they are dropped (the stream stays
        // ordered after them; the scope's end needs no more); kept if a wait failed.
        let mut ends = l.ends.lock().unwrap_or_else(|e| e.into_inner());
        for end in ends.iter() {
            self.stream
                .wait(end)
                .map_err(|e| crate::device::driver_error("cuStreamWaitEvent", e))?;
        }
        ends.clear();
        Ok(())
    }
}

impl DeviceStorage for CallerMemory {
    fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_copy(false)?;
        // SAFETY: `ptr` starts `nbytes` of device memory of the stream's context, valid while
        // this storage lives (the constructors' contracts).
        unsafe { super::copy_to_host(&self.stream, self.ptr, self.nbytes, offset, dst) }
    }
    fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_copy(true)?;
        // SAFETY: as in `copy_to_host`.
        unsafe { super::copy_from_host(&self.stream, self.ptr, self.nbytes, offset, src) }
    }
    super::device_copy::device_storage_methods!();
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// On-device copies of the caller's memory run on its stream (a scope's, for its views), under
/// the same checks as its host copies.
impl super::device_copy::OnDevice for CallerMemory {
    fn base(&self) -> sys::CUdeviceptr {
        self.ptr
    }
    fn copy_stream(&self, write: bool) -> Result<Option<Arc<CudaStream>>> {
        self.check_copy(write)?;
        if crate::capture::is_capturing(&self.stream)? {
            return Err(DistError::invalid(
                "a copy of the caller's memory (caller_memory) cannot be captured in a CUDA \
                 graph (a replay would run after the memory was given back); capture \
                 c10d_nccl::memory tensors",
            ));
        }
        Ok(Some(self.stream.clone()))
    }
    fn is_callers(&self) -> bool {
        true
    }
    fn note_use(&self, s: &Arc<CudaStream>, done: &Arc<CudaEvent>) -> Result<()> {
        if s.cu_stream() == self.stream.cu_stream() {
            return Ok(());
        }
        // Ordered on the device, or else on the host.
        self.stream
            .wait(done)
            .or_else(|_| done.synchronize())
            .map_err(|e| crate::device::driver_error("cuEventSynchronize", e))
    }
}
