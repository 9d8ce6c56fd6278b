//! Connection I/O: a peer (`Peer`: its connection, a `transport::Conn` for TCP and Unix streams alike), the per-peer write queue of frames
//! (`TxMsg`, gathered writes, `flush`, `linger`) and the receive state machine that stages
//! headers and reads payloads (`read_step`), with SO_RCVLOWAT for large payloads on TCP.

use super::dest::{dest_slice, Dest};
use super::Engine;
use crate::transport::Conn;
use crate::wire::{Header, Kind, HDR};
use c10d_core::{DType, OpType};
use mio::{Events, Poll};
use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::time::{Duration, Instant};

/// Size of a peer's staging buffer (headers and small payloads are read through it).
const STAGE: usize = 256 * 1024;

/// Payload remainders at least this big are read straight into their destination.
const DIRECT_READ: usize = 32 * 1024;

/// Slices gathered into one write.
const MAX_IOV: usize = 64;

/// The peer connections (`None`: this rank, or not connected yet) and their poll set.
pub(super) struct Net {
    pub(super) poll: Poll,
    pub(super) events: Events,
    pub(super) peers: Vec<Option<Box<Peer>>>,
    /// Frames for higher peers that have not connected yet (sent when they do).
    pub(super) waiting: std::collections::HashMap<usize, VecDeque<TxMsg>>,
}

/// The payload of a queued frame: borrowed from the op's buffer until written, or owned.
pub(super) enum TxData {
    Borrowed(*const u8, usize),
    Owned(Vec<u8>),
}

impl TxData {
    fn len(&self) -> usize {
        match self {
            TxData::Borrowed(_, n) => *n,
            TxData::Owned(v) => v.len(),
        }
    }
    fn bytes(&self) -> &[u8] {
        match self {
            // SAFETY: a borrowed payload points into a leased tensor or the running collective's
            // buffers; the owner detaches (copies) or removes the message before that memory is
            // released (see `Peer::detach`).
            TxData::Borrowed(p, n) => unsafe { std::slice::from_raw_parts(*p, *n) },
            TxData::Owned(v) => v,
        }
    }
}

/// Who waits for a queued frame to be written: a collective's send, a point-to-point send (by
/// id), or nobody (control frames, detached frames).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    Coll(u64),
    P2p(u64),
    Nobody,
}

/// A frame in a peer's write queue.
pub(super) struct TxMsg {
    hdr: [u8; HDR],
    data: TxData,
    /// Bytes written so far (header included).
    off: usize,
    pub(super) owner: Owner,
}

/// Where a peer's receive state machine is: waiting for a header, or inside a payload.
pub(super) enum Rx {
    Header,
    Payload { hdr: Header, dest: Dest, got: usize },
}

pub(super) struct Peer {
    pub(super) stream: Conn,
    pub(super) tx: VecDeque<TxMsg>,
    pub(super) rx: Rx,
    stage: Box<[u8]>,
    s0: usize,
    s1: usize,
    pub(super) open: bool,
    /// Current SO_RCVLOWAT of a TCP stream (1 = the kernel's default).
    lowat: usize,
}

/// Owners of the frames one flush wrote completely.
type Finished = smallvec::SmallVec<[Owner; 8]>;

impl Peer {
    /// A freshly connected peer: nothing queued, expecting a header.
    pub(super) fn new(stream: Conn) -> Peer {
        Peer {
            stream,
            tx: VecDeque::new(),
            rx: Rx::Header,
            stage: vec![0u8; STAGE].into_boxed_slice(),
            s0: 0,
            s1: 0,
            open: true,
            lowat: 1,
        }
    }

    /// Writes queued frames (gathered, up to [`MAX_IOV`] slices a call) until the queue is
    /// empty or the socket would block; owners of fully written frames go to `finished`.
    /// Returns why the connection was lost, if it was.
    fn write_queued(&mut self, finished: &mut Finished) -> Option<String> {
        // TLS: ciphertext that earlier writes left goes first, even when nothing is queued.
        match self.stream.flush_unsent() {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return None,
            Err(e) => return Some(e.to_string()),
        }
        while !self.tx.is_empty() {
            let res = self.stream.write_vectored(&tx_iov(&self.tx));
            match res {
                Ok(0) => return Some("connection closed while writing".to_string()),
                Ok(n) => self.consume_written(n, finished),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Some(e.to_string()),
            }
        }
        None
    }

