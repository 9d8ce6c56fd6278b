//! A backend's handle on the recorder for one process group, and the trace of one op.

use super::entry::{current_thread, is_p2p, now_ns, GroupInfo, NO_PEER};
use super::handoff::Handoff;
use super::FlightRecorder;
use crate::error::DistError;
use crate::tensor::Tensor;
use crate::work::OpType;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
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
    /// `record_id + 1` of the collective running now (0: none) and since when: a group runs
    /// one collective at a time, so its start is kept here, without taking the ring's lock,
    /// until it ends (send/recv, which overlap, go through the ring). A backend that ran
    /// several collectives of one group at once would lose the start times of all but the
    /// latest (those show their completion time as start).
    pub running: AtomicU64,
    pub running_since: AtomicU64,
    /// A successful op's times waiting to be written into the ring (see `handoff`).
    pub done: Handoff,
}

impl GroupStatus {
    /// When the entry `record_id` started, if it is the collective running now.
    pub fn started_at(&self, record_id: u64) -> Option<u64> {
        (self.running.load(Ordering::Acquire) == record_id + 1)
            .then(|| self.running_since.load(Ordering::Relaxed))
    }
}

impl Default for GroupStatus {
    fn default() -> Self {
        GroupStatus {
            last_enqueued: AtomicI64::new(-1),
            last_started: AtomicI64::new(-1),
            last_completed: AtomicI64::new(-1),
            running: AtomicU64::new(0),
            running_since: AtomicU64::new(0),
            done: Handoff::default(),
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

    /// Runs `f` on entry `id` of the ring, under its lock, if the recorder still exists.
    fn update(&self, id: u64, f: impl FnOnce(&mut super::entry::Entry)) {
        if let Some(fr) = self.recorder.upgrade() {
            fr.update(id, f);
        }
    }

    /// Called when an op of this group ended; writes the dump at the first failure of a run.
    fn ended(&self, failed: bool) {
        // A failure swaps, so that of two ops failing at once on two threads only one sees the
        // run's first failure; a success loads first, so the common case (a success after a
        // success) writes nothing.
        let first_failure = if failed {
            !self.failing.swap(true, Ordering::Relaxed)
        } else {
            if self.failing.load(Ordering::Relaxed) {
                self.failing.store(false, Ordering::Relaxed);
            }
            false
        };
        if !first_failure || self.shutting_down.load(Ordering::Relaxed) {
            return;
        }
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

/// One process group's handle on a [`FlightRecorder`], made by
/// [`FlightRecorder::register_group`]. Backends call [`GroupRecorder::record`] when an op is
/// submitted and keep the returned [`Trace`] with the op (see `WorkCompleter::set_trace`).
#[derive(Debug)]
pub struct GroupRecorder {
    pub(crate) recorder: Arc<FlightRecorder>,
    pub(crate) info: Arc<GroupInfo>,
    pub(crate) core: &'static GroupCore,
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

    /// Records a newly submitted op in state "scheduled". `None` while recording is off.
    pub fn record(&self, op: &OpRecord<'_>) -> Option<Trace> {
        if !self.recorder.is_enabled() {
            return None;
        }
        let (time_created_ns, thread) = (now_ns(), current_thread());
        let pg_id = saturate(self.info.pg_id);
        let status = &self.core.status;
        let record_id = self.recorder.push(status, |e| {
            e.time_created_ns = time_created_ns;
            e.time_started_ns = 0;
            e.time_completed_ns = 0;
            e.collective_seq_id = op.collective_seq_id;
            e.op_id = op.op_id;
            e.p2p_seq_id = saturate(op.p2p_seq_id);
            e.pg_id = pg_id;
            e.timeout_ms = saturate(op.timeout.as_millis() as u64);
            e.thread = thread;
            e.peer = op.peer.map_or(NO_PEER, |p| saturate(p as u64));
            e.op = op.op;
            e.retired = false;
            e.error = None;
            e.shapes.set(op.inputs, op.outputs);
        });
        let collective = (!is_p2p(op.op)).then_some(op.collective_seq_id as i64);
        if let Some(seq) = collective {
            status.last_enqueued.store(seq, Ordering::Relaxed);
        }
        Some(Trace {
            group: self.core,
            record_id,
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
/// how it ended.
#[derive(Debug)]
pub struct Trace {
    group: &'static GroupCore,
    record_id: u64,
    /// The collective sequence id (for `pg_status`); `None` for send/recv.
    collective: Option<i64>,
}

impl Trace {
    /// The entry's `record_id`.
    pub fn record_id(&self) -> u64 {
        self.record_id
    }

    /// The op started running on this rank (state "started").
    pub fn started(&self) {
        let t = now_ns();
        let status = &self.group.status;
        match self.collective {
            Some(seq) => {
                status.running_since.store(t, Ordering::Relaxed);
                status.running.store(self.record_id + 1, Ordering::Release);
                status.last_started.store(seq, Ordering::Relaxed);
            }
            None => self.group.update(self.record_id, |e| {
                if e.time_started_ns == 0 {
                    e.time_started_ns = t;
                }
            }),
        }
    }

    /// The op ended: `Ok` → state "completed"; `Err` → the entry keeps its state (scheduled
    /// or started, as PyTorch shows a timed-out op), is retired and carries the error. At the
    /// first failure after a success the recorder writes its dump (when dumping on failure is
    /// on, see [`super::FrConfig::dump_on_failure`]) before this returns.
    pub fn finished(self, result: std::result::Result<(), &DistError>) {
        let t = now_ns();
        let status = &self.group.status;
        let since = status.started_at(self.record_id);
        let handed_off = result.is_ok() && status.done.offer(self.record_id, since.unwrap_or(0), t);
        // When handed off, the next op's `record` (or a dump) writes the times into the slot.
        if !handed_off {
            self.finish_in_ring(since, t, result);
        }
        if let (Some(seq), Ok(())) = (self.collective, result) {
            self.group
                .status
                .last_completed
                .store(seq, Ordering::Relaxed);
        }
        self.group.ended(result.is_err());
    }

    /// Writes the end of the op into its slot under the ring's lock (failures, and a success
    /// whose hand-off is still occupied).
    fn finish_in_ring(
        &self,
        since: Option<u64>,
        t: u64,
        result: std::result::Result<(), &DistError>,
    ) {
        self.group.update(self.record_id, |e| {
            e.retired = true;
            if let Some(s) = since {
                e.time_started_ns = s;
            }
            match result {
                Ok(()) => {
                    if e.time_started_ns == 0 {
                        e.time_started_ns = t;
                    }
                    e.time_completed_ns = t;
                }
                Err(err) => e.error = Some(Box::new(err.message().to_string())),
            }
        });
    }
}

/// `v` as a u32, `u32::MAX - 1` when larger (a count or millisecond timeout that large is
/// shown capped; `u32::MAX` marks "no peer").
fn saturate(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX - 1).min(u32::MAX - 1)
}
