//! Faults: a peer that left (bye) or was lost (EOF, reset, failed write), recorded where it is
//! noticed and handled after the step that noticed it (`handle_faults`, with the sweep that reads
//! what the other peers already sent so that the error names every broken connection, or an
//! error frame explains more; a text a peer passed on from a third rank waits for that sweep,
//! since it may be about our own connection), failing the group (every pending and later op
//! gets the error; the peers are told), and detaching the buffers of ops that failed or timed
//! out. The error texts of failed ops are `fault_texts.rs`.

use super::conn::{control_header, Owner, Rx, TxData, LINGER};
use super::dest::Dest;
use super::fault_texts::{blaming, op_failed, p2p_failed};
use super::lock::lock;
use super::submit::CollOp;
use super::Engine;
use crate::wire::{Header, Kind, PASSED_ON};
use c10d_core::DistError;
use mio::unix::SourceFd;
use std::time::Instant;

/// Whether and why the group failed, and the faults noticed but not handled yet.
pub(super) struct Faults {
    /// The group's failure: every pending and later op fails with it.
    pub(super) failed: Option<DistError>,
    /// Peers that said bye: EOF from them is expected; needing them later is an error.
    pub(super) left: Vec<bool>,
    /// Recorded while handling events or posting, handled right after (see
    /// [`Engine::handle_faults`]): peers whose write failed (and why).
    broken: Vec<(usize, String)>,
    /// Connections found closed or failed (and why); they are closed already.
    lost: Vec<(usize, String)>,
    /// Peers that left while still needed.
    needed: Vec<usize>,
    /// The first error text a peer passed on from another rank (peer, text).
    passed_on: Option<(usize, Vec<u8>)>,
    /// The failure's text when it is another rank's, passed on to us (`failed` wraps it as
    /// "rank p reported: …").
    relayed: Option<Vec<u8>>,
}

impl Faults {
    /// State for a group of `n` ranks: not failed, nobody left, nothing recorded.
    pub(super) fn new(n: usize) -> Faults {
        Faults {
            failed: None,
            left: vec![false; n],
            broken: Vec::new(),
            lost: Vec::new(),
            needed: Vec::new(),
            passed_on: None,
            relayed: None,
        }
    }

    /// Whether faults wait to be handled.
    pub(super) fn recorded(&self) -> bool {
        !self.broken.is_empty()
            || !self.lost.is_empty()
            || !self.needed.is_empty()
            || self.passed_on.is_some()
    }

    /// The error frame that tells a peer of the failure, if any: (text, step), step
    /// [`PASSED_ON`] for another rank's text, else 0 with our own error's text.
    pub(super) fn told(&self) -> Option<(Vec<u8>, u32)> {
        match (&self.relayed, &self.failed) {
            (Some(text), _) => Some((text.clone(), PASSED_ON)),
            (None, Some(e)) => Some((e.message().as_bytes().to_vec(), 0)),
            (None, None) => None,
        }
    }

    /// Whether the connection to `p` was recorded as lost (not handled yet).
    pub(super) fn is_lost(&self, p: usize) -> bool {
        self.lost.iter().any(|(q, _)| *q == p)
    }

    /// Forgets the recorded faults (the engine failed the group for a worse reason: a panic).
    pub(super) fn forget(&mut self) {
        self.broken.clear();
        self.lost.clear();
        self.needed.clear();
        self.passed_on = None;
    }
}

impl Engine {
    /// A write to `p` failed (`why`): the peer is lost, once what it sent before is read (see
    /// [`Engine::handle_faults`]).
    pub(super) fn write_failed(&mut self, p: usize, why: String) {
        // Once the group failed there is nothing left to explain: the connection is closed at
        // once, so no write to it is tried again (e.g. while `fail_group` lingers).
        if self.faults.failed.is_some() {
            return self.peer_lost(p, why);
        }
        if !self.faults.broken.iter().any(|(q, _)| *q == p) {
            self.faults.broken.push((p, why));
        }
    }

    /// Connecting to `p` failed (`e`): recorded as a lost connection (see
    /// [`Engine::handle_faults`]), so the op fails naming `p`.
    pub(super) fn unreachable(&mut self, p: usize, e: DistError) {
        if self.faults.failed.is_none() && !self.faults.is_lost(p) {
            self.faults
                .lost
                .push((p, format!("could not connect: {}", e.message())));
        }
    }

