//! Shared-memory all-reduce, broadcast, all-gather and reduce-scatter for small and medium
//! messages when every rank of the group is on this host: no socket, no system call on the fast
//! path.
//!
//! # The segment
//! Made when the group connects (with its socket mesh, so never inside an op, where a timed-out
//! rank could leave the others disagreeing): rank 0 creates a POSIX shared-memory object with a
//! random name and publishes the name in the group's store; every rank maps it and votes there;
//! rank 0 unlinks the name once every vote is in (or the wait for them failed), so no segment
//! outlives the group even if a rank crashes (the mapping stays until each rank unmaps it). One
//! rank that cannot map it, has a peer on another host, or turned it off (`C10D_GLOO_SHM=0` /
//! [`crate::GlooOptions::shared_memory`]) makes the whole group stay on sockets.
//!
//! Layout: one 64-byte line per rank (`seq`: its last arrival; `sleepers`: ranks sleeping on
//! `seq`; `pid`; the op it published, per slot), then two slots per rank ([`SLOT_BYTES`], or
//! [`SMALL_SLOT_BYTES`] in groups of more than 8)
//! (alternating by op).
//!
//! # One op (ops counted per group; all ranks run the same shm ops)
//! 1. wait until every peer started the previous op (so it finished the one before, whose
//!    slots this op reuses: slots alternate by op);
//! 2. copy the buffer into this rank's slot, publish the next arrival number in `seq`, wake
//!    sleepers; wait until every peer arrived;
//! 3. small messages (where the socket path runs the direct exchange):
//!    `buf = slot₀ ⊕ slot₁ ⊕ … ⊕ slotₙ₋₁` in rank order; medium ones (where it runs all-pairs):
//!    each rank reduces its own segment in place in its slot (own contribution first, then rank
//!    order), arrives again, and everyone copies every rank's segment. Either way the socket
//!    algorithm's fold order, so results are bit-identical to the socket path's.
//!
//! Waiting spins briefly, then sleeps on the peer's `seq` word with a futex (shared between
//! processes) in 1 ms turns, so ranks outnumbering cores still progress. Every turn checks the
//! op's deadline (timeout naming the ranks that published nothing, as the socket path does);
//! every millisecond, whether the group was stopped or aborted, what the sockets hold (a peer's
//! error, or a frame of this collective: that peer runs another op over sockets, a mismatch),
//! and whether the waited-for peer process still exists: a dead peer fails the group within
//! about a millisecond. Each rank publishes its op (type, dtype, bytes, sequence number) with
//! its data, and every rank compares: a mismatch fails the group with the socket path's text.

use crate::engine::Comm;
use c10d_core::reduce::reduce_into;
use c10d_core::{DType, DistError, OpType, ReduceOp, Result};
use c10d_store::Store;
use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Largest message per rank that goes through shared memory in groups of up to 8 ranks
/// (cross-memory attach takes over at 2 MiB by default); larger groups (where all-reduce's
/// medium algorithm, all-pairs, is not used) have [`SMALL_SLOT_BYTES`]. A segment is at most 16
/// slots of 2 MiB = 32 MiB.
pub(crate) const SLOT_BYTES: usize = 2 * 1024 * 1024;
/// The slot of groups of more than 8 ranks.
pub(crate) const SMALL_SLOT_BYTES: usize = 64 * 1024;
/// Largest group that uses it.
pub(crate) const MAX_RANKS: usize = 16;
/// Store keys of the set-up (under the group's store).
const KEY_NAME: &str = "c10d_shm/name";
const KEY_VOTE: &str = "c10d_shm/vote/";
/// Spins before yielding, when the host has a core per rank.
const SPINS: u32 = 4000;
/// Yields before sleeping on a futex.
const YIELDS: u32 = 64;

/// Spins worth doing: none when the group's ranks outnumber this host's CPUs (a spinning rank
/// would take the core the awaited peer needs).
fn spin_limit(n: usize) -> u32 {
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    if n > cpus {
        0
    } else {
        SPINS
    }
}

/// The group's shared-memory state.
#[derive(Default)]
pub(crate) enum ShmState {
    /// Not usable in this group (not set up yet, voted down, or not every rank on this host).
    #[default]
    Off,
    /// Mapped by every rank.
    On(Segment),
}

