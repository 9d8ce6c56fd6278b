//! `Comm`, the algorithms' view of the engine while one collective runs: non-blocking posts of
//! sends and receives, waits (with the op's deadline, liveness probes and the time-out text),
//! the group's checks for the shared-memory and cross-memory-attach paths, scratch buffers.

use super::fault_texts::{blaming, op_failed, rank_list};
use super::lock::lock;
use super::op_info::OpInfo;
use super::{deadline_after, liveness, Engine};
use crate::hosts::Hosts;
use crate::shm::{Budget, ShmState};
use crate::wire::{Header, Kind};
use c10d_core::flight_recorder::Trace;
use c10d_core::{DType, DistError, ErrorContext, OpType, Result};
use c10d_store::Store;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the algorithms keep between ops.
#[derive(Default)]
pub(super) struct AlgoState {
    /// Whether cross-memory attach works between all ranks (`None`: not probed yet).
    pub(super) cma: Option<bool>,
    /// The group's shared-memory segment (see `algo::shm`).
    pub(super) shm: ShmState,
    /// What the group's shared-memory set-ups learnt so far.
    pub(super) shm_budget: Budget,
    /// The group's host map (`None`: not probed yet; `Some(None)`: flat, see
    /// `algo::hierarchical`).
    pub(super) hosts: Option<Option<Arc<Hosts>>>,
    /// Scratch buffers (see [`Comm::take_scratch`]).
    pub(super) pool: Vec<Vec<u128>>,
}

/// Why a wait ended early.
pub(crate) enum WaitErr {
    /// The group failed (dead peer, mismatch, abort).
    Failed(DistError),
    /// The deadline passed.
    Timeout,
}

/// A 16-byte aligned scratch buffer borrowed from the engine's pool (reused across ops).
pub(crate) struct Scratch {
    buf: Vec<u128>,
    len: usize,
}

impl Scratch {
    /// The bytes (exactly the requested length).
    pub(crate) fn bytes(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u128, u8>(&mut self.buf)[..self.len]
    }
}

/// The algorithms' view of the engine while one collective runs.
///
/// Sends and receives are posted without blocking and completed by [`Comm::wait`]. Everything
/// still posted when the `Comm` is dropped (or when a wait fails) is detached, so no frame is
/// ever read into or written from memory the collective has given back.
pub(crate) struct Comm<'e> {
    eng: &'e mut Engine,
    info: OpInfo,
    deadline: Instant,
    timeout: Duration,
    outstanding: Vec<u64>,
    /// The op's flight-recorder entry, when it is to be written at the op's first wait (see
    /// [`Comm::record_pending`]), and the trace it gave.
    record: Option<RecordHook<'e>>,
    trace: Option<Trace>,
}

/// Records an op in the flight recorder and returns its trace (`None` while recording is
/// off). Given to a collective the calling thread runs at once (see
/// `ProcessGroupGloo::submit`), so that the entry is written while the op waits for its peers
/// (see [`Comm::record_pending`]).
pub(crate) type RecordHook<'h> = &'h dyn Fn() -> Option<Trace>;

impl<'e> Comm<'e> {
    /// The view of `eng` for the collective `info`, whose deadline is `timeout` from now;
    /// `record` records the op at its first wait (`None`: it is recorded already, or not at all
    /// while recording is off).
    pub(super) fn new(
        eng: &'e mut Engine,
        info: OpInfo,
        timeout: Duration,
        record: Option<RecordHook<'e>>,
    ) -> Comm<'e> {
        let deadline = deadline_after(timeout);
        eng.colls.deadline = Some(deadline);
        Comm {
            eng,
            info,
            deadline,
            timeout,
            outstanding: Vec::new(),
            record,
            trace: None,
        }
    }
}

impl Comm<'_> {
    /// Called by every wait for peers, once the wait has issued its first look at what it waits
    /// for: the first call records the op (when it was not recorded at submission) and marks
    /// it started. Writing the entry (about 20 ns) then overlaps the transfer of the peer's
    /// cache line to this core, which the wait sits out anyway, instead of adding to the op's
    /// time; and the entry exists before the op can hang. [`Comm::recorded_trace`] calls it
    /// too, for ops that never wait.
    pub(crate) fn record_pending(&mut self) {
        if let Some(record) = self.record.take() {
            self.trace = record();
            if let Some(t) = &self.trace {
                t.started();
            }
        }
    }

    /// The trace of an op recorded by [`Comm::record_pending`], recording it now if it never
    /// waited; `None` when it was recorded before it ran (or recording is off).
    pub(super) fn recorded_trace(&mut self) -> Option<Trace> {
        self.record_pending();
        self.trace.take()
    }
}

