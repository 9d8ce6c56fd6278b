//! Point-to-point ops (`send`, `recv`, `recv` from any source): starting them, matching
//! arriving frames by tag and source in posting order (frames nobody waits for yet go to the
//! unexpected queue), completing them, and their deadlines.

use super::conn::{Owner, TxData};
use super::dest::Dest;
use super::fault_texts::p2p_failed;
use super::matching::try_zeroed;
use super::submit::P2pOp;
use super::{deadline_after, liveness, Engine};
use crate::wire::{Header, Kind};
use c10d_core::{DistError, OpType, Result, TensorLeases, WorkCompleter};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The pending point-to-point ops.
#[derive(Default)]
pub(super) struct P2p {
    /// By id: every started send and receive until it completes.
    pub(super) ops: HashMap<u64, P2pPending>,
    /// Ids of the receives waiting for a frame, in posting order.
    pub(super) recvs: Vec<u64>,
    /// Frames that arrived before a matching receive was posted.
    pub(super) unexpected: VecDeque<Unexpected>,
}

pub(super) struct P2pPending {
    pub(super) seq: u64,
    pub(super) op: OpType,
    pub(super) peer: Option<usize>,
    pub(super) tag: i64,
    pub(super) deadline: Instant,
    pub(super) timeout: Duration,
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) _leases: TensorLeases,
    pub(super) completer: WorkCompleter,
}

pub(super) struct Unexpected {
    pub(super) peer: usize,
    pub(super) hdr: Header,
    pub(super) data: Vec<u8>,
}

impl Engine {
    pub(super) fn start_p2p(&mut self, op: P2pOp) {
        let P2pOp {
            seq,
            op: kind,
            peer,
            tag,
            dtype,
            timeout,
            mut leases,
            completer,
        } = op;
        let (ptr, len) = match self.p2p_can_start(kind, seq, peer, tag, &mut leases) {
            Ok(x) => x,
            Err(e) => {
                drop(leases);
                return completer.complete(Err(e));
            }
        };
        completer.mark_started();
        let id = self.new_id();
        let pend = P2pPending {
            seq,
            op: kind,
            peer,
            tag,
            deadline: deadline_after(timeout),
            timeout,
            ptr,
            len,
            _leases: leases,
            completer,
        };
        self.p2p.ops.insert(id, pend);
        if kind == OpType::Send {
            let dst = peer.expect("send has a destination");
            let hdr = Header {
                kind: Kind::P2p,
                op: kind,
                dtype,
                step: 0,
                coll_seq: 0,
                seq,
                total: len as u64,
                nbytes: len as u64,
                tag,
            };
            self.push_tx(dst, hdr, TxData::Borrowed(ptr, len), Owner::P2p(id));
        } else {
            self.post_p2p_recv(id);
        }
    }

    /// Checks that a send/recv can start (group not failed, connected, peer not gone) and
    /// returns its buffer: the input of a send, the output of a receive.
    fn p2p_can_start(
        &mut self,
        kind: OpType,
        seq: u64,
        peer: Option<usize>,
        tag: i64,
        leases: &mut TensorLeases,
    ) -> Result<(*mut u8, usize)> {
        if let Some(e) = self.faults.failed.clone() {
            return Err(p2p_failed(kind, seq, &self.id, &e));
        }
        self.ensure_initialized();
        // A receive needs its sender's connection: we dial a lower sender (a higher one dials
        // us when it sends); from any source, every lower rank may send.
        if kind != OpType::Send {
            match peer {
                Some(p) => self.connect_peer(p),
                None => (0..self.id.rank).for_each(|p| self.connect_peer(p)),
            }
        }
        let (ins, mut outs) = leases.host_slices()?;
        let (ptr, len) = if kind == OpType::Send {
            (ins[0].as_ptr() as *mut u8, ins[0].len())
        } else {
            (outs[0].as_mut_ptr(), outs[0].len())
        };
        // A peer that left can still have sent what this receive wants (it is in the
        // unexpected queue); only sends to it, or receives nothing can satisfy, fail.
        let satisfiable = kind != OpType::Send
            && self
                .p2p
                .unexpected
                .iter()
                .any(|u| u.hdr.tag == tag && peer.is_none_or(|p| p == u.peer));
        if let Some(p) = peer.filter(|p| self.faults.left[*p] && !satisfiable) {
            return Err(p2p_failed(kind, seq, &self.id, &self.left_error(p)));
        }
        Ok((ptr, len))
    }