/// One rank's control line.
#[repr(C, align(64))]
struct Line {
    seq: AtomicU32,
    sleepers: AtomicU32,
    pid: AtomicI32,
    /// The published op per slot parity (as the data), compared by every peer: op code |
    /// dtype code << 8, total bytes, PyTorch sequence number.
    kind: [AtomicU32; 2],
    total: [AtomicU64; 2],
    pseq: [AtomicU64; 2],
}

/// A mapped segment and this rank's op counter.
pub(crate) struct Segment {
    base: *mut u8,
    len: usize,
    n: usize,
    /// Arrivals published so far (equal on every rank between ops).
    ops: u32,
    /// Ops run so far, and the first arrival of the last one (slot reuse, see `run`).
    op_index: u32,
    prev_first: u32,
    /// Spins before yielding (see [`spin_limit`]).
    spins: u32,
}

// SAFETY: the mapping is process-wide memory owned by this value; it is only used by the thread
// that drives the group's engine (the engine is behind a mutex).
unsafe impl Send for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` describe a mapping made by `map` and unmapped only here.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The slot size of a group of `n` ranks (equal on every rank).
fn slot_bytes(n: usize) -> usize {
    if n <= 8 {
        SLOT_BYTES
    } else {
        SMALL_SLOT_BYTES
    }
}

fn seg_len(n: usize) -> usize {
    n * 64 + n * 2 * slot_bytes(n)
}

impl Segment {
    fn line(&self, r: usize) -> &Line {
        // SAFETY: line r lies in the mapped header (r < n), 64-byte aligned (page-aligned base);
        // the fields are atomics, so shared access from several processes is sound.
        unsafe { &*(self.base.add(r * 64) as *const Line) }
    }

    fn slot(&self, r: usize, parity: u32) -> *mut u8 {
        let off = self.n * 64 + (r * 2 + parity as usize) * slot_bytes(self.n);
        // SAFETY: the offset lies inside the mapping (r < n, parity < 2).
        unsafe { self.base.add(off) }
    }

    /// Maps the object `name` (created when `create`), sized for `n` ranks.
    fn map(name: &CString, n: usize, create: bool) -> std::io::Result<Segment> {
        let len = seg_len(n);
        let flags = if create {
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR
        } else {
            libc::O_RDWR
        };
        // SAFETY: `name` is a valid C string; the returned descriptor is closed below.
        let fd = unsafe { libc::shm_open(name.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if create {
            if let Err(e) = reserve(fd, len) {
                // SAFETY: closing our own descriptor and removing the name we just created.
                unsafe {
                    libc::close(fd);
                    libc::shm_unlink(name.as_ptr());
                }
                return Err(e);
            }
        }
        // SAFETY: a shared read-write mapping of `len` bytes of the object; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        let e = std::io::Error::last_os_error();
        // SAFETY: the mapping keeps the object alive; the descriptor is no longer needed.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            if create {
                // SAFETY: removing the name we just created (nobody else has it yet).
                unsafe { libc::shm_unlink(name.as_ptr()) };
            }
            return Err(e);
        }
        Ok(Segment {
            base: p.cast(),
            len,
            n,
            ops: 0,
            op_index: 0,
            prev_first: 0,
            spins: spin_limit(n),
        })
    }
}

/// Sizes a fresh object to `len` bytes and reserves its pages, so that a full /dev/shm is a
/// clean error here rather than SIGBUS at the first touch of the mapping.
fn reserve(fd: libc::c_int, len: usize) -> std::io::Result<()> {
    // SAFETY: `fd` is an open shared-memory object of ours.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above; posix_fallocate returns the error number instead of setting errno.
    match unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) } {
        0 => Ok(()),
        rc => Err(std::io::Error::from_raw_os_error(rc)),
    }
}

/// All-reduce of `buf` through the group's segment, with the fold order of the socket
/// algorithm `fold` stands in for (`algo::select` picks it: the group has a segment and `buf`
/// fits a slot; all ranks decide alike).
///
/// # Errors
/// The op's timeout (naming the ranks that published nothing), a dead peer, a stopped group;
/// see [`with_segment`] for a group without a segment.
pub(crate) fn all_reduce(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    op: ReduceOp,
    dtype: DType,
    fold: Fold,
) -> Result<()> {
    with_segment(comm, buf.len(), |comm, seg| {
        run(comm, seg, buf, op, dtype, fold)
    })
}

/// Broadcast of `buf` from `root` through the group's segment: the root writes its slot and
/// arrives; the others arrive,
/// wait for the root, check its op against theirs and copy. The root does not wait.
///
/// # Errors
/// As [`all_reduce`].
pub(crate) fn broadcast(comm: &mut Comm<'_>, buf: &mut [u8], root: usize) -> Result<()> {
    with_segment(comm, buf.len(), |comm, seg| bcast(comm, seg, buf, root))
}

/// All-gather (`outputs[i * n + p]` = rank p's `inputs[i]`) through the group's segment (this
/// rank's inputs together fill its slot).
///
/// # Errors
/// As [`all_reduce`].
pub(crate) fn all_gather(
    comm: &mut Comm<'_>,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
) -> Result<()> {
    let total = inputs.iter().map(|i| i.len()).sum();
    with_segment(comm, total, |comm, seg| {
        gather_all(comm, seg, inputs, outputs)
    })
}

/// Reduce-scatter (`blocks[p]`: this rank's contribution to rank p's result; `out` receives
/// `⊕ over ranks q of q's blocks[rank]`, in rank order, as the socket path folds it) through
/// the group's segment (this rank's blocks together fill its slot): every rank writes all
/// its blocks, arrives, and folds its own block from every slot.
///
/// # Errors
/// As [`all_reduce`].
pub(crate) fn reduce_scatter(
    comm: &mut Comm<'_>,
    blocks: &[&[u8]],
    out: &mut [u8],
    op: ReduceOp,
    dtype: DType,
) -> Result<()> {
    let total = blocks.iter().map(|b| b.len()).sum();
    with_segment(comm, total, |comm, seg| {
        scatter_reduce(comm, seg, blocks, out, op, dtype)
    })
}

