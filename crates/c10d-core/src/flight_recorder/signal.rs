//! Dump on a signal: a handler thread (signal-hook's iterator, so nothing runs inside the
//! signal handler itself) writes the global recorder's dump each time the signal arrives.

use super::FlightRecorder;
use crate::error::{DistError, Result};
use std::sync::{Arc, Mutex};

/// Signals a handler is installed for (installing twice is a no-op).
static INSTALLED: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Installs a handler that writes `recorder`'s dump whenever `signal` is delivered.
pub(crate) fn install(recorder: Arc<FlightRecorder>, signal: i32) -> Result<()> {
    let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if installed.contains(&signal) {
        return Ok(());
    }
    // signal-hook panics on these (SIGKILL, SIGSTOP, SIGSEGV, SIGILL, SIGFPE).
    if signal_hook::consts::FORBIDDEN.contains(&signal) || signal <= 0 {
        return Err(DistError::invalid(format!(
            "flight recorder: signal {signal} cannot be handled (use SIGUSR1 or SIGUSR2)"
        )));
    }
    let mut signals = signal_hook::iterator::Signals::new([signal]).map_err(|e| {
        DistError::invalid(format!(
            "flight recorder: cannot handle signal {signal} for dumps: {e}"
        ))
    })?;
    std::thread::Builder::new()
        .name("c10d-fr-signal".into())
        .spawn(move || {
            for _ in signals.forever() {
                match recorder.dump_to_file() {
                    Ok(p) => eprintln!("[c10d flight recorder] dump written to {}", p.display()),
                    Err(e) => eprintln!("[c10d flight recorder] could not write the dump: {e}"),
                }
            }
        })
        .map_err(|e| {
            DistError::dist(format!("flight recorder: cannot start signal thread: {e}"))
        })?;
    installed.push(signal);
    Ok(())
}
