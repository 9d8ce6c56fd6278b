//! One local worker process: its ranks, its process, how it ended and what c10drun sent it.

use crate::report::Tail;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Instant;

/// One local worker process.
pub(crate) struct Worker {
    pub(crate) rank: usize,
    pub(crate) local_rank: usize,
    pub(crate) pid: i32,
    pub(crate) status: Option<ExitStatus>,
    pub(crate) ended_at: Option<Instant>,
    /// The signals c10drun sent to it.
    pub(crate) sent: Vec<i32>,
    pub(crate) error_file: PathBuf,
    pub(crate) tail: Tail,
}

impl Worker {
    /// Ended by a signal that c10drun itself sent (a casualty, not a failure).
    pub(crate) fn stopped_by_us(&self) -> bool {
        matches!(self.status.and_then(|s| s.signal()), Some(sig) if self.sent.contains(&sig))
    }
    /// Ended unsuccessfully on its own.
    pub(crate) fn failed(&self) -> bool {
        matches!(self.status, Some(s) if !s.success()) && !self.stopped_by_us()
    }

    /// Sends `sig` to its process group (unless it already ended) and remembers it.
    pub(crate) fn signal(&mut self, sig: i32) {
        if self.status.is_some() {
            return;
        }
        // SAFETY: plain syscall. Each worker leads its own process group (pgid = pid) so the
        // signal also reaches the processes it started; the group exists until we reap the
        // leader, which happens only after `status` is set (checked above).
        unsafe {
            libc::kill(-self.pid, sig);
        }
        self.sent.push(sig);
    }
}
