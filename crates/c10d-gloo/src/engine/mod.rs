//! The per-group engine: one worker thread that owns a `mio::Poll` over the group's peer
//! sockets and runs the group's collectives one after another, in issue order.
//!
//! # Why one loop per group (and not one per process), and who drives it
//!
//! The architecture notes suggest one process-wide event-loop thread plus a worker per group
//! exchanging completions over channels. Every such cross-thread hop costs a futex wake-up
//! (several µs, far more when ranks outnumber cores), and a small all-reduce would pay two of
//! them per message on top of the network. Here the thread that runs the algorithm also drives
//! its sockets: algorithm code posts non-blocking sends/receives and then waits in `epoll`
//! for exactly the events it needs, reading payloads straight into their destination.
//!
//! The engine sits behind a mutex and is driven by whoever holds it:
//! * a **blocking call** (`async_op == false`, what `dist.all_reduce(t)` does) that finds the
//!   engine free runs its op (and anything queued before it) on the calling thread — no thread
//!   hop at all; this is what brings a 2-rank 1 KiB all-reduce to ~12 µs;
//! * otherwise the group's **worker thread** drives: it runs queued collectives in issue
//!   order and keeps polling while point-to-point ops or unsent frames are pending. With
//!   nothing to do it sleeps on a condvar, not in epoll, so an inline driver owns the sockets
//!   alone (two threads waiting on one edge-triggered epoll set would steal each other's events).
//!
//! Waiting always blocks in `epoll_wait` with a deadline, or on a condvar; nothing spins.
//! While nobody drives, arriving bytes simply wait in the kernel's socket buffers.
//!
//! # Matching
//!
//! * Collective frames carry (collective index, step). Each rank runs the same deterministic
//!   algorithm, so the frames a peer sends arrive in the order our algorithm posts its receives
//!   from that peer; a frame is checked against the head of that peer's posted-receive queue
//!   and read directly into the posted buffer. A frame for a later collective (the peer is
//!   ahead) is kept in a per-peer "early" queue and copied when the receive is posted. A frame
//!   whose op, dtype or size differs from what we run is a mismatch: the group fails with an
//!   error naming both ranks and both ops, and the other ranks are told with an error frame.
//!   Frames of a collective that already finished here (after a timeout) are discarded.
//! * Point-to-point frames carry a tag and are matched against posted receives (specific
//!   source, or any source) in posting order; unmatched ones wait in an unexpected queue, so
//!   `isend`/`irecv` never deadlock against collectives running on the same connection.
//!
//! # Faults
//!
//! EOF or a reset on any peer socket fails the group at once: every pending and later op fails
//! with an error naming the lost rank. `abort()`/`shutdown()` stop the worker and fail every
//! pending work. Collectives have a deadline (group timeout or the op's own); on expiry the op
//! fails with "Timed out waiting {ms}ms for {OP} (seq {n}) on rank {r}; no data from rank(s)
//! {…}", its posted buffers are detached (partially received frames are drained into the void,
//! partially sent frames are finished from a copy) and later frames of it are dropped, so the
//! group stays usable. Shortly before the deadline the engine probes its peers' liveness, and the
//! error also names the ranks that did not answer; the timed-out rank's error text goes to its
//! peers as a note that explains its later departure (see `liveness.rs`). Reading is bounded
//! per event and paused for a peer whose early frames pass a budget (see `flow.rs`).

mod comm;
mod conn;
mod faults;
mod flow;
mod liveness;
mod matching;
mod p2p;

use crate::algo::shm::ShmState;
pub(crate) use comm::Comm;
use faults::{op_failed, p2p_failed, panic_text, rank_list};
use p2p::{P2pPending, Unexpected};
use matching::{Early, PostedRecv};
use conn::{
    control_header, read_step, Owner, Peer, ReadStep, Rx, Stream, TxData,
};
use crate::transport::{self, Conn, MeshSpec};
use crate::wire::Kind;
use c10d_core::{DType, DistError, OpType, Result, TensorLeases, WorkCompleter};
use c10d_store::Store;
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) const WAKER: Token = Token(usize::MAX);
/// What a collective frame is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpInfo {
    /// Index among the group's collectives (equal on every rank).
    pub coll_seq: u64,
    /// PyTorch sequence number on this rank.
    pub seq: u64,
    pub op: OpType,
    pub dtype: DType,
    /// Total bytes of this rank's op (mismatch detection and messages).
    pub total: u64,
}

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
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Static identity of this rank in the group.
#[derive(Clone)]
pub(crate) struct Ident {
    pub group_name: String,
    pub rank: usize,
    pub size: usize,
    pub global_ranks: Vec<usize>,
}

