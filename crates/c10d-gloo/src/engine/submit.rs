//! Submission and scheduling: the queue shared with the user-facing handle, the worker thread,
//! the drive loops (the worker's, and a blocking caller's inline one), running one collective
//! (`run_coll`: its body gets a `Comm`), and the last act of a stopping engine (`finish`).

use super::comm::{Comm, RecordHook};
use super::conn::{control_header, Owner, TxData};
use super::fault_texts::{op_failed, panic_text};
use super::lock::lock;
use super::op_info::OpInfo;
use super::Engine;
use crate::wire::Kind;
use c10d_core::{DType, DistError, OpType, Result, TensorLeases, WorkCompleter};
use mio::Waker;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The algorithm of one collective, run on the worker with host views of the leased tensors.
pub(crate) type CollBody = Box<
    dyn for<'a, 'b, 'c> FnOnce(&'a mut Comm<'b>, Vec<&'c [u8]>, Vec<&'c mut [u8]>) -> Result<()>
        + Send,
>;

pub(crate) struct CollOp {
    pub info: OpInfo,
    pub timeout: Duration,
    pub leases: TensorLeases,
    pub body: CollBody,
    pub completer: WorkCompleter,
}

pub(crate) struct P2pOp {
    pub seq: u64,
    pub op: OpType,
    /// Destination (send) or source (recv); `None` = any source.
    pub peer: Option<usize>,
    pub tag: i64,
    pub dtype: DType,
    pub timeout: Duration,
    pub leases: TensorLeases,
    pub completer: WorkCompleter,
}

pub(crate) enum Submission {
    Coll(CollOp),
    P2p(P2pOp),
}

/// Submission queue and counters, shared with the user-facing handle.
pub(crate) struct Queue {
    pub subs: VecDeque<Submission>,
    /// PyTorch sequence number: +1 per collective and per send/recv.
    pub seq: u64,
    /// Collective index: +1 per collective only (what peers agree on).
    pub coll_seq: u64,
    /// Set by abort/shutdown: the error every later op gets.
    pub stop: Option<DistError>,
    /// Asks an idle worker to look at the engine again (work left by an inline driver).
    pub kick: bool,
    /// The stop is an orderly shutdown: peers are told with a bye frame (else they see EOF,
    /// exactly as if this process had died).
    pub graceful: bool,
}

pub(crate) struct Shared {
    pub queue: Mutex<Queue>,
    /// Signalled (with `queue` locked) when an idle worker should wake up.
    pub cv: std::sync::Condvar,
    pub waker: Waker,
    pub initialized: AtomicBool,
    pub failed: Mutex<Option<DistError>>,
    /// The group's cross-memory-attach verdict: 0 not probed, 1 usable, 2 not usable.
    pub cma: std::sync::atomic::AtomicU8,
    /// The group's shared-memory verdict, coded as `cma`.
    pub shm: std::sync::atomic::AtomicU8,
    /// Peers this rank has a connection to (made on demand; diagnostics).
    pub connections: std::sync::atomic::AtomicUsize,
}

impl Shared {
    /// The state of a new group: empty queue, counters at 0, not initialized, not failed.
    pub(crate) fn new(waker: Waker) -> Shared {
        Shared {
            queue: Mutex::new(Queue {
                subs: Default::default(),
                seq: 0,
                coll_seq: 0,
                stop: None,
                kick: false,
                graceful: false,
            }),
            cv: std::sync::Condvar::new(),
            waker,
            initialized: Default::default(),
            failed: Mutex::new(None),
            cma: Default::default(),
            shm: Default::default(),
            connections: Default::default(),
        }
    }
}

/// A stop (abort, shutdown) as the engine saw it.
#[derive(Default)]
pub(super) struct Stop {
    /// Seen: the worker finishes (see [`Engine::finish`]).
    pub(super) requested: bool,
    /// An orderly shutdown: peers are told with a bye frame.
    pub(super) graceful: bool,
    /// The error frame (text, step) of the failure the group had when it was asked to stop,
    /// told to peers again at shutdown.
    pub(super) failed_before: Option<(Vec<u8>, u32)>,
}

