//! A backend's handle on the recorder for one process group, and the trace of one op.

use super::clock::now_ms;
use super::entry::{is_p2p, GroupInfo, Head, NO_PEER};
use super::hold::{defer_dump, HeldDump};
use super::ring::Place;
use super::shapes::Packing;
use super::FlightRecorder;
use crate::error::DistError;
use crate::op_type::OpType;
use crate::tensor::Tensor;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What a backend tells the recorder about an op it was given (mirrors the arguments of
/// PyTorch's `FlightRecorder::record`).
///
/// Sequence numbers are PyTorch's, 1-based: `collective_seq_id` counts the group's collectives
/// (a send/recv carries the count so far), `p2p_seq_id` its sends and receives (a collective
/// carries the count so far), `op_id` both.
#[derive(Debug, Clone, Copy)]
pub struct OpRecord<'a> {
    /// The op (`Send`, `Recv`, `RecvAnysource` are point-to-point).
    pub op: OpType,
    /// Index among the group's collectives, from 1.
    pub collective_seq_id: u64,
    /// Index among the group's sends and receives, from 1.
    pub p2p_seq_id: u64,
    /// Index among all ops of the group, from 1.
    pub op_id: u64,
    /// Group rank of the other side of a send/recv (`None`: any source, or a collective).
    pub peer: Option<usize>,
    /// The op's input tensors as PyTorch records them (in-place ops: the tensors).
    pub inputs: &'a [Tensor],
    /// The op's output tensors as PyTorch records them (in-place ops: the tensors).
    pub outputs: &'a [Tensor],
    /// The op's timeout.
    pub timeout: Duration,
}

/// `pg_status` of a dump: PyTorch's `ProcessGroupStatus` (collective sequence ids, -1 = none).
#[derive(Debug)]
pub(crate) struct GroupStatus {
    pub last_enqueued: AtomicI64,
    pub last_started: AtomicI64,
    pub last_completed: AtomicI64,
}

impl GroupStatus {
    /// Collective `seq` was recorded. Ops recorded late (see [`GroupRecorder::record_at`]) can
    /// be recorded after later ones: the value only grows (a load and a store, no atomic
    /// read-modify-write: two threads recording into one group at the same instant may leave
    /// the smaller of their two, until the group's next op).
    #[inline]
    fn enqueued(&self, seq: i64) {
        if seq > self.last_enqueued.load(Ordering::Relaxed) {
            self.last_enqueued.store(seq, Ordering::Relaxed);
        }
    }
}

impl Default for GroupStatus {
    fn default() -> Self {
        GroupStatus {
            last_enqueued: AtomicI64::new(-1),
            last_started: AtomicI64::new(-1),
            last_completed: AtomicI64::new(-1),
        }
    }
}

/// What the [`Trace`]s of a group's ops need of it, allocated once per registered group and
/// never freed (about 200 bytes; PyTorch keeps every group's `pg_config` for the life of the
/// process too), so that a trace refers to it without a reference count: cloning and dropping
/// an `Arc` per op cost two contended atomic operations, a third of the recorder's time.
#[derive(Debug)]
pub(crate) struct GroupCore {
    /// Reached only on slow paths (a failure, a send/recv): the recorder may be gone by then.
    recorder: Weak<FlightRecorder>,
    pub status: GroupStatus,
    /// The last op that ended failed (a run of failures dumps once).
    failing: AtomicBool,
    /// Set by [`GroupRecorder::set_shutting_down`]: failures no longer dump.
    shutting_down: AtomicBool,
}

impl GroupCore {
    /// A new group's core, leaked (see the type's documentation).
    pub fn leak(recorder: &Arc<FlightRecorder>) -> &'static GroupCore {
        Box::leak(Box::new(GroupCore {
            recorder: Arc::downgrade(recorder),
            status: GroupStatus::default(),
            failing: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
        }))
    }

    /// An op of this group completed: a later failure starts a new run of failures.
    #[inline]
    fn succeeded(&self) {
        // Loads first, so that the common case (a success after a success) writes nothing.
        if self.failing.load(Ordering::Relaxed) {
            self.failing.store(false, Ordering::Relaxed);
        }
    }

    /// An op of this group failed; writes the dump at the first failure of a run (when the
    /// thread holds dumps, once the hold ends: see `hold`).
    fn failed(&'static self) {
        // A swap, so that of two ops failing at once on two threads only one sees the run's
        // first failure.
        let first_failure = !self.failing.swap(true, Ordering::Relaxed);
        if !first_failure || self.shutting_down.load(Ordering::Relaxed) || defer_dump(self) {
            return;
        }
        self.write_dump();
    }

    /// Writes the recorder's dump, when the recorder still exists and dumps on failure.
    pub(super) fn write_dump(&self) {
        let Some(fr) = self.recorder.upgrade() else {
            return;
        };
        if fr.dump_on_failure() {
            if let Err(e) = fr.dump_to_file() {
                eprintln!("[c10d flight recorder] could not write the dump: {e}");
            }
        }
    }
}

impl HeldDump for GroupCore {
    fn write_dump(&self) {
        GroupCore::write_dump(self);
    }
}

/// One process group's handle on a [`FlightRecorder`], made by
/// [`FlightRecorder::register_group`]. Backends call [`GroupRecorder::record`] when an op is
/// submitted (or [`GroupRecorder::record_at`] later, with the time it was submitted) and keep
/// the returned [`Trace`] with the op (see `WorkCompleter::set_trace`).
#[derive(Debug)]
pub struct GroupRecorder {
    pub(crate) recorder: Arc<FlightRecorder>,
    pub(crate) info: Arc<GroupInfo>,
    pub(crate) core: &'static GroupCore,
    /// `info.pg_id` as entries hold it.
    pg_id32: u32,
}