    /// Lets go of the buffers of the ops `owns` selects: their queued frames are dropped, or
    /// finished from a copy when partly written (the peer expects the rest), and no longer
    /// belong to anyone; a frame being received into one of them is drained into the void.
    pub(super) fn detach(&mut self, owns: impl Fn(Owner) -> bool) {
        let mut keep = VecDeque::with_capacity(self.tx.len());
        for mut m in self.tx.drain(..) {
            if owns(m.owner) {
                if m.off == 0 {
                    continue;
                }
                if let TxData::Borrowed(..) = m.data {
                    m.data = TxData::Owned(m.data.bytes().to_vec());
                }
                m.owner = Owner::Nobody;
            }
            keep.push_back(m);
        }
        self.tx = keep;
        if let Rx::Payload { dest, .. } = &mut self.rx {
            let owner = match dest {
                Dest::Coll { id, .. } => Owner::Coll(*id),
                Dest::P2p { id, .. } => Owner::P2p(*id),
                _ => Owner::Nobody,
            };
            if owner != Owner::Nobody && owns(owner) {
                *dest = Dest::Discard;
            }
        }
    }

    /// Advances the queue by `n` written bytes, popping the frames now written whole.
    fn consume_written(&mut self, mut n: usize, finished: &mut Finished) {
        while n > 0 {
            let m = self
                .tx
                .front_mut()
                .expect("written bytes belong to queued frames");
            let left = HDR + m.data.len() - m.off;
            if n >= left {
                n -= left;
                finished.push(m.owner);
                self.tx.pop_front();
            } else {
                m.off += n;
                n = 0;
            }
        }
        // Zero-byte payload frames complete with their header.
        while self.tx.front().is_some_and(|m| m.off >= HDR + m.data.len()) {
            finished.push(self.tx.pop_front().expect("front").owner);
        }
    }
}

/// The unwritten rest of the queued frames (header, then payload), as one gather list.
fn tx_iov(tx: &VecDeque<TxMsg>) -> smallvec::SmallVec<[IoSlice<'_>; MAX_IOV]> {
    let mut iov = smallvec::SmallVec::new();
    for m in tx.iter() {
        if iov.len() + 2 > MAX_IOV {
            break;
        }
        if m.off < HDR {
            iov.push(IoSlice::new(&m.hdr[m.off..]));
        }
        let d = m.data.bytes();
        let from = m.off.saturating_sub(HDR);
        if from < d.len() {
            iov.push(IoSlice::new(&d[from..]));
        }
    }
    iov
}

/// While a large payload is outstanding on a TCP stream, the kernel is asked (SO_RCVLOWAT) to
/// report it readable only once this much of it (or all of it) arrived: one wake-up per
/// ~512 KiB instead of one per 64 KiB segment, which matters when ranks outnumber cores.
/// The whole frame is on its way (frames are written whole), so the wait cannot stall; EOF and
/// errors are reported regardless.
const LOWAT_MAX: usize = 512 * 1024;

/// How long a failing rank waits (at most) for its error frames to reach its peers before it
/// fails its own works.
pub(super) const LINGER: Duration = Duration::from_millis(200);

