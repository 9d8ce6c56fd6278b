//! The signals c10drun handles (`--signals-to-handle`): a handler that records the last one
//! received, for the supervisor of the workers to forward and act on.

use std::sync::atomic::{AtomicI32, Ordering};

/// The signal received by c10drun (0 = none), set by the handler.
pub(crate) static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

/// Handlers for the signals c10drun forwards to its workers (`--signals-to-handle`).
pub(crate) fn install_signal_handlers(signals: &[i32]) {
    for &sig in signals {
        // SAFETY: `sigaction` with a zeroed struct, an empty mask and a handler that only performs
        // an atomic store (async-signal-safe). SA_RESTART keeps blocking reads in other threads
        // from failing with EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}
