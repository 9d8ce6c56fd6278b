//! Shared-memory all-reduce, broadcast, all-gather and reduce-scatter for small and medium
//! messages when every rank of the group is on this host: no socket, no system call on the fast
//! path.
//!
//! # The segment
//! Set up by the first op that would use it ([`probe`], asked for by the algorithm table as
//! `Probe::Shm`; every rank runs it at the same op, so all agree), not when the group connects:
//! a group that never runs a small same-host op never reserves anything, and the slots are
//! sized to the op (its bytes per rank rounded up to a power of two, from 64 KiB to the
//! group's largest slot, see `shm::fit`). A later op that needs a bigger slot sets up a bigger
//! segment the same way (the old one is unmapped; it had no ops in flight, and a peer still
//! reading it keeps its own mapping). The set-up goes through the group's store: rank 0 checks
//! with `statvfs` that `/dev/shm` has room for the segment while leaving an eighth of it free,
//! creates a POSIX shared-memory object with a random name, reserves its pages
//! (`posix_fallocate`, so a full `/dev/shm` is an error there and never a `SIGBUS` later) and
//! publishes the name (or "no room", or "refused"); every rank maps it and votes there; rank 0
//! unlinks the name once every vote is in (or the wait for them failed), so no segment outlives
//! the group even if a rank crashes (the mapping stays until each rank unmaps it).
//!
//! No room: rank 0 warns once (naming `/dev/shm`, its size and free bytes, what the segment
//! needed and what would fit), and the group runs ops that need that slot over sockets; only a
//! smaller slot is ever asked for again. One rank that cannot map it or turned it off
//! (`C10D_GLOO_SHM=0` / [`crate::GlooOptions::shared_memory`]), or a peer on another host,
//! makes the whole group stay on sockets. A peer that does not reach the set-up before the op's
//! deadline fails the group.
//!
//! Layout: one 64-byte line per rank (`seq`: its last arrival; `sleepers`: ranks sleeping on
//! `seq`; `pid`; the op it published, per slot), then two slots per rank (alternating by op) of
//! the segment's slot size (at most [`SLOT_BYTES`], or [`SMALL_SLOT_BYTES`] in groups of more
//! than 8).
//!
//! # One op (ops counted per group; all ranks run the same shm ops)
//! 1. wait until every peer started the previous op (so it finished the one before, whose
//!    slots this op reuses: slots alternate by op);
//! 2. copy the buffer into this rank's slot, publish the next arrival number in `seq` (a plain
//!    store: sleepers are woken, after a fence, at the first wait that does not end at once or
//!    when the op ends); wait until every peer arrived;
//! 3. small messages (where the socket path runs the direct exchange):
//!    `buf = slot₀ ⊕ slot₁ ⊕ … ⊕ slotₙ₋₁` in rank order; medium ones (where it runs all-pairs):
//!    each rank reduces its own segment in place in its slot (own contribution first, then rank
//!    order), arrives again, and everyone copies every rank's segment. Either way the socket
//!    algorithm's fold order, so results are bit-identical to the socket path's.
//!
//! Waiting spins up to 50 µs (not at all when ranks outnumber cores, or when the awaited peer
//! last published from this rank's CPU: both then need that core), yields 64 times, then sleeps
//! on the peer's `seq` word with a futex (shared between processes) in 1 ms turns, so ranks
//! outnumbering cores still progress. Every turn checks the
//! op's deadline (timeout naming the ranks that published nothing, as the socket path does);
//! every millisecond, whether the group was stopped or aborted, what the sockets hold (a peer's
//! error, or a frame of this collective: that peer runs another op over sockets, a mismatch),
//! and whether the waited-for peer process still exists: a dead peer fails the group within
//! about a millisecond. Each rank publishes its op (type, dtype, bytes, sequence number) with
//! its data, and every rank compares: a mismatch fails the group with the socket path's text.

mod ops;
mod probe;
mod sync;

pub(crate) use probe::{limit, probe};

use crate::engine::Comm;
use crate::shm::segment::Segment;
#[cfg(doc)]
use crate::shm::segment::{SLOT_BYTES, SMALL_SLOT_BYTES};
pub(crate) use crate::shm::ShmState;
use c10d_core::{DType, DistError, ReduceOp, Result};
use ops::run;
use ops::{bcast, gather_all, scatter_reduce};

/// All-reduce of `buf` through the group's segment, with the fold order of the socket
/// algorithm `fold` stands in for (`algo::select` picks it: the group has a segment and `buf`
/// fits a slot, after [`probe`] if it had to; all ranks decide alike).
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
        ShmState::On(seg) => Some(seg.slot),
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
        ShmState::On(seg) if bytes <= seg.slot => {
            let r = f(comm, seg);
            sync::settle(seg, comm.rank());
            r
        }
        _ => Err(DistError::backend(format!(
            "{}: shared memory chosen for {bytes} bytes in a group whose segment cannot hold them",
            comm.ctx()
        ))),
    };
    *comm.shm() = state;
    r
}

/// Which fold the op uses: the direct exchange's (rank order, every rank reduces everything)
/// or the all-pairs algorithm's (each rank reduces its own segment, own contribution first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fold {
    Direct,
    AllPairs,
}