/// Bytes one rank's slot of the group's segment holds (`None`: the group has no segment): the
/// most a shared-memory op may put there (see `algo::select`).
pub(crate) fn slot_capacity(state: &ShmState) -> Option<usize> {
    match state {
        ShmState::On(seg) => Some(slot_bytes(seg.n)),
        ShmState::Off => None,
    }
}

/// Runs `f` on the group's segment for an op that puts `bytes` in this rank's slot (the
/// algorithm table chose shared memory, so there is a segment and the op fits its slots; both
/// are checked again here, as the copies into the slots rely on them).
///
/// # Errors
/// [`DistError::Backend`] if the group has no segment or `bytes` do not fit a slot (a bug in
/// the choice of algorithm), or what `f` returns.
fn with_segment(
    comm: &mut Comm<'_>,
    bytes: usize,
    f: impl FnOnce(&mut Comm<'_>, &mut Segment) -> Result<()>,
) -> Result<()> {
    let mut state = std::mem::take(comm.shm());
    let r = match &mut state {
        ShmState::On(seg) if bytes <= slot_bytes(seg.n) => f(comm, seg),
        _ => Err(DistError::backend(format!(
            "{}: shared memory chosen for {bytes} bytes in a group whose segment cannot hold them",
            comm.ctx()
        ))),
    };
    *comm.shm() = state;
    r
}

/// The collective set-up through the group's store (see the module docs): `On` when every rank
/// of a group of 2 ..= [`MAX_RANKS`] mapped the segment, `Off` otherwise. `eligible`: this rank
/// agrees (option on, every peer on this host).
///
/// # Errors
/// A store failure or timeout (a peer did not get this far); the name is unlinked anyway.
pub(crate) fn setup(
    store: &dyn Store,
    rank: usize,
    n: usize,
    eligible: bool,
    timeout: Duration,
) -> Result<ShmState> {
    if !(2..=MAX_RANKS).contains(&n) {
        return Ok(ShmState::Off);
    }
    let (mine, created) = if rank == 0 {
        create(n, eligible)
    } else {
        (None, None)
    };
    let _unlink = created.map(Unlink);
    let mine = match rank {
        0 => {
            let name = _unlink
                .as_ref()
                .map_or(Vec::new(), |u| u.0.as_bytes().to_vec());
            store.set(KEY_NAME, &name)?;
            mine
        }
        _ => {
            store.wait_timeout(&[KEY_NAME], timeout)?;
            let name = store.get(KEY_NAME)?;
            open(&name, n, eligible)
        }
    };
    store.set(&format!("{KEY_VOTE}{rank}"), &[mine.is_some() as u8])?;
    let keys: Vec<String> = (0..n).map(|p| format!("{KEY_VOTE}{p}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    store.wait_timeout(&refs, timeout)?;
    let all = store.multi_get(&refs)?;
    match mine {
        Some(seg) if all.iter().all(|v| v.as_slice() == [1]) => {
            seg.line(rank)
                .pid
                .store(std::process::id() as i32, Ordering::Release);
            Ok(ShmState::On(seg))
        }
        _ => Ok(ShmState::Off),
    }
}

/// Unlinks a segment name when dropped (after the votes, or on a failed set-up).
struct Unlink(CString);

impl Drop for Unlink {
    fn drop(&mut self) {
        // SAFETY: unlinking a name this process created; existing mappings stay valid.
        unsafe { libc::shm_unlink(self.0.as_ptr()) };
    }
}

/// Rank 0's segment and its name.
fn create(n: usize, eligible: bool) -> (Option<Segment>, Option<CString>) {
    if !eligible {
        return (None, None);
    }
    let name = CString::new(format!(
        "/c10d-shm-{}-{:016x}",
        std::process::id(),
        rand_u64()
    ))
    .expect("no NUL");
    match Segment::map(&name, n, true) {
        Ok(s) => (Some(s), Some(name)),
        Err(e) => {
            log::info!("c10d-gloo: no shared memory for the group ({e}); using sockets");
            (None, None)
        }
    }
}

/// A peer's mapping of the segment rank 0 named (`None`: no name, not eligible, or it fails).
fn open(name: &[u8], n: usize, eligible: bool) -> Option<Segment> {
    if name.is_empty() || !eligible {
        return None;
    }
    let c = CString::new(name).ok()?;
    Segment::map(&c, n, false)
        .map_err(|e| {
            log::info!("c10d-gloo: cannot map the group's shared memory ({e}); using sockets")
        })
        .ok()
}

/// Which fold the op uses: the direct exchange's (rank order, every rank reduces everything)
/// or the all-pairs algorithm's (each rank reduces its own segment, own contribution first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fold {
    Direct,
    AllPairs,
}

/// One all-reduce through the segment (see the module docs).
fn run(
    comm: &mut Comm<'_>,
    seg: &mut Segment,
    buf: &mut [u8],
    op: ReduceOp,
    dtype: DType,
    fold: Fold,
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let parity = begin(comm, seg)?;
    let es = dtype.size();
    let own = super::part(buf.len() / es, n, r, es);
    match fold {
        Fold::Direct => write_slot(seg, r, parity, 0, buf),
        // Peers read only their own segments of this slot before the second arrival; ours
        // goes there once it is reduced. Copying 1/n less matters from ~1 MiB up.
        Fold::AllPairs => {
            write_slot(seg, r, parity, 0, &buf[..own.start]);
            write_slot(seg, r, parity, own.end, &buf[own.end..]);
        }
    }
    let mine = Desc::of(comm, 0);
    let first = start(seg, r, parity, mine);
    wait_all(comm, seg, first)?;
    check_descriptions(comm, seg, parity, mine)?;
    let len = buf.len();
    match fold {
        Fold::Direct => {
            buf.copy_from_slice(read_slot(seg, 0, parity, 0, len));
            for p in 1..n {
                reduce_into(op, dtype, buf, read_slot(seg, p, parity, 0, len))?;
            }
        }
        Fold::AllPairs => {
            let part = |i: usize| super::part(len / es, n, i, es);
            // Own segment: own contribution (already in `buf`) first, then rank order; written
            // back into this rank's slot for the others, who read it after the second arrival.
            let mine = part(r);
            for q in (0..n).filter(|&q| q != r) {
                let other = read_slot(seg, q, parity, mine.start, mine.len());
                reduce_into(op, dtype, &mut buf[mine.clone()], other)?;
            }
            write_slot(seg, r, parity, mine.start, &buf[mine.clone()]);
            let second = arrive(seg, r);
            wait_all(comm, seg, second)?;
            for p in (0..n).filter(|&p| p != r) {
                let seg_p = part(p);
                buf[seg_p.clone()].copy_from_slice(read_slot(
                    seg,
                    p,
                    parity,
                    seg_p.start,
                    seg_p.len(),
                ));
            }
        }
    }
    Ok(())
}

/// Publishes this rank's next arrival and returns its number (counted once published: an op
/// that timed out before publishing is retried under the same numbers).
fn arrive(seg: &mut Segment, r: usize) -> u32 {
    let k = seg.ops.wrapping_add(1);
    publish(seg.line(r), k);
    seg.ops = k;
    k
}

/// Waits until this rank may write its slot for the next op (every peer started the previous
/// op, so finished the one before it, whose slots this op reuses: slots alternate by op) and
/// returns the slot parity; a peer that left or a failed group first becomes this op's error.
fn begin(comm: &mut Comm<'_>, seg: &Segment) -> Result<u32> {
    let me = comm.rank();
    comm.check_peers((0..seg.n).filter(|&p| p != me))?;
    wait_all(comm, seg, seg.prev_first)?;
    Ok(seg.op_index.wrapping_add(1) % 2)
}

/// Copies `data` into slot (r, parity) at byte `at`.
fn write_slot(seg: &Segment, r: usize, parity: u32, at: usize, data: &[u8]) {
    assert!(
        at + data.len() <= slot_bytes(seg.n),
        "shared-memory slot overflow"
    );
    // SAFETY: slot (r, parity) is this rank's and holds `slot_bytes` (checked above); no peer
    // reads these bytes before this rank's next arrival (peers read other ranges of it in
    // all-pairs' reduce step), and every peer finished the op that used it last (`begin`).
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), seg.slot(r, parity).add(at), data.len())
    };
}