impl Drop for GroupRecorder {
    fn drop(&mut self) {
        self.set_shutting_down();
    }
}

impl GroupRecorder {
    pub(crate) fn new(
        recorder: Arc<FlightRecorder>,
        info: Arc<GroupInfo>,
        core: &'static GroupCore,
    ) -> Self {
        GroupRecorder {
            pg_id32: saturate(info.pg_id),
            recorder,
            info,
            core,
        }
    }

    /// The recorder this group records into.
    pub fn recorder(&self) -> &Arc<FlightRecorder> {
        &self.recorder
    }

    /// The group's id in dumps (`pg_id`): its registration index in this process.
    pub fn pg_id(&self) -> u64 {
        self.info.pg_id
    }

    /// Records a newly submitted op in state "scheduled" into the calling thread's ring, created
    /// now. `None` while recording is off (or, exceptionally, when the thread is ending or its
    /// ring cannot be allocated).
    pub fn record(&self, op: &OpRecord<'_>) -> Option<Trace> {
        self.record_at(op, None)
    }

    /// The time now as an op's creation time ([`GroupRecorder::record_at`]); `None` while
    /// recording is off (the clock is not read).
    #[inline]
    pub fn stamp(&self) -> Option<Stamp> {
        self.recorder.is_enabled().then(|| Stamp(now_ms()))
    }

    /// As [`GroupRecorder::record`], for an op submitted at `created` (`None`: now). A backend
    /// that records an op later than it was submitted (c10d-gloo records a collective it runs
    /// at once at its first wait for a peer) passes the stamp taken at submission, so that the
    /// entry's creation time is the submission's, and so is its order among other threads'
    /// entries, to the millisecond (entries of one millisecond are ordered by thread).
    /// The thread must record nothing else between the stamp and this call (a thread's entries
    /// are merged in the order it recorded them).
    pub fn record_at(&self, op: &OpRecord<'_>, created: Option<Stamp>) -> Option<Trace> {
        if !self.recorder.is_enabled() {
            return None;
        }
        let ring = self.recorder.rings.mine()?;
        let head = Head {
            created_ms: created.map_or_else(now_ms, |s| s.0),
            collective_seq_id: op.collective_seq_id,
            op_id: op.op_id,
            p2p_seq_id: saturate(op.p2p_seq_id),
            pg_id: self.pg_id32,
            timeout_ms: millis(op.timeout),
            peer: op.peer.map_or(NO_PEER, |p| saturate(p as u64)),
            op: op.op,
            thread: 0, // the ring's owner
        };
        let place = ring.push(&head, &Packing::of(op.inputs, op.outputs));
        let collective = if is_p2p(op.op) {
            P2P
        } else {
            let seq = op.collective_seq_id as i64;
            self.core.status.enqueued(seq);
            seq
        };
        Some(Trace {
            group: self.core,
            place,
            collective,
        })
    }

    /// Marks the group as going away on purpose (abort, shutdown): ops that fail from now on
    /// do not write a dump, and the group is unregistered (see
    /// [`FlightRecorder::register_group`]); dropping the handle unregisters it too.
    pub fn set_shutting_down(&self) {
        if !self.core.shutting_down.swap(true, Ordering::Relaxed) {
            self.recorder.unregister_group(self.info.pg_id);
        }
    }
}

/// The recorder's handle on one recorded op: the backend reports when the op starts and
/// how it ended, from any thread.
#[derive(Debug)]
pub struct Trace {
    group: &'static GroupCore,
    /// The entry.
    place: Place,
    /// The collective sequence id (for `pg_status`); `P2P` for send/recv.
    collective: i64,
}

/// `Trace::collective` of a send or receive.
const P2P: i64 = -1;

impl Trace {
    /// The op started running on this rank (state "started").
    pub fn started(&self) {
        self.place.mark_started(now_ms());
        if self.collective != P2P {
            let seq = self.collective;
            self.group.status.last_started.store(seq, Ordering::Relaxed);
        }
    }

    /// The op ended: `Ok` → state "completed"; `Err` → the entry keeps its state (scheduled
    /// or started, as PyTorch shows a timed-out op), is retired and carries the error. At the
    /// first failure after a success the recorder writes its dump (when dumping on failure is
    /// on, see [`super::FrConfig::dump_on_failure`]) before this returns.
    pub fn finished(self, result: std::result::Result<(), &DistError>) {
        match result {
            Ok(()) => self.completed(),
            Err(e) => self.failed(e),
        }
    }

    #[inline]
    fn completed(self) {
        self.place.mark_ended(now_ms(), None);
        if self.collective != P2P {
            let seq = self.collective;
            self.group
                .status
                .last_completed
                .store(seq, Ordering::Relaxed);
        }
        self.group.succeeded();
    }

    #[cold]
    #[inline(never)]
    fn failed(self, error: &DistError) {
        self.place.mark_ended(now_ms(), Some(error.message()));
        self.group.failed();
    }
}

/// When an op was submitted, for an entry recorded later ([`GroupRecorder::stamp`]): the
/// recorder's clock (coarse monotonic milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp(u64);

/// `d` in whole milliseconds as a u32, capped as [`saturate`] caps (`Duration::as_millis`
/// computes in 128 bits).
fn millis(d: Duration) -> u32 {
    let ms = (d.as_secs().saturating_mul(1000)).saturating_add(d.subsec_millis() as u64);
    saturate(ms)
}

/// `v` as a u32, `u32::MAX - 1` when larger (a count or millisecond timeout that large is
/// shown capped; `u32::MAX` marks "no peer").
fn saturate(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX - 1).min(u32::MAX - 1)
}
