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
//!   hop at all; this is what brings a 2-rank 1 KiB all-reduce over sockets to 9.2–14 µs (the
//!   README's table);
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
//!
//! A lost connection, a failed write or a peer that left while still needed is *recorded* where
//! it is noticed (often deep inside the read handler of another frame) and *handled* once the
//! step that noticed it is done: after each batch of events, after each submission started,
//! after each post or check of the running algorithm (see `Engine::handle_faults` in
//! `faults.rs`). Handling reads what the peers already sent (a sweep) before failing the group,
//! so that the error names every broken connection, or an error frame read meanwhile explains
//! more; since it never runs inside the read handler, it needs no re-entrancy guard. A mismatch
//! or an error frame fails the group directly: nothing more is to be read first.
//!
//! # Which file owns what
//!
//! | file | owns |
//! |------|------|
//! | `mod.rs` | [`Engine`] (its state, grouped by the parts below) and its constructor, [`Ident`], [`deadline_after`] |
//! | `submit.rs` | [`Queue`] and [`Shared`] (what the user-facing handle shares with the engine), the submitted ops ([`CollOp`], [`P2pOp`]), [`worker_loop`], the drive loops, `drain` (taking submissions), `run_coll`, `finish`, `guarded` (a panic fails the group) |
//! | `setup.rs` | [`Links`]: connections on demand (dialling a lower peer when first needed, adopting what the accept thread delivers, the eager set-up's ring neighbours), the identities that say who shares this host, the shared-memory verdict |
//! | `poll.rs` | the event loop: `poll_once` (one `epoll` wait and its batch of events), `on_readable` / `read_all` (reading a peer frame by frame) |
//! | `conn.rs` | connection I/O: `Peer` (over `transport::Conn`, the one connection type for TCP and Unix streams), the write queue (`push_tx`, `flush`, `linger`), the receive state machine (`read_step`), SO_RCVLOWAT |
//! | `matching.rs` | where an arriving frame goes (`classify`, deciding its `Dest`) and what its end means (`finish_frame`); posting a collective's sends and receives; early frames; the mismatch error |
//! | `p2p.rs` | point-to-point ops: start, matching by tag and source, the unexpected queue, completion, deadlines |
//! | `faults.rs` | a peer lost or gone, recording and handling faults (`handle_faults`, the sweep), `fail_group`, detaching buffers |
//! | `comm.rs` | [`Comm`], the algorithms' view of the engine (waits, whole-buffer exchanges, time-out texts, checks for the shared-memory and cross-memory-attach paths, verdicts, scratch buffers) |
//! | `posts.rs` | [`Posts`]: posting sends and receives of parts of registered buffers by handle and byte range, folds and copies between parts — the only place that turns an algorithm's buffers into pointers (and argues why that is sound) |
//! | `flow.rs` | read budget per event and back-pressure on peers that run ahead |
//! | `liveness.rs` | ping/pong probes that name a silent rank; time-out notes |
//! | `dest.rs` | leaf: `Dest`, where an arriving frame's payload lands, and the bytes a read fills (`dest_slice`) |
//! | `op_info.rs` | leaf: [`OpInfo`], what identifies a collective on the wire and in error texts |
//! | `fault_texts.rs` | leaf: the error texts of failed ops (`op_failed`, `p2p_failed`, [`blaming`], `rank_list`, `panic_text`) |
//! | `lock.rs` | leaf: [`lock`], a shared mutex locked, poisoned or not |
//! |||
//! | **layers** | leaves (`dest`, `op_info` ← `fault_texts`, `lock`, `flow`) ← `conn` ← `setup`, `liveness`, `poll` ← `comm` ← `posts`, `submit` ← `faults`, `matching` ← `p2p`; a module names only modules to its left (`mod.rs` names them all; children use the [`Engine`] it defines). `cargo xtask lint` checks that no two modules import each other (`xtask/src/module_cycles.rs`) |
//!
//! # How a collective flows through the engine
//!
//! 1. `ProcessGroupGloo::submit` (`process_group.rs`) pushes a [`Submission`] on the [`Queue`]
//!    and either drives the engine inline (`Engine::drive_until`) or wakes the worker
//!    ([`worker_loop`], `Engine::drive_until_idle`); both live in `submit.rs`. A blocking call
//!    that finds the engine free and nothing queued skips the queue: `Engine::run_now`.
//! 2. The driver `drain`s the queue: collectives wait in `Colls::pending`, point-to-point ops
//!    start at once (`p2p.rs`).
//! 3. `run_coll` takes the next collective: it connects first under lazy init (`setup.rs`),
//!    checks the group has not failed, and runs the op's body with a [`Comm`] (`comm.rs`) that
//!    carries the op's deadline; the body's result completes the op's `Work`.
//! 4. The algorithm posts sends (`push_tx` queues the frame and writes what it can, `conn.rs`)
//!    and receives (`post_coll_recv`, `matching.rs`: from an early frame at once, else queued
//!    on the peer) and waits (`wait_ids`): while not done it probes liveness when due and calls
//!    `poll_once` (`poll.rs`), which flushes writable peers and reads readable ones
//!    (`read_step`, `classify`: payloads go straight into the posted buffers; `finish_frame`
//!    marks the receive done).
//! 5. Faults noticed on the way are handled after each step (see "Faults"); a failed or timed
//!    out op detaches what it posted (`detach_ids`) before its `Comm` is dropped, so no frame is
//!    ever read into or written from memory the op has given back.