/// `len` bytes of slot (p, parity) from byte `at`, once p's arrival for this op was acquired.
fn read_slot(seg: &Segment, p: usize, parity: u32, at: usize, len: usize) -> &[u8] {
    assert!(at + len <= slot_bytes(seg.n), "shared-memory slot overflow");
    // SAFETY: in bounds (checked above); the data was published before p's arrival, which the
    // caller acquired, and is not written again before every rank started the next op.
    unsafe { std::slice::from_raw_parts(seg.slot(p, parity).add(at), len) }
}

/// Publishes this rank's op description and its first arrival for the op; returns the
/// arrival's number.
fn start(seg: &mut Segment, r: usize, parity: u32, mine: Desc) -> u32 {
    mine.write(seg.line(r), parity);
    let first = arrive(seg, r);
    seg.prev_first = first;
    seg.op_index = seg.op_index.wrapping_add(1);
    first
}

/// An op as ranks compare it: op, dtype, bytes and root (the PyTorch sequence number only for
/// messages: ranks' numbers differ with their p2p ops).
#[derive(Clone, Copy)]
struct Desc {
    op: OpType,
    seq: u64,
    dtype: DType,
    total: u64,
    root: u16,
}

impl Desc {
    fn of(comm: &Comm<'_>, root: usize) -> Desc {
        let (op, seq, dtype, total) = comm.op_desc();
        Desc {
            op,
            seq,
            dtype,
            total,
            root: root as u16,
        }
    }