impl Peer {
    fn set_lowat(&mut self, want: usize) {
        // (Under TLS the socket holds ciphertext, and the session may hold part of a record:
        // a low-water mark in plaintext bytes could wait for bytes that never come.)
        if self.stream.is_local() || self.stream.is_tls() || want == self.lowat {
            return;
        }
        let v = want as libc::c_int;
        // SAFETY: valid socket fd owned by the connection; the option value is a c_int of the
        // given size.
        let rc = unsafe {
            libc::setsockopt(
                self.stream.raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            self.lowat = want;
        }
    }
}

pub(super) enum ReadStep {
    Header(Header),
    Done(Header, Dest),
    More,
    Block,
    Lost(String),
}

pub(super) fn control_header(kind: Kind, nbytes: usize) -> Header {
    Header {
        kind,
        op: OpType::Unknown,
        dtype: DType::U8,
        step: 0,
        coll_seq: 0,
        seq: 0,
        total: nbytes as u64,
        nbytes: nbytes as u64,
        tag: 0,
    }
}

/// One step of the receive state machine of `peer`.
pub(super) fn read_step(peer: &mut Peer) -> ReadStep {
    match &mut peer.rx {
        Rx::Header => {
            if peer.s1 - peer.s0 >= HDR {
                let h = Header::decode(&peer.stage[peer.s0..peer.s0 + HDR]);
                peer.s0 += HDR;
                return match h {
                    Ok(h) => ReadStep::Header(h),
                    Err(e) => ReadStep::Lost(format!("protocol error: {e}")),
                };
            }
            fill_stage(peer)
        }
        Rx::Payload { hdr, dest, got } => {
            let n = hdr.nbytes as usize;
            let want = n - *got;
            let staged = peer.s1 - peer.s0;
            if staged > 0 {
                let k = staged.min(want);
                if let Some(d) = dest_slice(dest, *got, k) {
                    d.copy_from_slice(&peer.stage[peer.s0..peer.s0 + k]);
                }
                peer.s0 += k;
                *got += k;
            } else if want >= DIRECT_READ && dest_slice(dest, *got, want).is_some() {
                // (A truncated error text or a discarded frame has no room: staged reads.)
                let d = dest_slice(dest, *got, want).expect("checked just above");
                match peer.stream.read(d) {
                    Ok(0) => return ReadStep::Lost("connection closed by peer".into()),
                    Ok(k) => *got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        peer.set_lowat(want.min(LOWAT_MAX));
                        return ReadStep::Block;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return ReadStep::More,
                    Err(e) => return ReadStep::Lost(e.to_string()),
                }
            } else {
                return fill_stage(peer);
            }
            if let Rx::Payload { got, hdr, .. } = &peer.rx {
                if *got == hdr.nbytes as usize {
                    if let Rx::Payload { hdr, dest, .. } =
                        std::mem::replace(&mut peer.rx, Rx::Header)
                    {
                        return ReadStep::Done(hdr, dest);
                    }
                }
            }
            ReadStep::More
        }
    }
}

/// Reads more bytes into the staging buffer (compacting it first).
fn fill_stage(peer: &mut Peer) -> ReadStep {
    if peer.lowat != 1 {
        peer.set_lowat(1);
    }
    if peer.s0 > 0 {
        peer.stage.copy_within(peer.s0..peer.s1, 0);
        peer.s1 -= peer.s0;
        peer.s0 = 0;
    }
    match peer.stream.read(&mut peer.stage[peer.s1..]) {
        Ok(0) => ReadStep::Lost("connection closed by peer".into()),
        Ok(k) => {
            peer.s1 += k;
            ReadStep::More
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => ReadStep::Block,
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => ReadStep::More,
        Err(e) => ReadStep::Lost(e.to_string()),
    }
}

impl Engine {
    /// Queues a frame to `peer` and tries to write it at once.
    pub(super) fn push_tx(&mut self, peer: usize, hdr: Header, data: TxData, owner: Owner) {
        self.connect_peer(peer);
        let msg = TxMsg {
            hdr: hdr.encode(),
            data,
            off: 0,
            owner,
        };
        let Some(p) = self.net.peers[peer].as_mut() else {
            // A higher peer connects to us when it reaches this op: the frame waits for it.
            // (Otherwise the group failed, or is about to: the waiter sees `failed`.)
            if peer > self.id.rank && self.faults.failed.is_none() {
                self.net.waiting.entry(peer).or_default().push_back(msg);
            }
            return;
        };
        p.tx.push_back(msg);
        if p.tx.len() == 1 {
            self.flush(peer);
        }
    }

    /// Writes queued frames to `p` until the socket would block.
    pub(super) fn flush(&mut self, p: usize) {
        let mut finished = Finished::new();
        let lost = match self.net.peers[p].as_mut() {
            Some(peer) if !peer.open => return,
            Some(peer) => peer.write_queued(&mut finished),
            None => None,
        };
        self.frames_written(finished);
        if let Some(why) = lost {
            self.write_failed(p, why);
        }
    }

    /// Completes what waited on fully written frames: a collective's send, a p2p send.
    fn frames_written(&mut self, finished: Finished) {
        for o in finished {
            match o {
                Owner::Coll(id) => {
                    self.colls.done.insert(id);
                }
                Owner::P2p(id) => self.complete_p2p(id, Ok(()), None),
                Owner::Nobody => {}
            }
        }
    }

    /// Writes what is queued for every open peer, waiting (in `poll(2)`, not spinning) for
    /// writability until `deadline`; whatever is still queued then stays queued. Reads nothing,
    /// so it is safe inside `on_readable`. Two ranks lingering towards each other with full
    /// buffers both give up at the deadline.
    pub(super) fn linger(&mut self, deadline: Instant) {
        loop {
            for p in 0..self.net.peers.len() {
                if self.net.peers[p]
                    .as_ref()
                    .is_some_and(|x| x.open && (!x.tx.is_empty() || x.stream.has_unsent()))
                {
                    self.flush(p);
                }
            }
            let mut fds: smallvec::SmallVec<[libc::pollfd; 8]> = self
                .net
                .peers
                .iter()
                .flatten()
                .filter(|x| x.open && (!x.tx.is_empty() || x.stream.has_unsent()))
                .map(|x| libc::pollfd {
                    fd: x.stream.raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                })
                .collect();
            let left = deadline.saturating_duration_since(Instant::now());
            if fds.is_empty() || left.is_zero() {
                return;
            }
            let ms = left.as_millis().clamp(1, 1000) as libc::c_int;
            // SAFETY: `fds` is a live, properly initialised array of `fds.len()` pollfd structs
            // whose descriptors are owned by open peers; poll only writes their `revents`.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        }
    }
}