mod comm;
mod conn;
mod dest;
mod fault_texts;
mod faults;
mod flow;
mod liveness;
mod lock;
mod matching;
mod op_info;
mod p2p;
mod poll;
mod posts;
mod setup;
mod submit;

pub(crate) use comm::Comm;
pub(crate) use fault_texts::blaming;
pub(crate) use lock::lock;
pub(crate) use op_info::OpInfo;
pub(crate) use posts::{Buf, Posts};
pub(crate) use setup::Links;
pub(crate) use submit::{worker_loop, CollBody, CollOp, P2pOp, Queue, Shared, Submission};

use comm::AlgoState;
use conn::Net;
use faults::Faults;
use matching::Colls;
use mio::{Events, Poll, Token};
use p2p::P2p;
use std::sync::Arc;
use submit::Stop;

/// The token of the poll set's waker (submissions queued, stop requested).
pub(crate) const WAKER: Token = Token(usize::MAX);

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

/// The worker's state. Lives on the worker thread only.
pub(crate) struct Engine {
    /// What the engine shares with the user-facing handle: queue, failure, verdicts.
    shared: Arc<Shared>,
    /// This rank in the group.
    pub(crate) id: Ident,
    /// The peer connections and their poll set (`conn.rs`, `setup.rs`, `poll.rs`).
    net: Net,
    /// How the engine reaches its peers (`setup.rs`).
    links: Links,
    /// Queued and running collectives, their posted receives and early frames (`matching.rs`).
    colls: Colls,
    /// Pending point-to-point ops and the frames nobody waits for yet (`p2p.rs`).
    p2p: P2p,
    /// Whether and why the group failed; peers that left; faults not handled yet (`faults.rs`).
    faults: Faults,
    /// Whether a stop (abort, shutdown) was seen, and how to leave (`submit.rs`).
    stop: Stop,
    /// What the algorithms keep between ops: verdicts, shared memory, scratch (`comm.rs`).
    algo: AlgoState,
    /// The last id given to a posted send or receive.
    next_id: u64,
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
    /// The engine of group member `id`, connected to nobody yet: peers connect when an op first
    /// needs them (`setup.rs`).
    pub(crate) fn new(shared: Arc<Shared>, poll: Poll, id: Ident, links: Links) -> Engine {
        let n = id.size;
        Engine {
            shared,
            id,
            net: Net {
                poll,
                events: Events::with_capacity(256),
                peers: (0..n).map(|_| None).collect(),
                waiting: Default::default(),
            },
            links,
            colls: Colls::new(n),
            p2p: P2p::default(),
            faults: Faults::new(n),
            stop: Stop::default(),
            algo: AlgoState::default(),
            next_id: 1,
            live: liveness::Liveness::new(n),
            flow: flow::Flow::new(n),
        }
    }

    /// "ProcessGroupGloo (group G, rank R)", the prefix of the engine's error texts.
    fn ctx(&self) -> String {
        format!(
            "ProcessGroupGloo (group {}, rank {})",
            self.id.group_name, self.id.rank
        )
    }

    /// A fresh id for a posted send or receive (collective or point-to-point).
    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

pub(crate) use crate::transport::deadline_after;