impl Comm<'_> {
    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.eng.id.rank
    }
    /// Group size.
    pub(crate) fn size(&self) -> usize {
        self.eng.id.size
    }

    /// Whether every rank of the group runs on this host (kernel and network namespace, as
    /// the ranks published them; see `transport::identity`).
    ///
    /// # Errors
    /// A store failure; this op's time-out (naming the ranks that never joined the group) when
    /// some rank had not published where it runs by the op's deadline.
    pub(crate) fn all_peers_local(&mut self) -> Result<bool> {
        let deadline = self.deadline;
        match self.eng.all_peers_local(deadline)? {
            Ok(local) => Ok(local),
            Err(missing) => Err(self.timed_out(&missing)),
        }
    }

    /// Every rank's identity (where it runs, whether it allows two-level algorithms).
    ///
    /// # Errors
    /// As [`Comm::all_peers_local`].
    pub(crate) fn identities(&mut self) -> Result<Vec<crate::transport::identity::Identity>> {
        let deadline = self.deadline;
        match self.eng.identities(deadline)? {
            Ok(ids) => Ok(ids.to_vec()),
            Err(missing) => Err(self.timed_out(&missing)),
        }
    }

    /// Whether the group learnt its host map yet (see `algo::hierarchical::probe`).
    pub(crate) fn hosts_probed(&self) -> bool {
        self.eng.algo.hosts.is_some()
    }

    /// The group's host map, when it splits into equal hosts of several ranks.
    pub(crate) fn hosts(&self) -> Option<Arc<Hosts>> {
        self.eng.algo.hosts.clone().flatten()
    }

    /// Records the group's host map (every rank records the same).
    pub(crate) fn set_hosts(&mut self, hosts: Option<Hosts>) {
        self.eng.algo.hosts = Some(hosts.map(Arc::new));
    }

    /// The group's shared-memory state (see `algo::shm`).
    pub(crate) fn shm(&mut self) -> &mut ShmState {
        &mut self.eng.algo.shm
    }

    /// What the group's shared-memory set-ups learnt so far (see `algo::shm::probe`).
    pub(crate) fn shm_budget(&mut self) -> &mut Budget {
        &mut self.eng.algo.shm_budget
    }

    /// The group's store (for the set-ups an op runs: shared memory).
    pub(crate) fn store(&self) -> Arc<dyn Store> {
        self.eng.links.dialer.store.clone()
    }

    /// Records whether the group has a shared-memory segment (the verdict
    /// `ProcessGroupGloo::shared_memory` reports).
    pub(crate) fn set_shm_verdict(&mut self, on: bool) {
        self.eng
            .shared
            .shm
            .store(if on { 1 } else { 2 }, std::sync::atomic::Ordering::Relaxed);
    }

    /// When this op times out.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// This op as the ranks compare it: (op, PyTorch seq, dtype, total bytes).
    pub(crate) fn op_desc(&self) -> (OpType, u64, DType, u64) {
        (
            self.info.op,
            self.info.seq,
            self.info.dtype,
            self.info.total,
        )
    }

    /// Fails the group with the socket path's mismatch text: `peer` runs `them` = (op, seq,
    /// dtype, total bytes) where this rank runs this op.
    pub(crate) fn mismatch(&mut self, peer: usize, them: (OpType, u64, DType, u64)) -> DistError {
        let h = Header {
            kind: Kind::Coll,
            op: them.0,
            dtype: them.2,
            step: 0,
            coll_seq: self.info.coll_seq,
            seq: them.1,
            total: them.3,
            nbytes: them.3,
            tag: 0,
        };
        let e = self
            .eng
            .mismatch_error(&self.info, 0, self.info.total as usize, peer, &h);
        self.fail_group(e)
    }

    /// A peer in `needed` that said bye (shut its group down), or the group's failure, becomes
    /// this op's error, as it would on the sockets; no system call.
    pub(crate) fn check_peers(&mut self, mut needed: impl Iterator<Item = usize>) -> Result<()> {
        if let Some(p) = needed.find(|&p| self.eng.faults.left[p]) {
            self.eng.fail_left(p);
            self.eng.handle_faults();
        }
        match self.eng.faults.failed.clone() {
            Some(e) => Err(op_failed(&self.info, &self.eng.id, &e)),
            None => Ok(()),
        }
    }

    /// Reads what the sockets hold without blocking (this op posted nothing on them): the
    /// group's failure, the awaited peer `waiting_for` gone, or a frame of this collective from a
    /// peer (it runs another op, or this one over sockets), becomes this op's error. A peer that
    /// left after doing its part of the op is no error (as on the sockets).
    pub(crate) fn check_sockets(&mut self, waiting_for: usize) -> Result<()> {
        self.check_alive(waiting_for)?;
        let cs = self.info.coll_seq;
        let found = (0..self.size()).find_map(|p| {
            self.eng.colls.early[p]
                .iter()
                .find(|e| e.hdr.kind == Kind::Coll && e.hdr.coll_seq == cs)
                .map(|e| (p, e.hdr))
        });
        match found {
            Some((p, h)) => Err(self.mismatch(p, (h.op, h.seq, h.dtype, h.total))),
            None => Ok(()),
        }
    }

    /// Reads what the sockets hold without blocking: the group's failure, or the awaited peer
    /// `waiting_for` gone, becomes this op's error. Frames of this op from peers are kept (a
    /// set-up that ranks leave at different times, such as the shared-memory one, is followed
    /// by socket frames of the same op from the ranks that left it first).
    pub(crate) fn check_alive(&mut self, waiting_for: usize) -> Result<()> {
        // Liveness probes shortly before the deadline, as the socket path sends them, so that a
        // time-out names the silent ranks.
        self.eng
            .probe_if_due(self.deadline, liveness::window(self.timeout));
        self.eng.handle_faults();
        self.eng.poll_once(Some(Duration::ZERO));
        self.check_peers(std::iter::once(waiting_for))
    }

    /// Why the group was told to stop (abort, shutdown) while this op runs, as this op's error.
    pub(crate) fn stop_requested(&self) -> Option<DistError> {
        let stop = lock(&self.eng.shared.queue).stop.clone()?;
        Some(op_failed(&self.info, &self.eng.id, &stop))
    }

    /// The timeout error of this op when `missing` sent nothing (the socket path's text), told
    /// to the peers as this rank's note.
    pub(crate) fn timed_out(&mut self, missing: &[usize]) -> DistError {
        let e = self.timeout_error(
            &format!("; no data from rank(s) {}", rank_list(missing)),
            missing,
        );
        self.detach_all();
        blaming(e, missing.iter().copied())
    }

    /// "Timed out waiting {ms}ms for {op} (seq n) on rank r{who}{silent ranks}", told to the
    /// peers as this rank's note.
    fn timeout_error(&mut self, who: &str, missing: &[usize]) -> DistError {
        let silent = self
            .eng
            .silent_text(self.deadline, liveness::window(self.timeout), missing);
        let e = DistError::backend(format!(
            "ProcessGroupGloo (group {}): Timed out waiting {}ms for {} (seq {}) on rank {}{who}{silent}",
            self.eng.id.group_name,
            self.timeout.as_millis(),
            self.info.op,
            self.info.seq,
            self.rank(),
        ));
        let e = e.with_context(ErrorContext::op(
            &self.eng.id.group_name,
            self.rank(),
            self.info.op,
            self.info.seq,
        ));
        self.eng.send_note(e.message());
        self.eng.handle_faults();
        e
    }

    /// The group's cross-memory-attach verdict (`None` until probed).
    pub(crate) fn cma(&self) -> Option<bool> {
        self.eng.algo.cma
    }

    /// Records the group's cross-memory-attach verdict.
    pub(crate) fn set_cma(&mut self, ok: bool) {
        self.eng.algo.cma = Some(ok);
        self.eng
            .shared
            .cma
            .store(if ok { 1 } else { 2 }, std::sync::atomic::Ordering::Relaxed);
    }

    /// Fails the group with `e`, telling every peer (for failures the peers cannot see), and
    /// returns this op's error ("{op} (seq n) on rank r failed: {e}").
    /// A failure our peers cannot see (e.g. a failed read of a peer's memory) may be the
    /// consequence of one they already reported (an error frame, then the reporter exited):
    /// what the sockets already hold is read first, and an explanation found there wins.
    pub(crate) fn fail_group(&mut self, e: DistError) -> DistError {
        let eng = &mut *self.eng;
        if eng.faults.failed.is_none() {
            eng.sweep();
            eng.handle_faults();
        }
        let e = eng.faults.failed.clone().unwrap_or(e);
        self.eng.fail_group(e.clone(), true);
        op_failed(&self.info, &self.eng.id, &e)
    }

    /// "ProcessGroupGloo (group G, rank R)", for error texts.
    pub(crate) fn ctx(&self) -> String {
        self.eng.ctx()
    }

    /// An aligned scratch buffer of `len` bytes (contents unspecified), reused across ops.
    pub(crate) fn take_scratch(&mut self, len: usize) -> Scratch {
        let words = len.div_ceil(16);
        let mut buf = match self
            .eng
            .algo
            .pool
            .iter()
            .position(|b| b.capacity() >= words)
        {
            Some(i) => self.eng.algo.pool.swap_remove(i),
            None => self.eng.algo.pool.pop().unwrap_or_default(),
        };
        if buf.len() < words {
            buf.resize(words, 0);
        }
        Scratch { buf, len }
    }

    /// Gives a scratch buffer back to the pool.
    pub(crate) fn put_scratch(&mut self, s: Scratch) {
        // Keep a few buffers; drop huge ones beyond 256 MiB in total.
        let total: usize = self.eng.algo.pool.iter().map(|b| b.capacity() * 16).sum();
        if self.eng.algo.pool.len() < 4 && total + s.buf.capacity() * 16 <= 256 << 20 {
            self.eng.algo.pool.push(s.buf);
        }
    }

    /// Posts a send of `len` bytes at `ptr` to `peer` as step `step`.
    ///
    /// # Safety
    /// The bytes must stay valid and unmodified until the returned id is waited on, or until
    /// this `Comm` is dropped / a wait fails (both detach it).
    pub(super) unsafe fn post_send(
        &mut self,
        peer: usize,
        step: u32,
        ptr: *const u8,
        len: usize,
    ) -> u64 {
        debug_assert_ne!(peer, self.rank());
        let info = self.info;
        let id = self.eng.post_coll_send(&info, peer, step, ptr, len);
        self.eng.handle_faults();
        self.outstanding.push(id);
        id
    }

    /// Posts a receive of exactly `len` bytes from `peer`, step `step`, into `ptr`.
    ///
    /// # Safety
    /// The memory must stay valid, and must not be read or written by anyone else, until the
    /// returned id is waited on or this `Comm` is dropped / a wait fails.
    pub(super) unsafe fn post_recv(
        &mut self,
        peer: usize,
        step: u32,
        ptr: *mut u8,
        len: usize,
    ) -> u64 {
        debug_assert_ne!(peer, self.rank());
        let info = self.info;
        let id = self.eng.post_coll_recv(&info, peer, step, ptr, len);
        self.eng.handle_faults();
        self.outstanding.push(id);
        id
    }

    /// Posts a send of `data` (see [`Comm::post_send`]).
    ///
    /// # Safety
    /// As [`Comm::post_send`].
    pub(super) unsafe fn send_slice(&mut self, peer: usize, step: u32, data: &[u8]) -> u64 {
        // SAFETY: forwarded contract.
        unsafe { self.post_send(peer, step, data.as_ptr(), data.len()) }
    }

    /// Posts a receive into `buf` (see [`Comm::post_recv`]).
    ///
    /// # Safety
    /// As [`Comm::post_recv`].
    pub(super) unsafe fn recv_slice(&mut self, peer: usize, step: u32, buf: &mut [u8]) -> u64 {
        // SAFETY: forwarded contract.
        unsafe { self.post_recv(peer, step, buf.as_mut_ptr(), buf.len()) }
    }

    /// Blocks (in epoll) until every id in `ids` completed (for [`super::Posts`], whose own
    /// posts these are).
    ///
    /// # Errors
    /// The group's failure, or the timeout text; either way every outstanding post is detached.
    pub(super) fn wait(&mut self, ids: &[u64]) -> Result<()> {
        self.debug_check_posted(ids);
        self.record_pending();
        match self
            .eng
            .wait_ids(ids, self.deadline, liveness::window(self.timeout))
        {
            Ok(()) => {
                self.outstanding.retain(|i| !ids.contains(i));
                Ok(())
            }
            Err(w) => Err(self.fail(w, ids)),
        }
    }

    /// Whether every id in `ids` completed, after one look at the sockets that does not block
    /// (for [`super::Posts`]); completed ids are consumed as by [`Comm::wait`], others stay
    /// posted. Lets an algorithm do other work while it waits, and keeps the sockets moving
    /// while it computes.
    ///
    /// # Errors
    /// The group's failure (every outstanding post is detached, as by [`Comm::wait`]).
    pub(super) fn test(&mut self, ids: &[u64]) -> Result<bool> {
        self.debug_check_posted(ids);
        self.record_pending();
        self.eng.handle_faults();
        self.eng.poll_once(Some(Duration::ZERO));
        self.eng.handle_faults();
        if let Some(e) = &self.eng.faults.failed {
            let e = e.clone();
            return Err(self.fail(WaitErr::Failed(e), ids));
        }
        if !ids.iter().all(|i| self.eng.colls.done.contains(i)) {
            return Ok(false);
        }
        for i in ids {
            self.eng.colls.done.remove(i);
        }
        self.outstanding.retain(|i| !ids.contains(i));
        Ok(true)
    }

    /// An algorithm waiting on an id it never posted, or whose wait already consumed it, would
    /// otherwise wait for the op's whole time-out: in debug builds (every test) it panics here,
    /// naming the op and the ids.
    fn debug_check_posted(&self, ids: &[u64]) {
        debug_assert!(
            ids.iter().all(|i| self.outstanding.contains(i)),
            "{:?}: waiting on post ids {ids:?}, not all outstanding ({:?})",
            self.info.op,
            self.outstanding
        );
    }

    /// Waits for everything posted so far.
    ///
    /// # Errors
    /// As [`Comm::wait`].
    pub(crate) fn wait_all(&mut self) -> Result<()> {
        self.record_pending();
        let ids = std::mem::take(&mut self.outstanding);
        match self
            .eng
            .wait_ids(&ids, self.deadline, liveness::window(self.timeout))
        {
            Ok(()) => Ok(()),
            Err(w) => {
                self.outstanding = ids.clone();
                Err(self.fail(w, &ids))
            }
        }
    }

    /// Like [`Comm::wait`] but on time-out returns the peers whose receives did not complete
    /// (monitored barrier, through [`super::Posts`]), leaving completed ones consumed.
    pub(super) fn wait_or_missing(
        &mut self,
        ids: &[u64],
        deadline: Instant,
    ) -> std::result::Result<(), (Vec<usize>, Option<DistError>)> {
        self.record_pending();
        match self.eng.wait_ids(ids, deadline, Duration::ZERO) {
            Ok(()) => {
                self.outstanding.retain(|i| !ids.contains(i));
                Ok(())
            }
            Err(WaitErr::Timeout) => {
                let (missing, _) = self.eng.missing_peers(ids);
                self.detach_all();
                Err((missing, None))
            }
            Err(WaitErr::Failed(e)) => {
                self.detach_all();
                Err((Vec::new(), Some(e)))
            }
        }
    }

    /// Safe all-at-once exchange: posts every receive (in order) then every send, and waits.
    ///
    /// # Errors
    /// As [`Comm::wait`].
    pub(crate) fn exchange(
        &mut self,
        sends: &[(usize, u32, &[u8])],
        recvs: &mut [(usize, u32, &mut [u8])],
    ) -> Result<()> {
        for (p, s, b) in recvs.iter_mut() {
            // SAFETY: `recvs` is mutably borrowed for this whole call, which waits for (or detaches)
            // every post before returning.
            unsafe { self.recv_slice(*p, *s, b) };
        }
        for (p, s, b) in sends {
            // SAFETY: as above, `sends` outlives the call.
            unsafe { self.send_slice(*p, *s, b) };
        }
        self.wait_all()
    }

    /// Detaches everything posted and not waited for (the engine no longer reads or writes
    /// that memory).
    pub(super) fn detach_all(&mut self) {
        let ids = std::mem::take(&mut self.outstanding);
        self.eng.detach_ids(&ids, true);
    }

    fn fail(&mut self, w: WaitErr, ids: &[u64]) -> DistError {
        let e = match w {
            WaitErr::Failed(e) => op_failed(&self.info, &self.eng.id, &e),
            WaitErr::Timeout => {
                let (recv, send) = self.eng.missing_peers(ids);
                let (who, peers) = if !recv.is_empty() {
                    (format!("; no data from rank(s) {}", rank_list(&recv)), recv)
                } else {
                    let text = format!("; sends to rank(s) {} did not complete", rank_list(&send));
                    (text, send)
                };
                blaming(self.timeout_error(&who, &peers), peers)
            }
        };
        self.detach_all();
        e
    }
}

impl Drop for Comm<'_> {
    fn drop(&mut self) {
        self.detach_all();
    }
}

impl Engine {
    /// Waits until every id in `ids` completed, probing the peers' liveness `window` before
    /// `deadline` (zero: no probe).
    fn wait_ids(
        &mut self,
        ids: &[u64],
        deadline: Instant,
        window: Duration,
    ) -> std::result::Result<(), WaitErr> {
        loop {
            if let Some(e) = &self.faults.failed {
                return Err(WaitErr::Failed(e.clone()));
            }
            if ids.iter().all(|i| self.colls.done.contains(i)) {
                for i in ids {
                    self.colls.done.remove(i);
                }
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(WaitErr::Timeout);
            }
            self.probe_if_due(deadline, window);
            self.handle_faults();
            let wake = self
                .probe_due_at(deadline, window)
                .map_or(deadline, |d| d.min(deadline));
            self.poll_once(Some(wake.saturating_duration_since(now)));
        }
    }
}
