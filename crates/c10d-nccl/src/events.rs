//! A per-communicator pool of CUDA events for the end of ops: an op takes one, and gives it
//! back when the watchdog has seen it complete, so the enqueue path does not pay for
//! `cuEventCreate` / `cuEventDestroy` on every op.

use crate::device::driver_error;
use c10d_core::Result;
use cudarc::driver::{CudaContext, CudaEvent};
use std::sync::{Arc, Mutex};

/// Most idle events kept.
const KEEP: usize = 256;

/// Idle events of one context.
pub(crate) struct EventPool {
    ctx: Arc<CudaContext>,
    idle: Mutex<Vec<CudaEvent>>,
}

impl EventPool {
    pub fn new(ctx: Arc<CudaContext>) -> EventPool {
        EventPool {
            ctx,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An event with no pending work (a fresh one when none is idle).
    ///
    /// # Errors
    /// `cuEventCreate`'s error.
    pub fn take(&self) -> Result<CudaEvent> {
        if let Some(e) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(e);
        }
        self.ctx
            .new_event(None)
            .map_err(|e| driver_error("cuEventCreate", e))
    }

    /// Gives back an event whose recorded work has completed.
    pub fn give(&self, event: CudaEvent) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < KEEP {
            idle.push(event);
        }
    }
}