impl Ident {
    /// "rank 2" or "rank 2 (global rank 5)".
    pub(crate) fn peer_name(&self, p: usize) -> String {
        match self.global_ranks.get(p) {
            Some(g) if *g != p => format!("rank {p} (global rank {g})"),
            _ => format!("rank {p}"),
        }
    }
}

/// Deferred connection set-up (lazy init) or nothing left to do.
pub(crate) struct Connector {
    pub store: Arc<dyn Store>,
    pub listen_addr: std::net::IpAddr,
    pub timeout: Duration,
    pub socket_buffer_bytes: usize,
    pub local_unix_sockets: bool,
    /// This rank agrees to a shared-memory segment (see `algo::shm`).
    pub shared_memory: bool,
}

impl Connector {
    /// Listens, publishes our addresses and builds the full mesh (see [`transport`]); polls
    /// `aborted` while waiting.
    pub(crate) fn connect(
        &self,
        id: &Ident,
        aborted: &dyn Fn() -> bool,
    ) -> Result<Vec<Option<Conn>>> {
        let listener = transport::listen(self.listen_addr, self.local_unix_sockets)?;
        transport::publish(self.store.as_ref(), id.rank, &listener)?;
        let spec = MeshSpec {
            group_name: &id.group_name,
            rank: id.rank,
            size: id.size,
            timeout: self.timeout,
            socket_buffer_bytes: self.socket_buffer_bytes,
            aborted,
        };
        transport::connect_mesh(self.store.as_ref(), &listener, &spec)
    }

    /// The group's shared-memory segment, agreed through the store once the mesh is up (every
    /// rank calls it). Only when every peer is reached over a Unix socket (the same host), which
    /// every rank of the group sees alike (a connection is Unix at both ends or at neither); a
    /// rank that does not allow it still votes.
    pub(crate) fn shared_memory(&self, id: &Ident, conns: &[Option<Conn>]) -> Result<ShmState> {
        let local = conns
            .iter()
            .enumerate()
            .all(|(p, c)| p == id.rank || matches!(c, Some(Conn::Unix(_))));
        if !local {
            return Ok(ShmState::Off);
        }
        crate::algo::shm::setup(
            self.store.as_ref(),
            id.rank,
            id.size,
            self.shared_memory,
            self.timeout,
        )
    }
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
        }
    }
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

/// The worker's state. Lives on the worker thread only.
pub(crate) struct Engine {
    shared: Arc<Shared>,
    pub(crate) id: Ident,
    poll: Poll,
    events: Events,
    peers: Vec<Option<Peer>>,
    connector: Option<Connector>,
    failed: Option<DistError>,
    /// Why the group had failed when it was asked to stop (told to peers at shutdown).
    failed_before_stop: Option<DistError>,
    stopping: bool,
    graceful: bool,
    /// Peers that said bye: EOF from them is expected; needing them later is an error.
    left: Vec<bool>,
    /// Connections found broken during the current loss sweep.
    lost: Vec<(usize, String)>,
    sweeping: bool,
    /// Reading what a peer sent before its connection failed on a write (see `flush`).
    draining: bool,
    /// Whether cross-memory attach works between all ranks (`None`: not probed yet).
    cma: Option<bool>,
    /// The group's shared-memory segment (see `algo::shm`).
    shm: ShmState,
    /// Reusable buffers for early / unexpected frames.
    spare: Vec<Vec<u8>>,
    pending: VecDeque<CollOp>,
    coll_cur: u64,
    cur: Option<OpInfo>,
    posted: Vec<VecDeque<PostedRecv>>,
    early: Vec<VecDeque<Early>>,
    done: HashSet<u64>,
    next_id: u64,
    p2p: HashMap<u64, P2pPending>,
    p2p_recvs: Vec<u64>,
    unexpected: VecDeque<Unexpected>,
    pool: Vec<Vec<u128>>,
    /// Liveness probes (who is silent when an op times out).
    live: liveness::Liveness,
    /// Read budget and back-pressure on peers that run ahead.
    flow: flow::Flow,
}

// SAFETY: the raw pointers an engine stores point into tensor storage kept alive by leases the
// engine itself holds (p2p) or into buffers of the collective currently running on the thread
// that drives the engine (posts are detached before `run_coll` returns). The engine lives in a
// `Mutex` and is driven by one thread at a time (the worker, or a caller running a blocking op
// inline), so no two threads ever touch the pointed-to memory through it concurrently.
unsafe impl Send for Engine {}

