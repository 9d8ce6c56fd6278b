//! Reading fairly and within bounds: a read budget per readiness event, and back-pressure on
//! peers that run ahead.
//!
//! * A peer that sends faster than this rank reads would keep [`Engine::on_readable`] busy
//!   forever (the socket never runs dry), so no deadline would ever be checked and the other
//!   peers would starve. After [`READ_BUDGET`] read steps the peer is put on a backlog and the
//!   next poll returns at once to read it again (epoll is edge-triggered: no new event would
//!   come for bytes already waiting).
//! * Frames of collectives this rank has not reached yet (a non-root of a reduce loop can run
//!   thousands of ops ahead of its root) are kept in memory. Once a peer's early frames exceed
//!   [`EARLY_BUDGET`] bytes, reading from it pauses, so its bytes wait in the kernel and TCP (or
//!   the Unix socket) slows the sender down, as PyTorch's Gloo does by reading only into posted
//!   buffers. Reading resumes when the early frames fall below half the budget, when a
//!   point-to-point receive may need that peer's stream, when the group fails, or for good when
//!   the peer's side of the connection closes or fails (what is left to read is bounded then, and
//!   an error frame or the end of the stream may be behind it: a dead peer is seen at once). Frames of the
//!   op this rank runs now are never behind a peer's early frames (each peer sends in op order),
//!   so a pause cannot hold back what an op waits for.

use super::Engine;

/// Read steps on one peer per readiness event before the others get a turn.
const READ_BUDGET: usize = 256;
/// Bytes of early frames kept per peer before reading from it pauses.
const EARLY_BUDGET: usize = 64 << 20;

/// Per-engine flow state.
pub(super) struct Flow {
    /// Peers that may have unread bytes no new event will announce.
    backlog: Vec<usize>,
    /// Per peer: bytes of early frames kept.
    early_bytes: Vec<usize>,
    /// Per peer: reading paused (early budget spent).
    paused: Vec<bool>,
    /// Per peer: its side of the connection closed or failed; never paused again.
    closing: Vec<bool>,
}

impl Flow {
    /// State for a group of `n` ranks.
    pub(super) fn new(n: usize) -> Flow {
        Flow {
            backlog: Vec::new(),
            early_bytes: vec![0; n],
            paused: vec![false; n],
            closing: vec![false; n],
        }
    }
}

impl Engine {
    /// Whether reading from `p` may go on after `steps` read steps of this event; when not, `p`
    /// is remembered (backlog) or left paused. (Fault handling reads everything, see
    /// `Engine::read_all`.)
    pub(super) fn may_read(&mut self, p: usize, steps: usize) -> bool {
        if self.flow.paused[p] {
            return false;
        }
        if steps >= READ_BUDGET {
            self.remember(p);
            return false;
        }
        true
    }

    pub(super) fn remember(&mut self, p: usize) {
        if !self.flow.backlog.contains(&p) {
            self.flow.backlog.push(p);
        }
    }

    /// Whether some peer must be read again without waiting for an event.
    pub(super) fn has_backlog(&self) -> bool {
        !self.flow.backlog.is_empty()
    }

    /// Reads the peers on the backlog (each again within its budget).
    pub(super) fn read_backlog(&mut self) {
        for p in std::mem::take(&mut self.flow.backlog) {
            self.on_readable(p);
        }
    }

    /// Accounts an early frame of `n` bytes from `p`; pauses `p` past the budget unless a
    /// point-to-point receive may be waiting for its stream.
    pub(super) fn early_added(&mut self, p: usize, n: usize) {
        self.flow.early_bytes[p] += n;
        if self.flow.early_bytes[p] > EARLY_BUDGET && !self.flow.closing[p] && !self.p2p_may_need(p)
        {
            self.flow.paused[p] = true;
        }
    }

    /// Accounts an early frame of `n` bytes from `p` taken (or dropped); resumes `p` below half
    /// the budget.
    pub(super) fn early_taken(&mut self, p: usize, n: usize) {
        let b = &mut self.flow.early_bytes[p];
        *b = b.saturating_sub(n);
        if *b <= EARLY_BUDGET / 2 {
            self.resume(p);
        }
    }

    /// The connection to `p` was closed or failed on its side: read it to the end from now on.
    pub(super) fn peer_closing(&mut self, p: usize) {
        if let Some(c) = self.flow.closing.get_mut(p) {
            *c = true;
            self.resume(p);
        }
    }

    /// Resumes reading from `p` (if paused).
    pub(super) fn resume(&mut self, p: usize) {
        if std::mem::take(&mut self.flow.paused[p]) {
            self.remember(p);
        }
    }

    /// Every early frame was dropped (the group failed): resume every peer.
    pub(super) fn early_cleared(&mut self) {
        for p in 0..self.flow.paused.len() {
            self.flow.early_bytes[p] = 0;
            self.resume(p);
        }
    }

    /// Whether `p` is paused: it ran ahead, so it is alive even if its pong is not read yet.
    pub(super) fn is_paused(&self, p: usize) -> bool {
        self.flow.paused[p]
    }

    /// Whether a posted point-to-point receive may match a frame from `p`.
    fn p2p_may_need(&self, p: usize) -> bool {
        self.p2p.recvs.iter().any(|id| {
            self.p2p
                .ops
                .get(id)
                .is_some_and(|r| r.peer.is_none_or(|q| q == p))
        })
    }
}
