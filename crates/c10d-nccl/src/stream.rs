//! The caller's current stream per device and thread, as `torch.cuda.current_stream()`: the
//! legacy default stream unless the thread set another. Collectives order themselves after the
//! work queued on it, and [`c10d_core::Work::wait`] makes it wait for the collective.

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

/// The calling thread's current stream on `device` (the legacy default stream unless
/// [`set_current_stream`] chose another).
///
/// # Errors
/// As [`device::context`].
pub fn current_stream(device: Device) -> Result<Arc<CudaStream>> {
    let i = device::ordinal(device)?;
    if let Some(s) = CURRENT.with(|c| c.borrow().get(&i).cloned()) {
        return Ok(s);
    }
    if let Some(s) = DEFAULT.with(|c| c.borrow().get(&i).cloned()) {
        return Ok(s);
    }
    let s = device::context(device)?.default_stream();
    DEFAULT.with(|c| c.borrow_mut().insert(i, s.clone()));
    Ok(s)
}

/// Makes `stream` the calling thread's current stream on its device (`torch.cuda.set_stream`);
/// `None` goes back to the legacy default stream.
///
/// # Errors
/// As [`device::context`].
pub fn set_current_stream(device: Device, stream: Option<Arc<CudaStream>>) -> Result<()> {
    let i = device::ordinal(device)?;
    CURRENT.with(|c| match stream {
        Some(s) => c.borrow_mut().insert(i, s),
        None => c.borrow_mut().remove(&i),
    });
    Ok(())
}