impl Engine {
    pub(crate) fn new(
        shared: Arc<Shared>,
        poll: Poll,
        id: Ident,
        streams: Option<Vec<Option<Conn>>>,
        connector: Option<Connector>,
    ) -> Result<Engine> {
        let n = id.size;
        let mut e = Engine {
            shared,
            id,
            poll,
            events: Events::with_capacity(256),
            peers: (0..n).map(|_| None).collect(),
            connector,
            failed: None,
            failed_before_stop: None,
            stopping: false,
            graceful: false,
            left: vec![false; n],
            lost: Vec::new(),
            sweeping: false,
            draining: false,
            cma: None,
            shm: Default::default(),
            spare: Vec::new(),
            pending: VecDeque::new(),
            coll_cur: 0,
            cur: None,
            posted: (0..n).map(|_| VecDeque::new()).collect(),
            early: (0..n).map(|_| VecDeque::new()).collect(),
            done: HashSet::new(),
            next_id: 1,
            p2p: HashMap::new(),
            p2p_recvs: Vec::new(),
            unexpected: VecDeque::new(),
            pool: Vec::new(),
            live: liveness::Liveness::new(n),
            flow: flow::Flow::new(n),
        };
        if let Some(s) = streams {
            e.install(s)?;
        }
        Ok(e)
    }

