//! Frame matching: where the payload of an arriving frame goes (`classify`: a posted receive,
//! the early queue of a peer that runs ahead, the unexpected queue of point-to-point frames, an
//! error text, the void) and what its end means (`finish_frame`); posting a collective's sends
//! and receives (`post_coll_send`, `post_coll_recv`, which also takes frames that arrived
//! early); the mismatch error that names both ranks and both ops.

use super::conn::{Owner, Peer, Rx, TxData};
use super::dest::Dest;
use super::op_info::OpInfo;
use super::submit::CollOp;
use super::Engine;
use crate::wire::{Header, Kind, PASSED_ON};
use c10d_core::{DType, DistError};
use std::collections::{HashSet, VecDeque};

/// The collectives: queued, running, and what is posted for or arrived ahead of them.
pub(super) struct Colls {
    /// Queued, in issue order.
    pub(super) pending: VecDeque<CollOp>,
    /// Index of the collective running or next to run: frames of earlier ones are stale.
    pub(super) seq: u64,
    /// The collective running now.
    pub(super) cur: Option<OpInfo>,
    /// Its deadline (a dial it needs is bounded by it).
    pub(super) deadline: Option<std::time::Instant>,
    /// Per peer: receives posted by the running collective, in posting order.
    pub(super) posted: Vec<VecDeque<PostedRecv>>,
    /// Per peer: frames of collectives this rank has not posted yet (the peer is ahead).
    pub(super) early: Vec<VecDeque<Early>>,
    /// Ids of completed sends and receives not waited for yet.
    pub(super) done: HashSet<u64>,
    /// Reusable buffers for early / unexpected frames.
    pub(super) spare: Vec<Vec<u8>>,
}

impl Colls {
    /// State for a group of `n` ranks.
    pub(super) fn new(n: usize) -> Colls {
        Colls {
            pending: VecDeque::new(),
            seq: 0,
            cur: None,
            deadline: None,
            posted: (0..n).map(|_| VecDeque::new()).collect(),
            early: (0..n).map(|_| VecDeque::new()).collect(),
            done: HashSet::new(),
            spare: Vec::new(),
        }
    }
}

pub(super) struct PostedRecv {
    pub(super) id: u64,
    pub(super) step: u32,
    pub(super) nbytes: usize,
    pub(super) ptr: *mut u8,
}

pub(super) struct Early {
    pub(super) hdr: Header,
    pub(super) data: Vec<u8>,
}

fn matches(want: &Header, got: &Header) -> bool {
    want.kind == got.kind
        && want.op == got.op
        && want.dtype == got.dtype
        && want.coll_seq == got.coll_seq
        && want.step == got.step
        && want.total == got.total
        && want.nbytes == got.nbytes
}

/// A zeroed buffer of `n` bytes, or `None` when the allocation fails. Zeroed pages come
/// lazily from the allocator, so a big frame costs memory only as its bytes arrive.
pub(super) fn try_zeroed(n: usize) -> Option<Vec<u8>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).ok()?;
    // SAFETY: `layout` has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` comes from the global allocator with exactly the layout of a `Vec<u8>` of
    // capacity `n`, and all `n` bytes are initialised (zeroed).
    Some(unsafe { Vec::from_raw_parts(p, n, n) })
}

impl Engine {
    /// A buffer of `n` bytes for a frame that has no posted destination yet, reusing the
    /// allocation of an earlier one (avoids page faults and munmap for every early frame).
    /// `None` when `n` bytes cannot be allocated (a garbled or hostile header length).
    fn spare_buf(&mut self, n: usize) -> Option<Vec<u8>> {
        let mut v = match self.colls.spare.iter().position(|b| b.capacity() >= n) {
            Some(i) => self.colls.spare.swap_remove(i),
            None => return try_zeroed(n),
        };
        v.clear();
        v.resize(n, 0);
        Some(v)
    }

    pub(super) fn recycle(&mut self, v: Vec<u8>) {
        if v.capacity() >= 4096 && self.colls.spare.len() < 16 {
            self.colls.spare.push(v);
        }
    }

    pub(super) fn coll_header(&self, info: &OpInfo, step: u32, nbytes: usize) -> Header {
        Header {
            kind: Kind::Coll,
            op: info.op,
            dtype: info.dtype,
            step,
            coll_seq: info.coll_seq,
            seq: info.seq,
            total: info.total,
            nbytes: nbytes as u64,
            tag: 0,
        }
    }

