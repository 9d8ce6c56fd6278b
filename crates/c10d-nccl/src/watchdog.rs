//! The watchdog's bookkeeping, as pure logic: the in-flight works of one group, each with its
//! start time and timeout, polled against a clock the caller passes in. The thread that calls
//! [`Watchdog::poll`] every few milliseconds, the CUDA events behind [`WorkProbe::is_completed`]
//! and the `ncclCommGetAsyncError` behind [`WorkProbe::async_error`] belong to the GPU backend;
//! everything decided here is testable with a fake clock and fake probes.
//!
//! Per poll, each work is checked in this order: an asynchronous NCCL error fails it; otherwise
//! a finished work completes (even if the poll comes after its deadline); otherwise a work that
//! has run for at least its timeout times out, with PyTorch's message
//! `"[PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught collective operation timeout:
//! WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for
//! 600001 milliseconds before timing out."`. What follows a timeout or error is
//! `TORCH_NCCL_ASYNC_ERROR_HANDLING`'s [`Response`]; when it aborts the communicators, every
//! other in-flight work of the group fails with an "aborted" error at once.

use crate::env::ErrorHandlingMode;
use c10d_core::{DistError, ErrorContext, OpType};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the watchdog asks of one in-flight work (implemented over CUDA events and the
/// communicator on a GPU; by fakes in tests).
pub trait WorkProbe {
    /// True once the work has finished on the device.
    fn is_completed(&mut self) -> bool;
    /// The asynchronous error of the communicator the work runs on, if NCCL reports one.
    fn async_error(&mut self) -> Option<String>;
}

/// What the watchdog knows of a work (PyTorch's `WorkNCCL` fields that its messages print).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRecord {
    /// The group's collective sequence number.
    pub seq: u64,
    /// The operation.
    pub op: OpType,
    /// Elements of the first input (-1 when not recorded, as PyTorch prints).
    pub numel_in: i64,
    /// Elements of the first output (-1 when not recorded).
    pub numel_out: i64,
    /// How long it may run.
    pub timeout: Duration,
    /// When it was enqueued.
    pub start: Instant,
}

impl WorkRecord {
    /// `WorkNCCL(SeqNum=…, OpType=…, NumelIn=…, NumelOut=…, Timeout(ms)=…)`.
    pub fn describe(&self) -> String {
        format!(
            "WorkNCCL(SeqNum={}, OpType={}, NumelIn={}, NumelOut={}, Timeout(ms)={})",
            self.seq,
            self.op.name(),
            self.numel_in,
            self.numel_out,
            self.timeout.as_millis()
        )
    }
}

/// Identifies the group in messages (PyTorch's log prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLabel {
    /// Process-local id of the backend instance ("PG ID").
    pub local_id: usize,
    /// Group name ("PG GUID").
    pub group_name: String,
    /// Group description, e.g. "default_pg" (omitted when empty or "undefined").
    pub group_desc: String,
    /// This process's rank in the group.
    pub rank: usize,
}

impl GroupLabel {
    /// `"[PG ID 0 PG GUID 0(default_pg) Rank 0] "`.
    pub fn log_prefix(&self) -> String {
        if self.group_desc.is_empty() || self.group_desc == "undefined" {
            format!(
                "[PG ID {} PG GUID {} Rank {}] ",
                self.local_id, self.group_name, self.rank
            )
        } else {
            format!(
                "[PG ID {} PG GUID {}({}) Rank {}] ",
                self.local_id, self.group_name, self.group_desc, self.rank
            )
        }
    }
}

/// How a work left the in-flight list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Finished on the device.
    Completed,
    /// Ran past its timeout.
    TimedOut {
        /// How long it had run at the poll.
        elapsed: Duration,
    },
    /// NCCL reported an asynchronous error on its communicator.
    Failed {
        /// NCCL's error text.
        error: String,
    },
    /// Its communicators were aborted because of another work's timeout or error.
    Aborted,
}

