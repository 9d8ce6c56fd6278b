//! A backend's handle on the recorder for one process group, and the trace of one op.

use super::entry::{current_thread, now_ns, Entry, GroupInfo, Progress, Shapes};
use super::FlightRecorder;
use crate::error::DistError;
use crate::tensor::Tensor;
use crate::work::OpType;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
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

impl Default for GroupStatus {
    fn default() -> Self {
        GroupStatus {
            last_enqueued: AtomicI64::new(-1),
            last_started: AtomicI64::new(-1),
            last_completed: AtomicI64::new(-1),
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
    pub(crate) status: Arc<GroupStatus>,
    /// The last op that ended failed (a run of failures dumps once).
    failing: AtomicBool,
    /// Set by [`GroupRecorder::set_shutting_down`]: failures no longer dump.
    shutting_down: AtomicBool,
}

impl GroupRecorder {
    pub(crate) fn new(
        recorder: Arc<FlightRecorder>,
        info: Arc<GroupInfo>,
        status: Arc<GroupStatus>,
    ) -> Self {
        GroupRecorder {
            recorder,
            info,
            status,
            failing: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
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
    pub fn record(self: &Arc<Self>, op: &OpRecord<'_>) -> Option<Trace> {
        if !self.recorder.is_enabled() {
            return None;
        }
        let (inputs, outputs) = (Shapes::of(op.inputs), Shapes::of(op.outputs));
        let entry = Entry {
            record_id: 0,
            pg_id: self.info.pg_id,
            collective_seq_id: op.collective_seq_id,
            p2p_seq_id: op.p2p_seq_id,
            op_id: op.op_id,
            op: op.op,
            peer: op.peer,
            inputs,
            outputs,
            time_created_ns: now_ns(),
            progress: Progress::Scheduled,
            timeout: op.timeout,
            retired: false,
            error: None,
            thread: current_thread(),
        };
        let collective = (!entry.is_p2p()).then_some(op.collective_seq_id as i64);
        let record_id = self.recorder.push(entry);
        if let Some(seq) = collective {
            self.status.last_enqueued.store(seq, Ordering::Relaxed);
        }
        Some(Trace {
            group: self.clone(),
            record_id,
            collective,
        })
    }

    /// Marks the group as going away on purpose (abort, shutdown): ops that fail from now on
    /// do not write a dump.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }

    /// Called when an op of this group ended; writes the dump at the first failure of a run.
    fn ended(&self, failed: bool) {
        let was_failing = self.failing.swap(failed, Ordering::Relaxed);
        if failed
            && !was_failing
            && !self.shutting_down.load(Ordering::Relaxed)
            && self.recorder.dump_on_failure()
        {
            if let Err(e) = self.recorder.dump_to_file() {
                eprintln!("[c10d flight recorder] could not write the dump: {e}");
            }
        }
    }
}

/// The recorder's handle on one recorded op: the backend reports when the op starts and
/// how it ended.
#[derive(Debug)]
pub struct Trace {
    group: Arc<GroupRecorder>,
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
        self.group.recorder.update(self.record_id, |e| {
            if e.progress == Progress::Scheduled {
                e.progress = Progress::Started(t);
            }
        });
        if let Some(seq) = self.collective {
            self.group.status.last_started.store(seq, Ordering::Relaxed);
        }
    }

    /// The op ended: `Ok` → state "completed"; `Err` → the entry keeps its state (scheduled
    /// or started, as PyTorch shows a timed-out op), is retired and carries the error. At the
    /// first failure after a success the recorder writes its dump (when dumping on failure is
    /// on, see [`super::FrConfig::dump_on_failure`]) before this returns.
    pub fn finished(self, result: std::result::Result<(), &DistError>) {
        let t = now_ns();
        self.group.recorder.update(self.record_id, |e| {
            e.retired = true;
            match result {
                Ok(()) => {
                    let started = match e.progress {
                        Progress::Started(s) => s,
                        _ => t,
                    };
                    e.progress = Progress::Completed {
                        started,
                        completed: t,
                    };
                }
                Err(err) => e.error = Some(err.message().to_string()),
            }
        });
        if let (Some(seq), Ok(())) = (self.collective, result) {
            self.group
                .status
                .last_completed
                .store(seq, Ordering::Relaxed);
        }
        self.group.ended(result.is_err());
    }
}