    pub(super) fn post_coll_send(
        &mut self,
        info: &OpInfo,
        peer: usize,
        step: u32,
        ptr: *const u8,
        len: usize,
    ) -> u64 {
        let id = self.new_id();
        if self.faults.left[peer] {
            self.fail_left(peer);
            return id;
        }
        let hdr = self.coll_header(info, step, len);
        self.push_tx(peer, hdr, TxData::Borrowed(ptr, len), Owner::Coll(id));
        id
    }

    /// Posts a receive of exactly `len` bytes from `peer` into `ptr`, step `step` of the running
    /// collective `info`, and returns its id. It completes at once from a frame that arrived
    /// early, takes over a frame arriving into the early queue right now, or waits in `peer`'s
    /// queue of posted receives.
    pub(super) fn post_coll_recv(
        &mut self,
        info: &OpInfo,
        peer: usize,
        step: u32,
        ptr: *mut u8,
        len: usize,
    ) -> u64 {
        let id = self.new_id();
        self.connect_peer(peer);
        self.drop_stale_early(peer);
        if self.faults.left[peer] && self.colls.early[peer].is_empty() {
            self.fail_left(peer);
            return id;
        }
        if self.colls.posted[peer].is_empty() {
            let want = self.coll_header(info, step, len);
            let taken = match self.colls.early[peer].pop_front() {
                Some(e) => Some(self.take_early(peer, e, &want, id, ptr, len)),
                None => self.take_arriving(peer, &want, id, ptr),
            };
            match taken {
                Some(Ok(())) => return id,
                Some(Err(h)) => {
                    let err = self.mismatch_error(info, step, len, peer, &h);
                    self.fail_group(err, true);
                    return id;
                }
                None => {}
            }
        }
        self.colls.posted[peer].push_back(PostedRecv {
            id,
            step,
            nbytes: len,
            ptr,
        });
        id
    }

    /// Drops the early frames of `peer` for collectives that finished here already (timed out).
    fn drop_stale_early(&mut self, peer: usize) {
        let coll_cur = self.colls.seq;
        while self.colls.early[peer]
            .front()
            .is_some_and(|e| e.hdr.coll_seq < coll_cur)
        {
            if let Some(e) = self.colls.early[peer].pop_front() {
                self.early_taken(peer, e.data.len());
                self.recycle(e.data);
            }
        }
    }

    /// Completes the receive `id` (`len` bytes at `ptr`) from `e`, the first early frame of
    /// `peer`, when it matches `want`; else returns its header (a mismatch).
    fn take_early(
        &mut self,
        peer: usize,
        e: Early,
        want: &Header,
        id: u64,
        ptr: *mut u8,
        len: usize,
    ) -> std::result::Result<(), Header> {
        self.early_taken(peer, e.data.len());
        if !matches(want, &e.hdr) {
            return Err(e.hdr);
        }
        // SAFETY: the caller guarantees ptr/len is writable until the id is waited or
        // cancelled; we copy right now.
        unsafe { std::ptr::copy_nonoverlapping(e.data.as_ptr(), ptr, len) };
        self.colls.done.insert(id);
        self.recycle(e.data);
        Ok(())
    }

    /// A frame of this or a later collective being received from `peer` into the early queue
    /// right now: when it matches `want`, the rest of it goes into the posted buffer `ptr` (after
    /// copying what already arrived) and completes the receive `id`; else its header is returned
    /// (a mismatch). `None` when no such frame is arriving.
    fn take_arriving(
        &mut self,
        peer: usize,
        want: &Header,
        id: u64,
        ptr: *mut u8,
    ) -> Option<std::result::Result<(), Header>> {
        let coll_cur = self.colls.seq;
        let Some(Peer {
            rx: Rx::Payload { hdr, dest, got },
            ..
        }) = self.net.peers[peer].as_deref_mut()
        else {
            return None;
        };
        let Dest::Early(v) = dest else {
            return None;
        };
        if hdr.kind != Kind::Coll || hdr.coll_seq < coll_cur {
            return None;
        }
        if !matches(want, hdr) {
            return Some(Err(*hdr));
        }
        // SAFETY: the caller guarantees ptr/len is writable until the id is waited or
        // cancelled; `got <= len` bytes already arrived.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), ptr, *got) };
        let old = std::mem::replace(dest, Dest::Coll { id, ptr });
        if let Dest::Early(v) = old {
            self.recycle(v);
        }
        Some(Ok(()))
    }