    fn same_op(&self, o: &Desc) -> bool {
        (self.op, self.dtype, self.total, self.root) == (o.op, o.dtype, o.total, o.root)
    }

    fn tuple(&self) -> (OpType, u64, DType, u64) {
        (self.op, self.seq, self.dtype, self.total)
    }

    /// Into `line` for slot parity `i` (published with the next arrival).
    fn write(&self, line: &Line, i: u32) {
        let i = i as usize;
        let kind =
            self.op.code() as u32 | (self.dtype.code() as u32) << 8 | (self.root as u32) << 16;
        line.kind[i].store(kind, Ordering::Relaxed);
        line.total[i].store(self.total, Ordering::Relaxed);
        line.pseq[i].store(self.seq, Ordering::Relaxed);
    }

    /// A peer's, for parity `i` (read after its arrival was acquired; not rewritten before every
    /// rank started the next op).
    fn read(line: &Line, i: u32) -> Desc {
        let i = i as usize;
        let kind = line.kind[i].load(Ordering::Relaxed);
        Desc {
            op: OpType::from_code(kind as u8).unwrap_or(OpType::Unknown),
            dtype: DType::from_code((kind >> 8) as u8).unwrap_or(DType::U8),
            root: (kind >> 16) as u16,
            total: line.total[i].load(Ordering::Relaxed),
            seq: line.pseq[i].load(Ordering::Relaxed),
        }
    }
}

