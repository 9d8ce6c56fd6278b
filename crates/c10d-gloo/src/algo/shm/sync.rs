//! One op's protocol on the segment: waiting for the slots to be free (`begin`), publishing
//! the op and arrivals, waiting for peers (spin, yield, then futex, with the op's checks), and
//! comparing every rank's published op.

use crate::engine::Comm;
use crate::shm::segment::*;
use c10d_core::{DType, DistError, OpType, Result};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Yields before sleeping on a futex.
pub(super) const YIELDS: u32 = 64;
/// Spins between two reads of the clock while spinning.
const SPIN_CHECK: u32 = 64;

/// How long a wait for the peer whose line is `line` spins before it yields: [`Segment::spin`]
/// (zero when ranks outnumber the cores), or not at all when the peer last ran on this rank's
/// CPU. The scheduler often puts processes that talked over sockets at set-up on one core and
/// moves one away only after tens to hundreds of ms; meanwhile two ranks that spin take turns
/// spinning a whole [`SPIN`] while the other waits for the core: ~100 µs per 1 KiB op instead
/// of ~1 (yielding at once: 2–4 µs). Sleeping at once instead does not make the scheduler move
/// the sleeper (tried: 21 µs per op).
fn spin_time(seg: &Segment, line: &Line) -> Duration {
    let peer_cpu = line.cpu.load(Ordering::Relaxed);
    if peer_cpu != 0 && peer_cpu == current_cpu() {
        Duration::ZERO
    } else {
        seg.spin
    }
}

/// Publishes this rank's next arrival and returns its number (counted once published: an op
/// that timed out before publishing is retried under the same numbers).
pub(super) fn arrive(seg: &mut Segment, r: usize) -> u32 {
    let k = seg.ops.wrapping_add(1);
    publish(seg.line(r), k);
    seg.unwoken.set(true);
    if seg.spin.is_zero() {
        // Ranks outnumber the cores: peers often sleep, and a late wake-up costs more than
        // waiting for the stores here.
        settle(seg, r);
    }
    seg.ops = k;
    k
}

/// Waits until this rank may write its slot for the next op (every peer started the previous
/// op, so finished the one before it, whose slots this op reuses: slots alternate by op) and
/// returns the slot parity; a peer that left or a failed group first becomes this op's error.
pub(super) fn begin(comm: &mut Comm<'_>, seg: &Segment) -> Result<u32> {
    let me = comm.rank();
    comm.check_peers((0..seg.n).filter(|&p| p != me))?;
    wait_all(comm, seg, seg.prev_first)?;
    Ok(seg.op_index.wrapping_add(1) % 2)
}

/// Publishes this rank's op description and its first arrival for the op; returns the
/// arrival's number.
pub(super) fn start(seg: &mut Segment, r: usize, parity: u32, mine: Desc) -> u32 {
    mine.write(seg.line(r), parity);
    let first = arrive(seg, r);
    seg.prev_first = first;
    seg.op_index = seg.op_index.wrapping_add(1);
    first
}

/// An op as ranks compare it: op, dtype, bytes, root, and the variant of the algorithm (the
/// all-reduce's fold: ranks whose options make them pick different folds must not mix them);
/// the PyTorch sequence number only for messages (ranks' numbers differ with their p2p ops).
#[derive(Clone, Copy)]
pub(super) struct Desc {
    op: OpType,
    seq: u64,
    dtype: DType,
    total: u64,
    root: u8,
    variant: u8,
}

impl Desc {
    /// This rank's op, rooted at `root` (< [`crate::shm::segment::MAX_RANKS`]), run as `variant`.
    pub(super) fn of(comm: &Comm<'_>, root: usize, variant: u8) -> Desc {
        let (op, seq, dtype, total) = comm.op_desc();
        Desc {
            op,
            seq,
            dtype,
            total,
            root: root as u8,
            variant,
        }
    }

    fn same_op(&self, o: &Desc) -> bool {
        (self.op, self.dtype, self.total, self.root, self.variant)
            == (o.op, o.dtype, o.total, o.root, o.variant)
    }

    fn tuple(&self) -> (OpType, u64, DType, u64) {
        (self.op, self.seq, self.dtype, self.total)
    }