    /// A peer said bye: fine unless something still needs it.
    pub(super) fn peer_left(&mut self, p: usize) {
        self.faults.left[p] = true;
        let recv_needed = !self.colls.posted[p].is_empty()
            || self.net.peers[p].as_ref().is_some_and(|x| {
                matches!(x.rx, Rx::Payload { .. }) || x.tx.iter().any(|m| m.owner != Owner::Nobody)
            });
        if recv_needed && self.faults.failed.is_none() {
            self.fail_left(p);
            return;
        }
        let waiting: Vec<u64> = self
            .p2p
            .ops
            .iter()
            .filter(|(_, x)| x.peer == Some(p))
            .map(|(id, _)| *id)
            .collect();
        for id in waiting {
            let e = self.left_error(p);
            let (op, seq) = (self.p2p.ops[&id].op, self.p2p.ops[&id].seq);
            self.detach_ids(&[id], false);
            self.complete_p2p(id, Err(p2p_failed(op, seq, &self.id, &e)), None);
        }
    }

    /// Records that `p` left while still needed: the group fails with it (see
    /// [`Engine::handle_faults`]) unless what the other peers already sent (an error frame: `p`
    /// may have left *because* of a failure elsewhere) explains more.
    pub(super) fn fail_left(&mut self, p: usize) {
        if !self.faults.needed.contains(&p) {
            self.faults.needed.push(p);
        }
    }

    pub(super) fn left_error(&self, p: usize) -> DistError {
        let e = DistError::backend(format!(
            "{}: {} has shut down its process group{}",
            self.ctx(),
            self.id.peer_name(p),
            self.notes_of(std::iter::once(p))
        ));
        blaming(e, [p])
    }

    /// The connection to `p` is gone (`why`): it is closed at once and, unless `p` had left or
    /// the group failed already, recorded (see [`Engine::handle_faults`]).
    pub(super) fn peer_lost(&mut self, p: usize, why: String) {
        if let Some(peer) = self.net.peers[p].as_mut() {
            if !peer.open {
                return;
            }
            peer.open = false;
            let fd = peer.stream.raw_fd();
            let _ = self.net.poll.registry().deregister(&mut SourceFd(&fd));
        }
        // (Once the group failed, a lost connection explains nothing new.)
        if self.faults.left[p] || self.faults.failed.is_some() {
            return;
        }
        self.faults.lost.push((p, why));
    }

    /// Handles the faults recorded since the last call. Faults are recorded, never handled, where
    /// they are noticed (inside the read handler, a flush, a post), and handled here once the
    /// step that noticed them is done: after each batch of events (see `poll.rs`), after each
    /// submission started (`drain`), after each post or check of the running algorithm (see
    /// `comm.rs`) and after each write the driver starts on its own (liveness probes and
    /// answers, time-out notes). So handling one never re-enters the read handler of a peer
    /// whose frame is half handled, and no guard flag is needed.
    ///
    /// 1. A peer whose write failed is read to the end first: the write failed (EPIPE/reset)
    ///    because the peer closed, and what it sent before closing (its frames, an error text, a
    ///    bye) may still be unread in our socket buffer and explains the failure better than the
    ///    write error. Then it is lost.
    /// 2. When connections were lost or a peer left while needed, every open peer is read up to
    ///    what it already sent (a sweep): when one process dies, others may die or exit because
    ///    of it at nearly the same time, so the error names every peer whose connection is gone
    ///    (the dead one included, whichever we noticed first), and an error frame read meanwhile
    ///    fails the group with its text, which explains more.
    /// 3. Unless something failed the group meanwhile, it fails with the lost connections, else
    ///    with the first peer that left while needed, else with an error text a peer passed on
    ///    (it may be about our own connection, whose loss the sweep read: our own view of it,
    ///    naming the other end, is the better error; an error frame of the rank that failed
    ///    first still wins, as in 2).
    pub(super) fn handle_faults(&mut self) {
        while self.faults.recorded() {
            for (p, why) in std::mem::take(&mut self.faults.broken) {
                if self.faults.failed.is_none() {
                    self.read_all(p);
                }
                self.peer_lost(p, why);
            }
            let passed_on = self.faults.passed_on.is_some();
            if self.faults.lost.is_empty() && self.faults.needed.is_empty() && !passed_on {
                continue;
            }
            self.sweep();
            self.fail_lost();
            self.fail_needed();
            if let Some((p, text)) = self.faults.passed_on.take() {
                self.fail_reported(p, &text);
            }
        }
    }