/// A work the poll removed, with the error to deliver to its waiters.
#[derive(Debug)]
pub struct Finished<W> {
    /// The record.
    pub record: WorkRecord,
    /// The probe, handed back (it owns the events and buffers to release).
    pub probe: W,
    /// Why it left.
    pub outcome: Outcome,
    /// `None` when completed; otherwise a [`DistError::Backend`] (`DistBackendError`).
    pub error: Option<DistError>,
}

/// What `TORCH_NCCL_ASYNC_ERROR_HANDLING` says to do after a timeout or error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// Abort the group's communicators (`ncclCommAbort`), which unblocks stuck ops.
    pub abort_communicators: bool,
    /// End the process (PyTorch aborts it so the launcher restarts the job).
    pub tear_down_process: bool,
}

impl Response {
    /// The response of a mode.
    pub const fn for_mode(mode: ErrorHandlingMode) -> Response {
        Response {
            abort_communicators: mode.should_clean_up(),
            tear_down_process: mode.should_tear_down(),
        }
    }
}

/// The result of one poll, each list in enqueue order.
#[derive(Debug)]
pub struct PollReport<W> {
    /// Works that finished.
    pub completed: Vec<Finished<W>>,
    /// Works that ran past their timeout.
    pub timed_out: Vec<Finished<W>>,
    /// Works whose communicator reported an error, or that were aborted with it.
    pub failed: Vec<Finished<W>>,
    /// Set when a timeout or error happened in this poll: what to do next.
    pub response: Option<Response>,
    /// The first timeout or error message of this poll (what PyTorch logs and raises).
    pub first_error: Option<String>,
}

impl<W> PollReport<W> {
    fn empty() -> Self {
        PollReport {
            completed: Vec::new(),
            timed_out: Vec::new(),
            failed: Vec::new(),
            response: None,
            first_error: None,
        }
    }
}

/// The in-flight works of one group and the rules applied to them.
#[derive(Debug)]
pub struct Watchdog<W> {
    label: GroupLabel,
    mode: ErrorHandlingMode,
    works: VecDeque<(WorkRecord, W)>,
    /// Set by [`Watchdog::set_ending`].
    ending: bool,
}

impl<W: WorkProbe> Watchdog<W> {
    /// An empty watchdog for a group.
    pub fn new(label: GroupLabel, mode: ErrorHandlingMode) -> Self {
        Watchdog {
            label,
            mode,
            works: VecDeque::new(),
            ending: false,
        }
    }

    /// The group is being shut down or aborted on purpose: from now on a failure still fails
    /// its work but calls for no response (no abort of the communicators, no end of the
    /// process), so an orderly `shutdown()` cannot end the process through its own abort.
    pub fn set_ending(&mut self) {
        self.ending = true;
    }

    /// The group label.
    pub fn label(&self) -> &GroupLabel {
        &self.label
    }

    /// The error-handling mode.
    pub fn mode(&self) -> ErrorHandlingMode {
        self.mode
    }

    /// Adds a work just enqueued on the device.
    pub fn enqueue(&mut self, record: WorkRecord, probe: W) {
        self.works.push_back((record, probe));
    }

    /// Number of works in flight.
    pub fn in_flight(&self) -> usize {
        self.works.len()
    }

    /// Records of the works in flight, in enqueue order.
    pub fn records(&self) -> impl Iterator<Item = &WorkRecord> {
        self.works.iter().map(|(r, _)| r)
    }

    /// Removes every in-flight work, handing each to `f` in enqueue order (an explicit abort
    /// fails them all at once).
    pub fn drain(&mut self, mut f: impl FnMut(WorkRecord, W)) {
        while let Some((r, w)) = self.works.pop_front() {
            f(r, w);
        }
    }

    /// Adds `extra` to the timeout of every in-flight work
    /// (`_add_ephemeral_timeout_for_all_pgs`).
    pub fn extend_timeouts(&mut self, extra: Duration) {
        for (r, _) in &mut self.works {
            r.timeout += extra;
        }
    }