    /// Into `line` for slot parity `i` (published with the next arrival).
    fn write(&self, line: &Line, i: u32) {
        let i = i as usize;
        let kind = self.op.code() as u32
            | (self.dtype.code() as u32) << 8
            | (self.root as u32) << 16
            | (self.variant as u32) << 24;
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
            root: (kind >> 16) as u8,
            variant: (kind >> 24) as u8,
            total: line.total[i].load(Ordering::Relaxed),
            seq: line.pseq[i].load(Ordering::Relaxed),
        }
    }
}

/// Every peer in `peers` published the same op as this rank; else the socket path's mismatch
/// error naming the first that did not.
pub(super) fn check_descriptions_of(
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
pub(super) fn check_descriptions(
    comm: &mut Comm<'_>,
    seg: &Segment,
    parity: u32,
    mine: Desc,
) -> Result<()> {
    check_descriptions_of(comm, seg, parity, mine, 0..seg.n)
}

/// Waits until every peer's `seq` reached `k`.
pub(super) fn wait_all(comm: &mut Comm<'_>, seg: &Segment, k: u32) -> Result<()> {
    let r = comm.rank();
    (0..seg.n)
        .filter(|&p| p != r)
        .try_for_each(|p| wait_for(comm, seg, p, k))
}

/// Waits until peer `p`'s `seq` reached `k` (see the module docs for the checks).
pub(super) fn wait_for(comm: &mut Comm<'_>, seg: &Segment, p: usize, k: u32) -> Result<()> {
    let r = comm.rank();
    // The first load goes out before the op's flight-recorder entry is written, so that the
    // entry is written while the peer's line travels here (a cross-core transfer, longer than
    // the write): recording then adds nothing to the op, even on the rank that arrives last
    // (its peer's line is ready, but still in the peer's cache).
    let first = seg.line(p).seq.load(Ordering::Acquire);
    comm.record_pending();
    if reached(first, k) {
        return Ok(());
    }
    settle(seg, r);
    let deadline = comm.deadline();
    let line = seg.line(p);
    // Read at the first look at the clock: most waits end within a few spins, without one.
    let mut started = None;
    if spin_on(line, k, spin_time(seg, line), &mut started) {
        return Ok(());
    }
    let started = started.unwrap_or_else(Instant::now);
    let mut yields = 0u32;
    let mut next_check = started + Duration::from_millis(1);
    loop {
        let s = line.seq.load(Ordering::Acquire);
        if reached(s, k) {
            return Ok(());
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

/// Spins on `line` until its `seq` reaches `k` (true) or `spin` has passed (false);
/// `started` is when the spinning began, once the clock was read.
fn spin_on(line: &Line, k: u32, spin: Duration, started: &mut Option<Instant>) -> bool {
    if spin.is_zero() {
        return false;
    }
    let mut spins = 0u32;
    loop {
        if reached(line.seq.load(Ordering::Acquire), k) {
            return true;
        }
        spins = spins.wrapping_add(1);
        std::hint::spin_loop();
        // The clock is read every SPIN_CHECK spins (about 1 µs), not on every one.
        if spins.is_multiple_of(SPIN_CHECK)
            && started.get_or_insert_with(Instant::now).elapsed() >= spin
        {
            return false;
        }
    }
}

/// Wakes the peers sleeping on this rank's line after its last arrival, if not done yet: at the
/// first wait that does not end at once, and when the op ends. Until then the arrival's store
/// travels to the other cores while this rank goes on (a full barrier at the arrival would
/// wait for it, and for the slot's data before it: a rank that arrives last would stall
/// instead of reading the others' slots).
pub(super) fn settle(seg: &Segment, r: usize) {
    if seg.unwoken.replace(false) {
        wake_sleepers(seg.line(r));
    }
}

/// Ranks whose `seq` has not reached `k`.
pub(super) fn missing(seg: &Segment, me: usize, k: u32) -> Vec<usize> {
    (0..seg.n)
        .filter(|&p| p != me && !reached(seg.line(p).seq.load(Ordering::Acquire), k))
        .collect()
}

/// The periodic checks while waiting on peer `p`: the group stopped or aborted, `p` gone.
pub(super) fn check(comm: &mut Comm<'_>, seg: &Segment, k: u32, p: usize) -> Result<()> {
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
