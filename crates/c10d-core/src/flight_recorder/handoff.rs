//! The hand-off of a finished collective's times from the thread that completes it to the
//! thread that records the group's next op, so that a successful op never takes the ring's
//! lock when it completes.
//!
//! Measured (`perf annotate` of a 1 KiB all-reduce, 2 ranks): almost all the recorder's time
//! went to atomics on cache lines that the submitting and the completing thread take turns
//! owning (the ring's mutex, twice per op), not to writing the slot (the 2000-entry ring is
//! 256 KiB and stays in L2). With the hand-off the completing thread writes one line of its
//! group's status; the next [`super::GroupRecorder::record`], which holds the lock anyway,
//! and every dump copy the times into the slot ([`Handoff::take`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// `id` while the completing thread writes the times (only it moves `EMPTY` to `BUSY`).
const BUSY: u64 = u64::MAX;
/// No times waiting.
const EMPTY: u64 = 0;

/// One completion waiting to be written into the ring: `id` is `record_id + 1`, `EMPTY` or
/// `BUSY`; `started_ns` and `completed_ns` are written only between `EMPTY → BUSY` and the
/// publication of `id`, and read only by the holder of the ring's lock after seeing `id`.
#[derive(Debug, Default)]
pub(crate) struct Handoff {
    id: AtomicU64,
    started_ns: AtomicU64,
    completed_ns: AtomicU64,
}

impl Handoff {
    /// Leaves the times of the successful op `record_id`; false when an earlier completion
    /// still waits (the caller then writes the ring itself, under its lock).
    pub fn offer(&self, record_id: u64, started_ns: u64, completed_ns: u64) -> bool {
        let claimed = self
            .id
            .compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Relaxed);
        if claimed.is_err() {
            return false;
        }
        self.started_ns.store(started_ns, Ordering::Relaxed);
        self.completed_ns.store(completed_ns, Ordering::Relaxed);
        self.id.store(record_id + 1, Ordering::Release);
        true
    }

    /// Takes the waiting completion, if one is fully written: `(record_id, started_ns,
    /// completed_ns)`. Call with the ring's lock held (one taker at a time).
    pub fn take(&self) -> Option<(u64, u64, u64)> {
        let id = self.id.load(Ordering::Acquire);
        if id == EMPTY || id == BUSY {
            return None;
        }
        let times = (
            self.started_ns.load(Ordering::Relaxed),
            self.completed_ns.load(Ordering::Relaxed),
        );
        // Only takers move a published id back to EMPTY, and they hold the ring's lock.
        self.id.store(EMPTY, Ordering::Release);
        Some((id - 1, times.0, times.1))
    }
}