/// Every peer in `peers` published the same op as this rank; else the socket path's mismatch
/// error naming the first that did not.
fn check_descriptions_of(
    comm: &mut Comm<'_>,
    seg: &Segment,
    parity: u32,
    mine: Desc,
    mut peers: impl Iterator<Item = usize>,
) -> Result<()> {
    match peers.find(|&p| !Desc::read(seg.line(p), parity).same_op(&mine)) {
        Some(p) => {
            let them = Desc::read(seg.line(p), parity).tuple();
            Err(comm.mismatch(p, them))
        }
        None => Ok(()),
    }
}

/// [`check_descriptions_of`] every rank.
fn check_descriptions(comm: &mut Comm<'_>, seg: &Segment, parity: u32, mine: Desc) -> Result<()> {
    check_descriptions_of(comm, seg, parity, mine, 0..seg.n)
}

/// One broadcast through the segment (see [`broadcast`]).
fn bcast(comm: &mut Comm<'_>, seg: &mut Segment, buf: &mut [u8], root: usize) -> Result<()> {
    let r = comm.rank();
    let parity = begin(comm, seg)?;
    if r == root {
        write_slot(seg, r, parity, 0, buf);
    }
    let mine = Desc::of(comm, root);
    let first = start(seg, r, parity, mine);
    if r == root {
        return Ok(());
    }
    wait_for(comm, seg, root, first)?;
    check_descriptions_of(comm, seg, parity, mine, std::iter::once(root))?;
    buf.copy_from_slice(read_slot(seg, root, parity, 0, buf.len()));
    Ok(())
}

/// One reduce-scatter through the segment (see [`reduce_scatter`]).
fn scatter_reduce(
    comm: &mut Comm<'_>,
    seg: &mut Segment,
    blocks: &[&[u8]],
    out: &mut [u8],
    op: ReduceOp,
    dtype: DType,
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let parity = begin(comm, seg)?;
    let mut offsets = Vec::with_capacity(blocks.len());
    let mut at = 0;
    for b in blocks {
        offsets.push(at);
        write_slot(seg, r, parity, at, b);
        at += b.len();
    }
    let mine = Desc::of(comm, 0);
    let first = start(seg, r, parity, mine);
    wait_all(comm, seg, first)?;
    check_descriptions(comm, seg, parity, mine)?;
    let (mine_at, len) = (offsets[r], out.len());
    out.copy_from_slice(read_slot(seg, 0, parity, mine_at, len));
    for q in 1..n {
        reduce_into(op, dtype, out, read_slot(seg, q, parity, mine_at, len))?;
    }
    Ok(())
}

/// One all-gather through the segment (see [`all_gather`]).
fn gather_all(
    comm: &mut Comm<'_>,
    seg: &mut Segment,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let parity = begin(comm, seg)?;
    let mut at = 0;
    for i in inputs {
        write_slot(seg, r, parity, at, i);
        at += i.len();
    }
    let mine = Desc::of(comm, 0);
    let first = start(seg, r, parity, mine);
    wait_all(comm, seg, first)?;
    check_descriptions(comm, seg, parity, mine)?;
    for p in 0..n {
        let mut at = 0;
        for (i, inp) in inputs.iter().enumerate() {
            outputs[i * n + p].copy_from_slice(read_slot(seg, p, parity, at, inp.len()));
            at += inp.len();
        }
    }
    Ok(())
}

/// Publishes op `k` of this rank and wakes whoever sleeps on it.
fn publish(line: &Line, k: u32) {
    line.seq.store(k, Ordering::SeqCst);
    if line.sleepers.load(Ordering::SeqCst) > 0 {
        futex_wake(&line.seq);
    }
}

/// Whether `seq` has reached `k` (wrapping).
fn reached(seq: u32, k: u32) -> bool {
    seq.wrapping_sub(k) as i32 >= 0
}