    /// The timeout message of `record` after `elapsed`.
    pub fn timeout_message(&self, record: &WorkRecord, elapsed: Duration) -> String {
        format!(
            "{}Watchdog caught collective operation timeout: {} ran for {} milliseconds before timing out.",
            self.label.log_prefix(),
            record.describe(),
            elapsed.as_millis()
        )
    }

    /// What a program reads from the error of `record` ([`DistError::context`]): the group,
    /// this rank, the op and its sequence number (NCCL does not say which peer is at fault).
    fn context(&self, record: &WorkRecord) -> ErrorContext {
        ErrorContext::op(
            &self.label.group_name,
            self.label.rank,
            record.op,
            record.seq,
        )
    }

    fn error_message(&self, record: &WorkRecord, error: &str) -> String {
        format!(
            "{}Process group watchdog caught an NCCL error in {}: {}",
            self.label.log_prefix(),
            record.describe(),
            error
        )
    }

    /// Checks every in-flight work at time `now` and removes those that finished, timed out or
    /// failed. Never blocks; the probes are asked once each.
    pub fn poll(&mut self, now: Instant) -> PollReport<W> {
        let mut report = PollReport::empty();
        let mut keep = VecDeque::with_capacity(self.works.len());
        while let Some((record, mut probe)) = self.works.pop_front() {
            // An error wins over completion: an aborted kernel also ends, and its end event
            // fires, but its results are not to be trusted.
            if let Some(error) = probe.async_error() {
                let msg = self.error_message(&record, &error);
                report.first_error.get_or_insert_with(|| msg.clone());
                let e = DistError::backend(msg).with_context(self.context(&record));
                report.failed.push(Finished {
                    record,
                    probe,
                    outcome: Outcome::Failed { error },
                    error: Some(e),
                });
            } else if probe.is_completed() {
                report.completed.push(Finished {
                    record,
                    probe,
                    outcome: Outcome::Completed,
                    error: None,
                });
            } else {
                let elapsed = now.saturating_duration_since(record.start);
                if elapsed >= record.timeout {
                    let msg = self.timeout_message(&record, elapsed);
                    report.first_error.get_or_insert_with(|| msg.clone());
                    let e = DistError::backend(msg).with_context(self.context(&record));
                    report.timed_out.push(Finished {
                        record,
                        probe,
                        outcome: Outcome::TimedOut { elapsed },
                        error: Some(e),
                    });
                } else {
                    keep.push_back((record, probe));
                }
            }
        }
        self.works = keep;
        if self.ending {
            // Failures of a group being shut down or aborted on purpose call for nothing.
            return report;
        }
        if let Some(reason) = report.first_error.clone() {
            let response = Response::for_mode(self.mode);
            report.response = Some(response);
            if response.abort_communicators {
                let aborted = format!(
                    "NCCL communicator was aborted on rank {}. Original reason for failure was: {}",
                    self.label.rank, reason
                );
                while let Some((record, probe)) = self.works.pop_front() {
                    let e = DistError::backend(aborted.clone()).with_context(self.context(&record));
                    report.failed.push(Finished {
                        record,
                        probe,
                        outcome: Outcome::Aborted,
                        error: Some(e),
                    });
                }
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A fake work: completes when its shared flag is set, fails when given an error.
    #[derive(Debug, Clone)]
    struct Fake {
        done: Rc<Cell<bool>>,
        error: Rc<Cell<Option<&'static str>>>,
        id: u64,
    }

    impl Fake {
        fn new(id: u64) -> Fake {
            Fake {
                done: Rc::new(Cell::new(false)),
                error: Rc::new(Cell::new(None)),
                id,
            }
        }
    }

    impl WorkProbe for Fake {
        fn is_completed(&mut self) -> bool {
            self.done.get()
        }
        fn async_error(&mut self) -> Option<String> {
            self.error.get().map(str::to_string)
        }
    }

    fn label() -> GroupLabel {
        GroupLabel {
            local_id: 0,
            group_name: "0".into(),
            group_desc: "default_pg".into(),
            rank: 3,
        }
    }

    fn record(seq: u64, start: Instant, timeout_ms: u64) -> WorkRecord {
        WorkRecord {
            seq,
            op: OpType::Allreduce,
            numel_in: 8,
            numel_out: 8,
            timeout: Duration::from_millis(timeout_ms),
            start,
        }
    }

    #[test]
    fn timeout_message_is_pytorchs() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(label(), ErrorHandlingMode::TearDown);
        let f = Fake::new(1);
        w.enqueue(record(1, t0, 600_000), f);
        assert!(w
            .poll(t0 + Duration::from_millis(599_999))
            .timed_out
            .is_empty());
        let r = w.poll(t0 + Duration::from_millis(600_001));
        assert_eq!(r.timed_out.len(), 1);
        let msg = r.timed_out[0].error.as_ref().unwrap();
        assert_eq!(msg.kind(), c10d_core::ErrorKind::Backend);
        assert_eq!(
            msg.message(),
            "[PG ID 0 PG GUID 0(default_pg) Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600001 milliseconds before timing out."
        );
        let ctx = msg.context().expect("a timeout carries its op's context");
        assert_eq!(
            (ctx.group.as_deref(), ctx.rank, ctx.op, ctx.seq),
            (Some("0"), Some(3), Some(OpType::Allreduce), Some(1))
        );
        assert!(ctx.peers.is_empty(), "NCCL names no peer");
        assert_eq!(
            r.response,
            Some(Response {
                abort_communicators: true,
                tear_down_process: true
            })
        );
        assert_eq!(w.in_flight(), 0);
        let no_desc = GroupLabel {
            group_desc: "undefined".into(),
            ..label()
        };
        assert_eq!(no_desc.log_prefix(), "[PG ID 0 PG GUID 0 Rank 3] ");
    }

    #[test]
    fn completions_are_reported_as_they_happen_in_enqueue_order() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(label(), ErrorHandlingMode::SkipCleanUp);
        let works: Vec<Fake> = (1..=4).map(Fake::new).collect();
        for (i, f) in works.iter().enumerate() {
            w.enqueue(record(i as u64 + 1, t0, 1000), f.clone());
        }
        works[2].done.set(true);
        works[0].done.set(true);
        let r = w.poll(t0 + Duration::from_millis(10));
        let ids: Vec<u64> = r.completed.iter().map(|f| f.probe.id).collect();
        assert_eq!(ids, vec![1, 3]);
        assert!(r.response.is_none() && r.first_error.is_none());
        assert_eq!(w.records().map(|r| r.seq).collect::<Vec<_>>(), vec![2, 4]);
        works[3].done.set(true);
        let r = w.poll(t0 + Duration::from_millis(20));
        assert_eq!(
            r.completed.iter().map(|f| f.probe.id).collect::<Vec<_>>(),
            vec![4]
        );
        // A work that finished before a late poll completes rather than timing out.
        works[1].done.set(true);
        let r = w.poll(t0 + Duration::from_secs(60));
        assert_eq!(r.completed.len(), 1);
        assert!(r.timed_out.is_empty());
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn async_error_fails_the_work_and_aborts_the_rest_when_cleaning_up() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(label(), ErrorHandlingMode::CleanUpOnly);
        let a = Fake::new(1);
        let b = Fake::new(2);
        w.enqueue(record(1, t0, 1000), a.clone());
        w.enqueue(record(2, t0, 1000), b.clone());
        a.error.set(Some("ncclRemoteError: remote process exited"));
        a.done.set(true); // an error wins over completion
        let r = w.poll(t0 + Duration::from_millis(1));
        assert_eq!(r.failed.len(), 2);
        assert!(matches!(r.failed[0].outcome, Outcome::Failed { .. }));
        let first = r.failed[0].error.as_ref().unwrap().message().to_string();
        assert!(
            first.starts_with("[PG ID 0 PG GUID 0(default_pg) Rank 3] "),
            "{first}"
        );
        assert!(
            first.contains("WorkNCCL(SeqNum=1, OpType=ALLREDUCE"),
            "{first}"
        );
        assert!(
            first.ends_with("ncclRemoteError: remote process exited"),
            "{first}"
        );
        assert_eq!(r.failed[1].outcome, Outcome::Aborted);
        let second = r.failed[1].error.as_ref().unwrap().message();
        assert!(
            second.starts_with("NCCL communicator was aborted on rank 3."),
            "{second}"
        );
        assert_eq!(
            r.response,
            Some(Response {
                abort_communicators: true,
                tear_down_process: false
            })
        );
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn modes_decide_the_response() {
        use ErrorHandlingMode::*;
        for (mode, abort, tear) in [
            (NoHandling, false, false),
            (TearDown, true, true),
            (CleanUpOnly, true, false),
            (SkipCleanUp, false, true),
        ] {
            let t0 = Instant::now();
            let mut w = Watchdog::new(label(), mode);
            w.enqueue(record(1, t0, 5), Fake::new(1));
            w.enqueue(record(2, t0, 50), Fake::new(2));
            let r = w.poll(t0 + Duration::from_millis(6));
            assert_eq!(r.timed_out.len(), 1, "{mode:?}");
            assert_eq!(
                r.response,
                Some(Response {
                    abort_communicators: abort,
                    tear_down_process: tear
                }),
                "{mode:?}"
            );
            // Without an abort the other work stays in flight (and may hang, as in PyTorch).
            assert_eq!(w.in_flight(), usize::from(!abort), "{mode:?}");
        }
    }

    #[test]
    fn extending_timeouts_postpones_the_deadline() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(label(), ErrorHandlingMode::TearDown);
        w.enqueue(record(7, t0, 3000), Fake::new(7));
        w.extend_timeouts(Duration::from_secs(10));
        assert_eq!(w.records().next().unwrap().timeout, Duration::from_secs(13));
        assert!(w.poll(t0 + Duration::from_secs(12)).timed_out.is_empty());
        let r = w.poll(t0 + Duration::from_secs(13));
        let m = r.timed_out[0].error.as_ref().unwrap().message().to_string();
        assert!(
            m.contains("Timeout(ms)=13000) ran for 13000 milliseconds"),
            "{m}"
        );
    }

    #[test]
    fn drain_hands_back_every_work_in_order() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(label(), ErrorHandlingMode::CleanUpOnly);
        for seq in 1..=3 {
            w.enqueue(record(seq, t0, 1000), Fake::new(seq));
        }
        let mut seen = Vec::new();
        w.drain(|r, f| seen.push((r.seq, f.id)));
        assert_eq!(seen, vec![(1, 1), (2, 2), (3, 3)]);
        assert_eq!(w.in_flight(), 0);
        assert!(w.poll(t0 + Duration::from_secs(5)).timed_out.is_empty());
    }

    #[test]
    fn an_ending_group_fails_works_without_a_response() {
        let mut dog = Watchdog::new(label(), ErrorHandlingMode::SkipCleanUp);
        let (done, failing) = (Fake::new(1), Fake::new(2));
        done.done.set(true);
        done.error.set(Some("comm destroyed after the op finished"));
        failing.error.set(Some("comm aborted"));
        let t0 = Instant::now();
        dog.enqueue(record(1, t0, 60_000), done);
        dog.enqueue(record(2, t0, 60_000), failing);
        dog.set_ending();
        let r = dog.poll(Instant::now());
        assert_eq!(r.failed.len(), 2, "an error wins over completion");
        assert!(
            r.response.is_none(),
            "no teardown for a group ending on purpose"
        );
    }
}