    pub(super) fn mismatch_error(
        &self,
        info: &OpInfo,
        step: u32,
        len: usize,
        peer: usize,
        h: &Header,
    ) -> DistError {
        let describe = |op, seq, dtype: DType, total| {
            format!("{op} (seq {seq}, {}, {total} bytes)", dtype.torch_name())
        };
        let me = describe(info.op, info.seq, info.dtype, info.total);
        let them = describe(h.op, h.seq, h.dtype, h.total);
        let detail = if me != them {
            String::new()
        } else if h.coll_seq != info.coll_seq {
            format!(
                " (a frame of the group's collective #{} where #{} was expected: the ranks are out of step)",
                h.coll_seq, info.coll_seq
            )
        } else {
            format!(
                " (frame step {} of {} bytes where step {step} of {len} bytes was expected: the ranks chose different algorithms or sizes)",
                h.step, h.nbytes
            )
        };
        let e = DistError::backend(format!(
            "Detected mismatch between collectives in group {}: rank {} is running {me} but {} sent {them}{detail}",
            self.id.group_name,
            self.id.rank,
            self.id.peer_name(peer)
        ));
        super::fault_texts::blaming(e, [peer])
    }

    /// Decides where the payload of a frame from `p` goes.
    pub(super) fn classify(&mut self, p: usize, h: &Header) -> Dest {
        let n = h.nbytes as usize;
        match h.kind {
            Kind::Error | Kind::Note => Dest::ErrorText(vec![0; n.min(1 << 20)]),
            Kind::Bye | Kind::Ping | Kind::Pong => Dest::Discard,
            _ if self.faults.failed.is_some() => Dest::Discard,
            Kind::P2p => self.p2p_dest(p, h),
            Kind::Coll => self.coll_dest(p, h),
        }
    }

    /// Where the payload of a collective frame from `p` goes: the head of `p`'s posted receives
    /// when the frame matches it (else the group fails with a mismatch), the early queue when
    /// nothing is posted yet (`p` is ahead), the void when its collective finished here already.
    fn coll_dest(&mut self, p: usize, h: &Header) -> Dest {
        let n = h.nbytes as usize;
        if h.coll_seq < self.colls.seq {
            return Dest::Discard;
        }
        if let Some(front) = self.colls.posted[p].front() {
            let info = self
                .colls
                .cur
                .expect("posted receives only exist while a collective runs");
            let want = self.coll_header(&info, front.step, front.nbytes);
            if matches(&want, h) {
                let r = self.colls.posted[p].pop_front().expect("front exists");
                return Dest::Coll {
                    id: r.id,
                    ptr: r.ptr,
                };
            }
            let (step, len) = (front.step, front.nbytes);
            let err = self.mismatch_error(&info, step, len, p, h);
            self.fail_group(err, true);
            return Dest::Discard;
        }
        if let Some(info) = self.colls.cur {
            if h.coll_seq == info.coll_seq
                && (h.op != info.op || h.dtype != info.dtype || h.total != info.total)
            {
                let err = self.mismatch_error(&info, h.step, n, p, h);
                self.fail_group(err, true);
                return Dest::Discard;
            }
        }
        match self.spare_buf(n) {
            Some(v) => Dest::Early(v),
            None => self.unbufferable(p, h),
        }
    }

    /// A frame whose announced length cannot even be allocated: the stream from `p` is
    /// garbled or hostile, so the connection is dropped and the group fails (no abort).
    pub(super) fn unbufferable(&mut self, p: usize, h: &Header) -> Dest {
        self.peer_lost(
            p,
            format!(
                "protocol error: a {:?} frame announces {} payload bytes, more than can be buffered",
                h.kind, h.nbytes
            ),
        );
        Dest::Discard
    }

    /// Handles the end of a frame from `p` whose payload went to `dest`.
    pub(super) fn finish_frame(&mut self, p: usize, h: Header, dest: Dest) {
        if h.kind == Kind::Bye {
            return self.peer_left(p);
        }
        if matches!(h.kind, Kind::Ping | Kind::Pong) {
            return self.on_probe_frame(p, h.kind);
        }
        if let (Kind::Note, Dest::ErrorText(t)) = (h.kind, &dest) {
            return self.note_received(p, t);
        }
        match dest {
            Dest::Coll { id, .. } => {
                self.colls.done.insert(id);
            }
            Dest::P2p { id, .. } => self.complete_p2p(id, Ok(()), Some(p)),
            Dest::Early(data) => {
                let n = data.len();
                self.colls.early[p].push_back(Early { hdr: h, data });
                self.early_added(p, n);
            }
            // A receive may have been posted while this frame was arriving.
            Dest::Unexpected(data) => self.p2p_arrived(p, h, data),
            // A text passed on by `p` may be about our own connection to a third rank (its
            // other end failed first): handled after the step, once what the other peers sent
            // is read, so that our own lost connection is the error if there is one.
            Dest::ErrorText(t) if h.step == PASSED_ON => self.passed_on_to_us(p, t),
            Dest::ErrorText(t) => self.fail_reported(p, &t),
            Dest::Discard => {}
        }
    }
}