/// Waits until every peer's `seq` reached `k`.
fn wait_all(comm: &mut Comm<'_>, seg: &Segment, k: u32) -> Result<()> {
    let r = comm.rank();
    (0..seg.n)
        .filter(|&p| p != r)
        .try_for_each(|p| wait_for(comm, seg, p, k))
}

/// Waits until peer `p`'s `seq` reached `k` (see the module docs for the checks).
fn wait_for(comm: &mut Comm<'_>, seg: &Segment, p: usize, k: u32) -> Result<()> {
    let r = comm.rank();
    let deadline = comm.deadline();
    let limit = seg.spins;
    let line = seg.line(p);
    let mut spins = 0u32;
    let mut yields = 0u32;
    let mut next_check = Instant::now() + Duration::from_millis(1);
    loop {
        let s = line.seq.load(Ordering::Acquire);
        if reached(s, k) {
            return Ok(());
        }
        if spins < limit {
            spins += 1;
            std::hint::spin_loop();
            continue;
        }
        if yields < YIELDS {
            yields += 1;
            std::thread::yield_now();
            continue;
        }
        let now = Instant::now();
        if now >= next_check {
            check(comm, seg, k, p)?;
            next_check = now + Duration::from_millis(1);
        }
        if now >= deadline {
            return Err(comm.timed_out(&missing(seg, r, k)));
        }
        line.sleepers.fetch_add(1, Ordering::SeqCst);
        if !reached(line.seq.load(Ordering::SeqCst), k) {
            futex_wait(&line.seq, s, Duration::from_millis(1));
        }
        line.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Ranks whose `seq` has not reached `k`.
fn missing(seg: &Segment, me: usize, k: u32) -> Vec<usize> {
    (0..seg.n)
        .filter(|&p| p != me && !reached(seg.line(p).seq.load(Ordering::Acquire), k))
        .collect()
}

/// The periodic checks while waiting on peer `p`: the group stopped or aborted, `p` gone.
fn check(comm: &mut Comm<'_>, seg: &Segment, k: u32, p: usize) -> Result<()> {
    if let Some(e) = comm.stop_requested() {
        return Err(e);
    }
    comm.check_sockets(p)?;
    let pid = seg.line(p).pid.load(Ordering::Acquire);
    if pid > 0 && !process_exists(pid) {
        let e = DistError::backend(format!(
            "{}: rank {p} (pid {pid}) exited while rank {} waited for its data of shared-memory op {k}",
            comm.ctx(),
            comm.rank()
        ));
        return Err(comm.fail_group(crate::engine::blaming(e, [p])));
    }
    Ok(())
}

/// Whether process `pid` exists (signal 0 delivers nothing; only ESRCH means gone).
fn process_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit word in a shared mapping (a non-private futex);
    // the kernel only compares it with `expected` and sleeps at most `timeout`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; waking has no other effect.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// A random 64-bit number from the kernel (segment names must not be guessable or collide).
fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is a writable 8-byte buffer.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if got != 8 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.as_nanos() as u64 ^ ((std::process::id() as u64) << 32);
    }
    u64::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_order() {
        assert!(reached(5, 5));
        assert!(reached(6, 5));
        assert!(!reached(4, 5));
        assert!(reached(1, u32::MAX));
        assert!(!reached(u32::MAX, 1));
    }

    #[test]
    fn segments_map_and_vanish_once_unlinked() {
        let name = CString::new(format!(
            "/c10d-shm-test-{}-{:x}",
            std::process::id(),
            rand_u64()
        ))
        .unwrap();
        let a = Segment::map(&name, 2, true).unwrap();
        let b = Segment::map(&name, 2, false).unwrap();
        // SAFETY: unlinking the test's own name.
        unsafe { libc::shm_unlink(name.as_ptr()) };
        assert!(
            Segment::map(&name, 2, false).is_err(),
            "the name must be gone"
        );
        // Both mappings see the same memory.
        publish(a.line(1), 7);
        assert_eq!(b.line(1).seq.load(Ordering::Acquire), 7);
        // SAFETY: slot (0, 1) of a 2-rank segment holds SLOT_BYTES bytes.
        unsafe { *a.slot(0, 1) = 42 };
        // SAFETY: as above, through the other mapping.
        assert_eq!(unsafe { *b.slot(0, 1) }, 42);
        assert_eq!(a.len, seg_len(2));
    }
}
