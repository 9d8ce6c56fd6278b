//! One enqueued NCCL op as the watchdog sees it ([`InFlight`], a [`WorkProbe`] over its end
//! event and communicator), and the `Work::wait` PyTorch's `WorkNCCL` has: the caller's current
//! stream waits on the end event and the host goes on ([`stream_wait_hook`]).

use crate::comm::Communicator;
use crate::device::driver_error;
use crate::events::EventPool;
use crate::stream;
use crate::watchdog::WorkProbe;
use c10d_core::work::WaitHook;
use c10d_core::{Device, Result, Tensor, TensorLeases, WorkCompleter};
use cudarc::driver::CudaEvent;
use std::sync::{Arc, Mutex};

/// The leases an op holds on its tensors: given back when the caller's stream was made to wait
/// for the op (`Work::wait`) or when the op finished, whichever comes first.
pub(crate) type LeaseSlot = Arc<Mutex<Option<Vec<TensorLeases>>>>;

/// An op on the device: what completes its `Work` and what must live until it has finished.
pub(crate) struct InFlight {
    pub end: Arc<CudaEvent>,
    /// Where `end` goes back once the op completed.
    pub pool: Arc<EventPool>,
    pub comm: Arc<Communicator>,
    pub completer: Option<WorkCompleter>,
    pub leases: LeaseSlot,
    /// The tensors (and so their device memory) the kernels read and write.
    pub keep: Vec<Tensor>,
}

impl InFlight {
    /// Completes the work of an op that finished and releases what it held.
    pub fn finish(mut self) {
        // The leases go first: a waiter that wakes on the completion may use the tensors at
        // once (the simulator's delays showed `to_cpu` refused right after `wait`).
        self.leases.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.complete(Ok(()));
        drop(self.keep);
        if let Ok(end) = Arc::try_unwrap(self.end) {
            self.pool.give(end);
        }
    }

    /// Completes the work (its waiters hear `result` now) and keeps the op's memory and leases:
    /// for an op that failed while its kernels may still run, they go when dropped, once
    /// [`InFlight::kernels_done`].
    pub fn complete(&mut self, result: Result<()>) {
        if let Some(c) = self.completer.take() {
            // Also drops the wait hook and its handle on `end`.
            c.complete(result);
        }
    }

    /// True once no work of the op can touch its memory: its end event fired (after an abort
    /// it fires once NCCL's kernels have left, and after any copy queued on the NCCL stream),
    /// or it cannot be queried any more (the context is gone).
    pub fn kernels_done(&self) -> bool {
        self.end.try_is_complete().unwrap_or(true)
    }
}

impl WorkProbe for InFlight {
    fn is_completed(&mut self) -> bool {
        // A CUDA error is reported by `async_error`'s next poll through the communicator; an
        // event that cannot be queried is treated as not done, so the timeout still applies.
        // While the communicator's state is unknown (an abort under way, or another thread in
        // a long call) the op is not done either: an aborted kernel's end event fires too.
        self.comm.state_known() && self.end.try_is_complete().unwrap_or(false)
    }

    fn async_error(&mut self) -> Option<String> {
        if let Err(e) = self.end.try_is_complete() {
            return Some(driver_error("cuEventQuery", e).message().to_string());
        }
        self.comm.async_error()
    }
}

/// `WorkNCCL::wait` without blocking wait: the waiting thread's current stream on `device`
/// ([`crate::stream`]: its declared one, else the legacy default stream) waits for `end`, the
/// leases are given back, and the host returns at once. With `blocking` (or a timeout passed
/// to `wait_timeout`) the hook steps aside and the host blocks until the watchdog completes
/// the work.
pub(crate) fn stream_wait_hook(
    device: Device,
    end: Arc<CudaEvent>,
    leases: LeaseSlot,
    blocking: bool,
) -> WaitHook {
    Arc::new(move |timeout| {
        if blocking || timeout.is_some() {
            return None;
        }
        let current = match stream::current_stream(device) {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        let waited = current
            .wait(&end)
            .map_err(|e| driver_error("cuStreamWaitEvent", e));
        if waited.is_ok() {
            leases.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
        Some(waited)
    })
}