/// The worker thread: drives the engine while there is work, sleeps on the queue's condvar
/// (not in epoll, so an inline driver owns the sockets alone) while there is none.
pub(crate) fn worker_loop(engine: Arc<Mutex<Engine>>, shared: Arc<Shared>) {
    loop {
        {
            let mut eng = lock(&engine);
            if eng.guarded(|e| e.drive_until_idle()) == Some(true) {
                eng.finish();
                return;
            }
        }
        let mut q = lock(&shared.queue);
        while q.subs.is_empty() && q.stop.is_none() && !q.kick {
            q = shared.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        q.kick = false;
    }
}

impl Engine {
    /// Runs `f`, turning a panic (a bug in the engine) into the group's failure, so that every
    /// pending and later op gets an error instead of waiting forever on a dead driver.
    pub(crate) fn guarded<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> Option<R> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut *self))) {
            Ok(r) => Some(r),
            Err(p) => {
                let what = panic_text(&*p);
                self.colls.cur = None;
                self.faults.forget();
                let e = DistError::backend(format!(
                    "{}: internal error (panic) in the engine: {what}",
                    self.ctx()
                ));
                self.fail_group(e, true);
                None
            }
        }
    }

    /// Runs queued collectives and drives pending point-to-point traffic until nothing is left
    /// to do. Returns true when the group is stopping (the caller then calls [`Engine::finish`]).
    pub(crate) fn drive_until_idle(&mut self) -> bool {
        loop {
            self.drain();
            if self.stop.requested {
                return true;
            }
            if let Some(op) = self.colls.pending.pop_front() {
                self.run_coll(op);
                continue;
            }
            if self.has_pending_io() {
                self.poll_once(None);
                continue;
            }
            return false;
        }
    }

    /// Drives the engine on the calling thread until `done()` holds (the caller's own op
    /// completed) or the group stops. Ops queued before it run first, in issue order.
    pub(crate) fn drive_until(&mut self, done: impl Fn() -> bool) {
        loop {
            self.drain();
            if self.stop.requested || done() {
                return;
            }
            if let Some(op) = self.colls.pending.pop_front() {
                self.run_coll(op);
                continue;
            }
            // Our op is queued behind nothing and not complete: cannot happen, but never spin.
            self.poll_once(Some(Duration::from_millis(10)));
        }
    }

    /// True while collectives are queued, point-to-point ops are pending, frames wait to be
    /// written or faults to be handled.
    pub(crate) fn has_pending_io(&self) -> bool {
        !self.colls.pending.is_empty()
            || !self.p2p.ops.is_empty()
            || self.faults.recorded()
            || self
                .net
                .peers
                .iter()
                .flatten()
                .any(|p| p.open && !p.tx.is_empty())
    }

    /// True once a stop was seen.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stop.requested
    }

    /// Last act of the worker: say bye (orderly shutdown) and close every socket.
    pub(crate) fn finish(&mut self) {
        self.links.mailbox.stop();
        self.net.waiting.clear();
        if self.stop.graceful {
            // Tell every peer we leave on purpose, and give the frames up to 1 s to go out.
            // A failed group says why first: a peer that still needs us then fails with the
            // cause (which may not have reached it yet), not only with "rank r has shut down".
            // A cause passed on from another rank goes as passed on, so that a peer whose own
            // connection broke still names its own other end.
            let why = self.stop.failed_before.take();
            for p in 0..self.net.peers.len() {
                if self.net.peers[p].as_ref().is_some_and(|x| x.open) {
                    if let Some((text, step)) = &why {
                        self.push_error(p, text, *step);
                    }
                    let h = control_header(Kind::Bye, 0);
                    self.push_tx(p, h, TxData::Owned(Vec::new()), Owner::Nobody);
                }
            }
            let deadline = Instant::now() + Duration::from_secs(1);
            while self
                .net
                .peers
                .iter()
                .flatten()
                .any(|p| p.open && !p.tx.is_empty())
            {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                self.poll_once(Some(deadline - now));
            }
        }
        // Close every socket now (peers see EOF at once).
        for p in self.net.peers.iter_mut().flatten() {
            p.stream.shutdown();
            p.open = false;
        }
    }

    pub(super) fn drain(&mut self) {
        let (subs, stop) = {
            let mut q = lock(&self.shared.queue);
            (std::mem::take(&mut q.subs), q.stop.clone())
        };
        // Faults noticed before (earlier in this batch of events, when the waker woke us) are
        // handled first, and after each start, so that every submission sees the group as it is.
        self.handle_faults();
        for s in subs {
            match s {
                Submission::Coll(op) => self.colls.pending.push_back(op),
                Submission::P2p(op) => {
                    self.start_p2p(op);
                    self.handle_faults();
                }
            }
        }
        if let Some(e) = stop {
            self.stop.graceful = lock(&self.shared.queue).graceful;
            self.stop.requested = true;
            self.stop.failed_before = self.faults.told();
            self.fail_group(e.clone(), false);
            // When the group had failed before, `fail_group` did nothing; collectives queued
            // since (taken in this same drain) will never run, so they fail here.
            let err = self.faults.failed.clone().unwrap_or(e);
            self.fail_pending_colls(&err);
        }
    }

    /// Whether a collective submitted now would run next (nothing queued in the engine).
    pub(crate) fn nothing_queued(&self) -> bool {
        self.colls.pending.is_empty()
    }

    /// Runs `op`, submitted by the calling thread, which holds the engine and found nothing
    /// queued before it, at once; `record` records it in the flight recorder (see
    /// [`Engine::run_coll_with`] for when). Ops submitted by other threads since were numbered
    /// after it and run after it. A stop seen first fails it (recorded), as it fails every
    /// queued op.
    pub(crate) fn run_now(&mut self, mut op: CollOp, record: RecordHook<'_>) {
        self.drain();
        if self.stop.requested {
            op.completer.set_trace(record());
            let stop = lock(&self.shared.queue).stop.clone();
            let err = (self.faults.failed.clone().or(stop))
                .unwrap_or_else(|| DistError::backend("the group was shut down"));
            self.colls.pending.push_front(op);
            self.fail_pending_colls(&err);
            return;
        }
        self.run_coll_with(op, Some(record));
    }

    /// Runs a queued collective (recorded when it was submitted).
    pub(super) fn run_coll(&mut self, op: CollOp) {
        self.run_coll_with(op, None);
    }

    /// Runs `op`; `record`, when given, records it in the flight recorder: at its first wait
    /// for a peer when its body runs (see [`Comm::record_pending`]), else at once (it fails
    /// because the group failed, or connecting, which can block, comes first).
    fn run_coll_with(&mut self, op: CollOp, mut record: Option<RecordHook<'_>>) {
        let CollOp {
            info,
            timeout,
            mut leases,
            body,
            mut completer,
        } = op;
        if self.faults.failed.is_some() || !self.shared.initialized.load(Ordering::Relaxed) {
            if let Some(r) = record.take() {
                completer.set_trace(r());
            }
        }
        self.colls.seq = info.coll_seq;
        let res = if let Some(e) = self.faults.failed.clone() {
            Err(op_failed(&info, &self.id, &e))
        } else {
            self.ensure_initialized();
            completer.mark_started();
            self.colls.cur = Some(info);
            let mut comm = Comm::new(self, info, timeout, record);
            // A bug in an algorithm must not kill the engine (every later op would hang):
            // the panic becomes this op's error and fails the group, whose state is suspect.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                match leases.host_slices() {
                    Ok((ins, outs)) => body(&mut comm, ins, outs),
                    Err(e) => Err(e),
                }
            }));
            if let Some(t) = comm.recorded_trace() {
                completer.set_trace(Some(t));
            }
            drop(comm);
            self.colls.cur = None;
            self.colls.deadline = None;
            match r {
                Ok(r) => r,
                Err(p) => {
                    let what = panic_text(&*p);
                    let e = DistError::backend(format!(
                        "{}: internal error (panic) in {} (seq {}): {what}",
                        self.ctx(),
                        info.op,
                        info.seq
                    ));
                    self.fail_group(e.clone(), true);
                    Err(e)
                }
            }
        };
        self.colls.seq = info.coll_seq + 1;
        drop(leases);
        completer.complete(res);
    }
}