    fn install(&mut self, streams: Vec<Option<Conn>>) -> Result<()> {
        for (p, s) in streams.into_iter().enumerate() {
            if let Some(s) = s {
                let mut stream = match s {
                    Conn::Tcp(t) => {
                        t.set_nonblocking(true)?;
                        Stream::Tcp(mio::net::TcpStream::from_std(t))
                    }
                    Conn::Unix(u) => {
                        u.set_nonblocking(true)?;
                        Stream::Unix(mio::net::UnixStream::from_std(u))
                    }
                };
                self.poll.registry().register(
                    stream.source(),
                    Token(p),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                self.peers[p] = Some(Peer::new(stream));
            }
        }
        self.shared.initialized.store(true, Ordering::Release);
        Ok(())
    }

    /// Installs the group's shared-memory state and publishes the verdict.
    pub(crate) fn set_shm(&mut self, shm: ShmState) {
        let on = matches!(shm, ShmState::On(_));
        self.shared
            .shm
            .store(if on { 1 } else { 2 }, Ordering::Relaxed);
        self.shm = shm;
    }

    fn ensure_connected(&mut self) -> Result<()> {
        if let Some(c) = self.connector.take() {
            let shared = self.shared.clone();
            let aborted = move || lock(&shared.queue).stop.is_some();
            let streams = c.connect(&self.id, &aborted)?;
            let shm = c.shared_memory(&self.id, &streams)?;
            self.set_shm(shm);
            self.install(streams)?;
        }
        Ok(())
    }

    /// Runs `f`, turning a panic (a bug in the engine) into the group's failure, so that every
    /// pending and later op gets an error instead of waiting forever on a dead driver.
    pub(crate) fn guarded<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> Option<R> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut *self))) {
            Ok(r) => Some(r),
            Err(p) => {
                let what = panic_text(&*p);
                self.cur = None;
                self.sweeping = false;
                self.draining = false;
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
            if self.stopping {
                return true;
            }
            if let Some(op) = self.pending.pop_front() {
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
            if self.stopping || done() {
                return;
            }
            if let Some(op) = self.pending.pop_front() {
                self.run_coll(op);
                continue;
            }
            // Our op is queued behind nothing and not complete: cannot happen, but never spin.
            self.poll_once(Some(Duration::from_millis(10)));
        }
    }

    /// True while point-to-point ops are pending or frames wait to be written.
    pub(crate) fn has_pending_io(&self) -> bool {
        !self.pending.is_empty()
            || !self.p2p.is_empty()
            || self
                .peers
                .iter()
                .flatten()
                .any(|p| p.open && !p.tx.is_empty())
    }

    /// True once a stop was seen.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// Last act of the worker: say bye (orderly shutdown) and close every socket.
    pub(crate) fn finish(&mut self) {
        if self.graceful {
            // Tell every peer we leave on purpose, and give the frames up to 1 s to go out.
            // A failed group says why first: a peer that still needs us then fails with the
            // cause (which may not have reached it yet), not only with "rank r has shut down".
            let why = self
                .failed_before_stop
                .as_ref()
                .map(|e| e.message().as_bytes().to_vec());
            for p in 0..self.peers.len() {
                if self.peers[p].as_ref().is_some_and(|x| x.open) {
                    if let Some(text) = &why {
                        let h = control_header(Kind::Error, text.len());
                        self.push_tx(p, h, TxData::Owned(text.clone()), Owner::Nobody);
                    }
                    let h = control_header(Kind::Bye, 0);
                    self.push_tx(p, h, TxData::Owned(Vec::new()), Owner::Nobody);
                }
            }
            let deadline = Instant::now() + Duration::from_secs(1);
            while self
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
        for p in self.peers.iter_mut().flatten() {
            p.stream.shutdown();
            p.open = false;
        }
    }

    fn ctx(&self) -> String {
        format!(
            "ProcessGroupGloo (group {}, rank {})",
            self.id.group_name, self.id.rank
        )
    }

    // ------------------------------------------------------------------------------------------
    // Submissions

    fn drain(&mut self) {
        let (subs, stop) = {
            let mut q = lock(&self.shared.queue);
            (std::mem::take(&mut q.subs), q.stop.clone())
        };
        for s in subs {
            match s {
                Submission::Coll(op) => self.pending.push_back(op),
                Submission::P2p(op) => self.start_p2p(op),
            }
        }
        if let Some(e) = stop {
            self.graceful = lock(&self.shared.queue).graceful;
            self.stopping = true;
            self.failed_before_stop = self.failed.clone();
            self.fail_group(e.clone(), false);
            // When the group had failed before, `fail_group` did nothing; collectives queued
            // since (taken in this same drain) will never run, so they fail here.
            let err = self.failed.clone().unwrap_or(e);
            self.fail_pending_colls(&err);
        }
    }

    fn run_coll(&mut self, op: CollOp) {
        let CollOp {
            info,
            timeout,
            mut leases,
            body,
            completer,
        } = op;
        self.coll_cur = info.coll_seq;
        let res = if let Some(e) = self.failed.clone() {
            Err(op_failed(&info, self.id.rank, &e))
        } else if let Err(e) = self.ensure_connected() {
            self.fail_group(e.clone(), false);
            Err(op_failed(&info, self.id.rank, &e))
        } else {
            completer.mark_started();
            self.cur = Some(info);
            let mut comm = Comm::new(self, info, timeout);
            // A bug in an algorithm must not kill the engine (every later op would hang):
            // the panic becomes this op's error and fails the group, whose state is suspect.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                match leases.host_slices() {
                    Ok((ins, outs)) => body(&mut comm, ins, outs),
                    Err(e) => Err(e),
                }
            }));
            drop(comm);
            self.cur = None;
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
        self.coll_cur = info.coll_seq + 1;
        drop(leases);
        completer.complete(res);
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    // ------------------------------------------------------------------------------------------
    // Posting (collectives)

    // ------------------------------------------------------------------------------------------
    // Event loop

    /// Waits for events (at most `timeout`, or until the nearest p2p deadline or liveness probe)
    /// and handles them.
    fn poll_once(&mut self, timeout: Option<Duration>) {
        let now = Instant::now();
        let t = match (timeout, self.next_p2p_wake()) {
            _ if self.has_backlog() => Some(Duration::ZERO),
            (Some(t), Some(d)) => Some(t.min(d.saturating_duration_since(now))),
            (None, Some(d)) => Some(d.saturating_duration_since(now)),
            (t, None) => t,
        };
        if let Err(e) = self.poll.poll(&mut self.events, t) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                let err = DistError::network(format!("{}: epoll failed: {e}", self.ctx()));
                self.fail_group(err, false);
            }
            return;
        }
        let mut evs: smallvec::SmallVec<[(Token, bool, bool, bool); 16]> =
            smallvec::SmallVec::new();
        for ev in self.events.iter() {
            evs.push((
                ev.token(),
                ev.is_readable() || ev.is_read_closed() || ev.is_error(),
                ev.is_writable() || ev.is_error(),
                ev.is_read_closed() || ev.is_error(),
            ));
        }
        for (tok, r, w, closed) in evs {
            if tok == WAKER {
                self.drain();
                continue;
            }
            if closed {
                self.peer_closing(tok.0);
            }
            if r {
                self.on_readable(tok.0);
            }
            if w {
                self.flush(tok.0);
            }
        }
        self.read_backlog();
        self.after_poll();
        if !self.p2p.is_empty() {
            self.expire_p2p();
        }
    }

    fn on_readable(&mut self, p: usize) {
        let mut steps = 0;
        loop {
            if !self.may_read(p, steps) {
                return;
            }
            steps += 1;
            let step = match self.peers[p].as_mut() {
                Some(peer) if peer.open => read_step(peer),
                _ => return,
            };
            match step {
                ReadStep::Block => return,
                ReadStep::More => {}
                ReadStep::Lost(why) => return self.peer_lost(p, why),
                ReadStep::Header(h) => {
                    let dest = self.classify(p, &h);
                    if h.nbytes == 0 {
                        self.finish_frame(p, h, dest);
                    } else if let Some(peer) = self.peers[p].as_mut() {
                        peer.rx = Rx::Payload {
                            hdr: h,
                            dest,
                            got: 0,
                        };
                    }
                }
                ReadStep::Done(h, dest) => self.finish_frame(p, h, dest),
            }
        }
    }

}

/// `now + t`, or a deadline a century away when that overflows (`Duration::MAX` = no deadline).
pub(crate) fn deadline_after(t: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(t)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}