    /// `p` passed on another rank's error text: recorded (the first), handled after the step.
    pub(super) fn passed_on_to_us(&mut self, p: usize, text: Vec<u8>) {
        if self.faults.failed.is_none() && self.faults.passed_on.is_none() {
            self.faults.passed_on = Some((p, text));
        }
    }

    /// Fails the group with the error text `p` sent (unless it failed already), and passes the
    /// text on unchanged to the peers we talk to: with connections on demand, most ranks have
    /// no connection to the one that failed first.
    pub(super) fn fail_reported(&mut self, p: usize, text: &[u8]) {
        if self.faults.failed.is_some() {
            return;
        }
        let e = DistError::backend(format!(
            "{} reported: {}",
            self.id.peer_name(p),
            String::from_utf8_lossy(text)
        ));
        self.fail_group(e, false);
        self.faults.relayed = Some(text.to_vec());
        self.pass_on(p, text);
    }

    /// Reads what every open peer already sent, budget and pauses aside (error frames fail the
    /// group with their text; closed connections are recorded).
    pub(super) fn sweep(&mut self) {
        for q in 0..self.net.peers.len() {
            if self.net.peers[q].as_ref().is_some_and(|x| x.open) {
                self.read_all(q);
            }
        }
    }

    /// Fails the group with the first peer recorded as having left while needed (unless
    /// something already failed it).
    fn fail_needed(&mut self) {
        let needed = std::mem::take(&mut self.faults.needed);
        if let Some(&p) = needed.first() {
            if self.faults.failed.is_none() {
                self.fail_group(self.left_error(p), false);
            }
        }
    }

    /// Fails the group with the lost connections recorded (if any, and unless something already
    /// failed it, e.g. an error frame read while sweeping).
    fn fail_lost(&mut self) {
        let mut lost = std::mem::take(&mut self.faults.lost);
        if lost.is_empty() || self.faults.failed.is_some() {
            return;
        }
        lost.sort_by_key(|(q, _)| *q);
        let names: Vec<String> = lost.iter().map(|(q, _)| self.id.peer_name(*q)).collect();
        let whys: Vec<String> = lost.iter().map(|(q, w)| format!("rank {q}: {w}")).collect();
        let e = DistError::backend(format!(
            "{}: connection to {} lost ({}); the peer process died or left the group{}",
            self.ctx(),
            names.join(", "),
            whys.join("; "),
            self.notes_of(lost.iter().map(|(q, _)| *q))
        ));
        let e = blaming(e, lost.iter().map(|(q, _)| *q));
        // Tell the survivors: a peer that only sees *us* leave (we may exit as soon as the
        // error reaches the user) then still learns which rank died first.
        self.fail_group(e, true);
    }

    /// Fails every queued collective with `err` (releasing its leases first).
    pub(super) fn fail_pending_colls(&mut self, err: &DistError) {
        while let Some(CollOp {
            info,
            leases,
            completer,
            ..
        }) = self.colls.pending.pop_front()
        {
            drop(leases);
            completer.complete(Err(op_failed(&info, &self.id, err)));
        }
    }

    /// Fails the group: every pending and later op gets `err`. With `tell_peers`, an error frame
    /// carries the text to every peer so that they fail with the same explanation.
    pub(super) fn fail_group(&mut self, err: DistError, tell_peers: bool) {
        if self.faults.failed.is_some() {
            return;
        }
        log::warn!("{}: group failed: {err}", self.ctx());
        self.faults.failed = Some(err.clone());
        *lock(&self.shared.failed) = Some(err.clone());
        self.detach_everything();
        if tell_peers {
            self.tell_peers(&err);
        }
        let ids: Vec<u64> = self.p2p.ops.keys().copied().collect();
        for id in ids {
            let (op, seq) = (self.p2p.ops[&id].op, self.p2p.ops[&id].seq);
            self.complete_p2p(id, Err(p2p_failed(op, seq, &self.id, &err)), None);
        }
        self.fail_pending_colls(&err);
    }

