//! The caller's stream per device and thread, as `torch.cuda.current_stream()`, and the one
//! rule by which a collective is ordered against the caller's work.
//!
//! # The ordering rule
//! A collective on a device is ordered after the work queued on the calling thread's
//! **current stream** there when it is called (an event recorded there, waited on by the NCCL
//! stream; the host does not wait), and `Work::wait` makes the waiting thread's current stream
//! wait for the collective. The current stream is:
//! - **the stream the thread declared** ([`set_current_stream`], or [`use_stream`] for a scope,
//!   as `torch.cuda.set_stream` / `with torch.cuda.stream(s)`): a program whose kernels run on
//!   its own stream (cudarc's non-blocking streams, candle's device stream) declares it once
//!   per thread;
//! - else **the legacy default stream**, as in PyTorch, where it is the current stream until
//!   one is set. The legacy stream is implicitly ordered with blocking streams, but not with
//!   non-blocking ones: data produced on cudarc's or candle's streams (non-blocking) must come
//!   from a declared stream (or from the caller's memory of [`crate::caller_memory`], which is
//!   ordered after its own stream).
//!
//! Nothing here waits for the whole device: other groups' work in flight (a pipeline's
//! outstanding receive on another group) and other threads' graph captures are left alone.
//! `TORCH_NCCL_BLOCKING_WAIT=1`, a `wait_timeout` and `barrier` block the host as in PyTorch.
//!
//! Host copies of [`crate::memory`] tensors run on [`current_stream`] (the legacy default
//! stream when nothing was declared) and return when the bytes have arrived.

use crate::device;
use c10d_core::{Device, Result};
use cudarc::driver::CudaStream;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

thread_local! {
    static CURRENT: RefCell<HashMap<u32, Arc<CudaStream>>> = RefCell::new(HashMap::new());
    /// The legacy default stream per device, cached (every op asks for it).
    static DEFAULT: RefCell<HashMap<u32, Arc<CudaStream>>> = RefCell::new(HashMap::new());
}

/// The calling thread's current stream on `device`: the declared one, else the legacy default
/// stream.
///
/// # Errors
/// As [`device::context`].
pub fn current_stream(device: Device) -> Result<Arc<CudaStream>> {
    if let Some(s) = declared_stream(device)? {
        return Ok(s);
    }
    let i = device::ordinal(device)?;
    if let Some(s) = DEFAULT.with(|c| c.borrow().get(&i).cloned()) {
        return Ok(s);
    }
    let s = device::context(device)?.default_stream();
    DEFAULT.with(|c| c.borrow_mut().insert(i, s.clone()));
    Ok(s)
}

/// The stream the calling thread declared for `device` ([`set_current_stream`] /
/// [`use_stream`]), if any: what collectives are ordered after (see the module docs).
///
/// # Errors
/// A device that is not a CUDA device.
pub fn declared_stream(device: Device) -> Result<Option<Arc<CudaStream>>> {
    let i = device::ordinal(device)?;
    Ok(CURRENT.with(|c| c.borrow().get(&i).cloned()))
}

/// Makes `stream` the calling thread's current stream on `device` (`torch.cuda.set_stream`);
/// `None` goes back to the legacy default stream (nothing declared).
///
/// # Errors
/// A device that is not a CUDA device.
pub fn set_current_stream(device: Device, stream: Option<Arc<CudaStream>>) -> Result<()> {
    let i = device::ordinal(device)?;
    CURRENT.with(|c| match stream {
        Some(s) => c.borrow_mut().insert(i, s),
        None => c.borrow_mut().remove(&i),
    });
    Ok(())
}

/// Declares `stream` as the calling thread's stream on `device` until the guard is dropped,
/// which restores what was declared before (`with torch.cuda.stream(s):`).
///
/// # Errors
/// A device that is not a CUDA device.
pub fn use_stream(device: Device, stream: Arc<CudaStream>) -> Result<StreamGuard> {
    let before = declared_stream(device)?;
    set_current_stream(device, Some(stream))?;
    Ok(StreamGuard { device, before })
}

/// Restores the thread's previously declared stream when dropped ([`use_stream`]).
#[must_use = "the stream is declared only while the guard lives"]
pub struct StreamGuard {
    device: Device,
    before: Option<Arc<CudaStream>>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        // The device was a CUDA device when the guard was made.
        let _ = set_current_stream(self.device, self.before.take());
    }
}