    /// A receive (already in `p2p`): completes from an already arrived message when one
    /// matches, else waits for its frame.
    fn post_p2p_recv(&mut self, id: u64) {
        let pend = &self.p2p.ops[&id];
        let (seq, kind, peer, tag, ptr, len) =
            (pend.seq, pend.op, pend.peer, pend.tag, pend.ptr, pend.len);
        let pos = self
            .p2p
            .unexpected
            .iter()
            .position(|u| u.hdr.tag == tag && peer.is_none_or(|p| p == u.peer));
        if let Some(i) = pos {
            let u = self.p2p.unexpected.remove(i).expect("index from position");
            if u.data.len() == len {
                // SAFETY: ptr/len describe the leased output held in `self.p2p.ops[&id]`.
                unsafe { std::ptr::copy_nonoverlapping(u.data.as_ptr(), ptr, len) };
                self.complete_p2p(id, Ok(()), Some(u.peer));
            } else {
                let e = self.p2p_size_error(seq, kind, u.peer, tag, len, u.data.len());
                self.complete_p2p(id, Err(e), Some(u.peer));
            }
            return;
        }
        self.p2p.recvs.push(id);
        // Its frame may be behind early frames of a paused peer.
        match peer {
            Some(p) => self.resume(p),
            None => (0..self.id.size).for_each(|q| self.resume(q)),
        }
    }

    pub(super) fn p2p_size_error(
        &self,
        seq: u64,
        kind: OpType,
        from: usize,
        tag: i64,
        want: usize,
        got: usize,
    ) -> DistError {
        DistError::backend(format!(
            "{}: {kind} (seq {seq}) expected {want} bytes with tag {tag} but {} sent {got} bytes",
            self.ctx(),
            self.id.peer_name(from)
        ))
    }

    pub(super) fn complete_p2p(&mut self, id: u64, res: Result<()>, source: Option<usize>) {
        if let Some(p) = self.p2p.ops.remove(&id) {
            self.p2p.recvs.retain(|x| *x != id);
            let P2pPending {
                completer, _leases, ..
            } = p;
            drop(_leases);
            if let Some(s) = source {
                completer.set_source_rank(s);
            }
            completer.complete(res);
        }
    }

    pub(super) fn expire_p2p(&mut self) {
        let now = Instant::now();
        let expired: Vec<u64> = self
            .p2p
            .ops
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            // An earlier expiry's note may have failed the group, which completed every op.
            let Some(p) = self.p2p.ops.get(&id) else {
                continue;
            };
            let (seq, op, peer, timeout, deadline) = (p.seq, p.op, p.peer, p.timeout, p.deadline);
            let missing: Vec<usize> = peer.into_iter().collect();
            let silent = self.silent_text(deadline, liveness::window(timeout), &missing);
            self.detach_ids(&[id], false);
            let who = match (op, peer) {
                (OpType::Send, Some(p)) => {
                    format!("; send to {} did not complete", self.id.peer_name(p))
                }
                (_, Some(p)) => format!("; no data from rank(s) {p}"),
                (_, None) => "; no data from any rank".to_string(),
            };
            let e = DistError::backend(format!(
                "ProcessGroupGloo (group {}): Timed out waiting {}ms for {op} (seq {seq}) on rank {}{who}{silent}",
                self.id.group_name,
                timeout.as_millis(),
                self.id.rank,
            ));
            self.send_note(e.message());
            self.handle_faults();
            self.complete_p2p(id, Err(e), None);
        }
    }

    /// Where the payload of a point-to-point frame from `p` goes: the first posted receive whose
    /// tag and source it matches (a size mismatch fails that receive), else the unexpected queue.
    pub(super) fn p2p_dest(&mut self, p: usize, h: &Header) -> Dest {
        let n = h.nbytes as usize;
        let Some(id) = self.take_p2p_recv(p, h.tag) else {
            return match try_zeroed(n) {
                Some(v) => Dest::Unexpected(v),
                None => self.unbufferable(p, h),
            };
        };
        let (len, ptr, seq, op) = {
            let r = &self.p2p.ops[&id];
            (r.len, r.ptr, r.seq, r.op)
        };
        if len != n {
            let e = self.p2p_size_error(seq, op, p, h.tag, len, n);
            self.complete_p2p(id, Err(e), Some(p));
            return Dest::Discard;
        }
        Dest::P2p { id, ptr }
    }

    /// A whole point-to-point frame from `p` that no receive was posted for when it began to
    /// arrive: a receive posted since gets it, else it waits in the unexpected queue.
    pub(super) fn p2p_arrived(&mut self, p: usize, h: Header, data: Vec<u8>) {
        let Some(id) = self.take_p2p_recv(p, h.tag) else {
            return self.p2p.unexpected.push_back(Unexpected {
                peer: p,
                hdr: h,
                data,
            });
        };
        let (len, ptr, seq, op) = {
            let r = &self.p2p.ops[&id];
            (r.len, r.ptr, r.seq, r.op)
        };
        if len == data.len() {
            // SAFETY: ptr/len is the leased output of the pending receive `id`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, len) };
            self.complete_p2p(id, Ok(()), Some(p));
        } else {
            let e = self.p2p_size_error(seq, op, p, h.tag, len, data.len());
            self.complete_p2p(id, Err(e), Some(p));
        }
    }

    /// Takes the first posted receive (in posting order) that a frame from `p` with `tag`
    /// matches, if any.
    fn take_p2p_recv(&mut self, p: usize, tag: i64) -> Option<u64> {
        let i = self.p2p.recvs.iter().position(|id| {
            let r = &self.p2p.ops[id];
            r.tag == tag && r.peer.is_none_or(|s| s == p)
        })?;
        Some(self.p2p.recvs.remove(i))
    }
}