    /// Detaches every borrowed buffer (in-flight frames finish from a copy, queued ones are
    /// dropped) and drops every frame kept for later (early, unexpected).
    fn detach_everything(&mut self) {
        for peer in self.net.peers.iter_mut().flatten() {
            peer.detach(|_| true);
        }
        self.net.waiting.clear();
        for q in &mut self.colls.posted {
            q.clear();
        }
        for q in &mut self.colls.early {
            q.clear();
        }
        self.early_cleared();
        self.p2p.unexpected.clear();
    }

    /// Sends the failure `err` to every open peer as an error frame and, before any waiter hears
    /// of the failure (its process may exit right away), gives the frames a moment to leave.
    fn tell_peers(&mut self, err: &DistError) {
        self.send_error(usize::MAX, err.message().as_bytes(), 0);
    }

    /// Passes the error text `text` from `from` on to every other connected peer.
    fn pass_on(&mut self, from: usize, text: &[u8]) {
        self.send_error(from, text, PASSED_ON);
    }

    /// Sends the error text `text` (`step`: 0 or [`PASSED_ON`]) to every connected peer but
    /// `skip`, and gives the frames a moment to go out.
    fn send_error(&mut self, skip: usize, text: &[u8], step: u32) {
        for p in 0..self.net.peers.len() {
            if p != skip && self.net.peers[p].as_ref().is_some_and(|x| x.open) {
                self.push_error(p, text, step);
            }
        }
        self.linger(Instant::now() + LINGER);
    }

    /// Queues an error frame with `text` (`step`: 0 or [`PASSED_ON`]) to peer `p`.
    pub(super) fn push_error(&mut self, p: usize, text: &[u8], step: u32) {
        let h = Header {
            step,
            ..control_header(Kind::Error, text.len())
        };
        self.push_tx(p, h, TxData::Owned(text.to_vec()), Owner::Nobody);
    }

    /// Detaches posted buffers of the given ids: queued sends are dropped (or finished from a
    /// copy when partly written), posted receives are removed (a partly received frame is
    /// drained into the void). With `coll`, ids are collective ids, else p2p ids.
    pub(super) fn detach_ids(&mut self, ids: &[u64], coll: bool) {
        if ids.is_empty() {
            return;
        }
        let owns = |o: Owner| match o {
            Owner::Coll(i) => coll && ids.contains(&i),
            Owner::P2p(i) => !coll && ids.contains(&i),
            Owner::Nobody => false,
        };
        for peer in self.net.peers.iter_mut().flatten() {
            peer.detach(owns);
        }
        // Frames for peers not connected yet were never started: they simply go.
        for q in self.net.waiting.values_mut() {
            q.retain(|m| !owns(m.owner));
        }
        if coll {
            for q in &mut self.colls.posted {
                q.retain(|r| !ids.contains(&r.id));
            }
            for i in ids {
                self.colls.done.remove(i);
            }
        } else {
            self.p2p.recvs.retain(|i| !ids.contains(i));
        }
    }

    /// Peers whose posted receives among `ids` have not completed.
    pub(super) fn missing_peers(&self, ids: &[u64]) -> (Vec<usize>, Vec<usize>) {
        let mut recv = Vec::new();
        for (p, q) in self.colls.posted.iter().enumerate() {
            if q.iter().any(|r| ids.contains(&r.id)) {
                recv.push(p);
            }
        }
        for (p, peer) in self.net.peers.iter().enumerate() {
            if let Some(peer) = peer {
                if let Rx::Payload {
                    dest: Dest::Coll { id, .. },
                    ..
                } = &peer.rx
                {
                    if ids.contains(id) && !recv.contains(&p) {
                        recv.push(p);
                    }
                }
            }
        }
        recv.sort_unstable();
        let mut send = Vec::new();
        for (p, peer) in self.net.peers.iter().enumerate() {
            if let Some(peer) = peer {
                if peer
                    .tx
                    .iter()
                    .any(|m| matches!(m.owner, Owner::Coll(i) if ids.contains(&i)))
                {
                    send.push(p);
                }
            }
        }
        (recv, send)
    }
}
