//! CUDA graph capture, as PyTorch's `ProcessGroupNCCL` handles it (`torch.cuda.graph` around
//! `dist.all_reduce`): an op issued while the caller's stream is capturing is recorded into the
//! graph and nothing else happens on the host, so it can be replayed any number of times.
//! - [`is_capturing`] asks the caller's stream (`cuStreamIsCapturing`);
//! - a captured op allocates nothing (list forms that would need a flat buffer are refused,
//!   and no communicator is made during a capture) and is not handed to the watchdog (there is
//!   nothing to watch until the graph is launched): the caller's stream joins the NCCL stream
//!   at once (the capture needs the join before it ends), the end event goes back to the pool,
//!   and its `Work` is complete (the flight recorder shows it completed);
//! - the watchdog thread queries events in the thread-local capture mode
//!   ([`relax_capture_mode_for_this_thread`]), so its `cuEventQuery` on other ops does not
//!   invalidate another thread's capture (a query during a global-mode capture fails it, and
//!   PyTorch's default error handling then ends the process).

use crate::device::driver_error;
use c10d_core::Result;
use cudarc::driver::{result, sys, CudaStream};

/// True while `stream` is capturing a CUDA graph.
///
/// # Errors
/// The driver's error (an invalidated capture included).
pub fn is_capturing(stream: &CudaStream) -> Result<bool> {
    // SAFETY: a live stream of a live context.
    let status = unsafe { result::stream::is_capturing(stream.cu_stream()) }
        .map_err(|e| driver_error("cuStreamIsCapturing", e))?;
    match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(false),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(true),
        _ => Err(c10d_core::DistError::backend(
            "ProcessGroupNCCL: the caller's stream is in an invalidated CUDA graph capture",
        )),
    }
}

/// Puts the calling thread in the thread-local capture mode (`cudaStreamCaptureModeThreadLocal`,
/// as PyTorch's watchdog does): its own calls are then restricted only by captures it started
/// itself, never by another thread's.
///
/// # Errors
/// The driver's error.
pub fn relax_capture_mode_for_this_thread() -> Result<()> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // SAFETY: `mode` is a valid, writable capture mode; the call only changes this thread's mode.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }
        .result()
        .map_err(|e| driver_error("cuThreadExchangeStreamCaptureMode", e))
}
