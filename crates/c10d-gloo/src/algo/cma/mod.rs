//! All-reduce, all-gather and reduce-scatter between processes on one host through
//! cross-memory attach (Linux `process_vm_readv`): each rank copies what it needs straight out
//! of its peers' buffers, one copy per byte instead of the two (into and out of the kernel's
//! socket buffers) that any socket costs. The sockets only carry two or three rounds of small
//! control frames. All-gather and reduce-scatter are the ADDR / read / DONE subset of the
//! all-reduce below.
//!
//! All-reduce: segment p of the buffer is reduced by rank p (as in
//! [`super::allreduce::all_pairs`], whose fold order it keeps, so both paths give the same bits):
//! 1. ADDR: every rank sends every peer (pid, address, length) of its buffer.
//! 2. Reduce-scatter: rank r reads segment r of every peer's buffer, piece by piece (an
//!    L2-sized piece of its own segment is folded with every peer's copy before the next),
//!    into its own buffer. Nobody writes segment r of anyone's buffer meanwhile.
//! 3. REDUCED: every rank tells every peer that its segment is final and that it no longer
//!    reads their buffers' segment r.
//! 4. All-gather: rank r reads the final segment p of every peer p into its own buffer.
//! 5. DONE: every rank tells every peer it finished reading; a buffer is given back to its
//!    owner only after DONE from every peer, so no peer ever reads memory its owner reuses
//!    (unless the owner's op fails first, e.g. times out: then the group fails anyway).
//!
//! Whether cross-memory attach works (seccomp, ptrace restrictions, different users) is probed
//! once per group ([`probe`]), on the first op the algorithm table (`algo::select`) would run
//! through it, and agreed by every rank (a vote round); the verdict feeds the table, so that
//! all ranks always take the same path. Cross-memory attach is only ever used to read: a faulty
//! or hostile peer can make our op fail, never write our memory. A peer that lies about its
//! (pid, address) makes us copy another process's memory of the same user into our own output,
//! which that peer could read itself anyway.

mod remote;

use super::part;
use super::step::{step, Phase};
use crate::engine::Comm;
use c10d_core::reduce::reduce_into;
use c10d_core::{DType, DistError, ReduceOp, Result};
use remote::{probe_message, publish, read_probe};
pub(crate) use remote::{publish_among, Published};

/// Bytes folded per piece in the reduce-scatter: fits L2 with the accumulator.
const PIECE: usize = 256 << 10;

const STEP_PROBE: u32 = step(Phase::CmaProbe, 0, 0);
pub(super) const STEP_ADDR: u32 = step(Phase::CmaAddr, 0, 0);
const STEP_REDUCED: u32 = step(Phase::CmaReduced, 0, 0);
const STEP_DONE: u32 = step(Phase::CmaDone, 0, 0);

/// Every rank of the group (the ranks most exchanges here run among).
pub(super) fn everyone(comm: &Comm<'_>) -> Vec<usize> {
    (0..comm.size()).collect()
}

/// Sends `msg` to every other rank of `ranks` (which holds us) and receives `len` bytes from
/// each; `out[k]` holds `ranks[k]`'s (ours stays zeros).
pub(crate) fn all_to_all(
    comm: &mut Comm<'_>,
    ranks: &[usize],
    step: u32,
    msg: &[u8],
    len: usize,
) -> Result<Vec<Vec<u8>>> {
    let r = comm.rank();
    let mut out = vec![vec![0u8; len]; ranks.len()];
    let mut recvs: Vec<(usize, u32, &mut [u8])> = out
        .iter_mut()
        .zip(ranks)
        .filter(|(_, p)| **p != r)
        .map(|(b, p)| (*p, step, b.as_mut_slice()))
        .collect();
    let sends: Vec<(usize, u32, &[u8])> = ranks
        .iter()
        .filter(|p| **p != r)
        .map(|p| (*p, step, msg))
        .collect();
    comm.exchange(&sends, &mut recvs)?;
    Ok(out)
}

/// Probes whether every rank can read every peer's memory and records the group's verdict
/// (`Comm::set_cma`), which then feeds the algorithm table (`algo::select`); every rank runs
/// it at the same op (the first that would use cross-memory attach) and gets the same answer.
/// A rank with `allowed == false` votes no without trying.
///
/// # Errors
/// Control-frame failures and time-outs (as [`Comm::wait`]).
pub(crate) fn probe(comm: &mut Comm<'_>, allowed: bool) -> Result<bool> {
    let everyone = everyone(comm);
    let mine = probe_among(comm, &everyone, allowed)?;
    let all = vote(comm, mine)?;
    comm.set_cma(all);
    Ok(all)
}

/// Whether every rank of the group said yes (`ok` is this rank's answer); every rank gets the
/// same verdict.
///
/// # Errors
/// As [`Comm::exchange`].
pub(crate) fn vote(comm: &mut Comm<'_>, ok: bool) -> Result<bool> {
    // Dissemination: in round k (distance d = 2^k) send what we know to r + d and fold in
    // what r − d knows; after ⌈log₂ n⌉ rounds every rank has heard, transitively, from all.
    // 2⌈log₂ n⌉ peers, where asking everyone would connect the whole group.
    let (r, n) = (comm.rank(), comm.size());
    let (mut all, mut d, mut round) = (ok, 1usize, 0usize);
    while d < n {
        let (to, from) = ((r + d) % n, (r + n - d) % n);
        let mine = [u8::from(all)];
        let mut theirs = [0u8];
        let st = step(Phase::CmaVote, round, 0);
        comm.exchange(&[(to, st, &mine)], &mut [(from, st, &mut theirs)])?;
        all &= theirs[0] == 1;
        d <<= 1;
        round += 1;
    }
    Ok(all)
}

/// Whether this rank can read the memory of every other rank of `ranks` (which holds us);
/// every rank of `ranks` must call it. `false` without trying when not `allowed`.
///
/// # Errors
/// As [`Comm::exchange`].
pub(crate) fn probe_among(comm: &mut Comm<'_>, ranks: &[usize], allowed: bool) -> Result<bool> {
    let r = comm.rank();
    let me = probe_message();
    let peers = all_to_all(comm, ranks, STEP_PROBE, &me, me.len())?;
    let mut ok = allowed;
    for (&p, m) in ranks.iter().zip(&peers) {
        if p == r || !allowed {
            continue;
        }
        match read_probe(m) {
            Ok(true) => {}
            Ok(false) => ok = false,
            Err(e) => {
                log::info!(
                    "{}: cross-memory attach to rank {p} unavailable ({e}); same-host all_reduce uses sockets",
                    comm.ctx()
                );
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// All-reduce of `buf` (in place) through cross-memory attach (`algo::select` picks it: every
/// peer on this host, the group's probe said yes).
///
/// # Errors
/// Control-frame failures and time-outs (as [`Comm::wait`]); a failed read of a peer's memory
/// (the group fails, with that text, on every rank).
pub(crate) fn all_reduce(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    op: ReduceOp,
    dtype: DType,
) -> Result<()> {
    let (r, n, len) = (comm.rank(), comm.size(), buf.len());
    let peers = publish(comm, &[&*buf])?;
    for (p, pb) in peers.iter().enumerate() {
        // (Frame headers already compare sizes; this only guards the reads below.)
        if pb.len(0) != Some(len as u64) {
            let l = pb.len(0).unwrap_or(0);
            return Err(size_error(comm, p, "buffer", l, len));
        }
    }
    let es = dtype.size();
    let count = len / es;
    let my = part(count, n, r, es);
    let mut scratch = comm.take_scratch(PIECE.min(my.len()));
    let mut off = my.start;
    while off < my.end {
        let l = PIECE.min(my.end - off);
        let tmp = &mut scratch.bytes()[..l];
        for (p, pb) in peers.iter().enumerate() {
            if p == r {
                continue;
            }
            pb.read(0, off, tmp).map_err(|e| read_error(comm, p, e))?;
            reduce_into(op, dtype, &mut buf[off..off + l], tmp)?;
        }
        off += l;
    }
    comm.put_scratch(scratch);
    all_to_all(comm, &everyone(comm), STEP_REDUCED, &[], 0)?;
    for (p, pb) in peers.iter().enumerate() {
        if p == r {
            continue;
        }
        let seg = part(count, n, p, es);
        pb.read(0, seg.start, &mut buf[seg])
            .map_err(|e| read_error(comm, p, e))?;
    }
    all_to_all(comm, &everyone(comm), STEP_DONE, &[], 0)?;
    Ok(())
}

/// The error (group failed on every rank) for a region whose length differs from ours.
fn size_error(comm: &mut Comm<'_>, p: usize, what: &str, theirs: u64, ours: usize) -> DistError {
    let e = DistError::backend(format!(
        "{}: rank {p}'s {what} has {theirs} bytes, rank {}'s {ours}",
        comm.ctx(),
        comm.rank()
    ));
    comm.fail_group(crate::engine::blaming(e, [p]))
}

pub(crate) fn read_error(comm: &mut Comm<'_>, p: usize, e: std::io::Error) -> DistError {
    let gone = if e.raw_os_error() == Some(libc::ESRCH) {
        "; the peer process died"
    } else {
        ""
    };
    let e = DistError::backend(format!(
        "{}: reading rank {p}'s buffer (process_vm_readv) failed: {e}{gone}",
        comm.ctx()
    ))
    .with_io_source(e);
    comm.fail_group(crate::engine::blaming(e, [p]))
}

/// All-gather through cross-memory attach: `outputs[i * n + p]` receives rank p's
/// `inputs[i]`, read straight from p's memory (ours copied locally).
///
/// # Errors
/// As [`all_reduce`]; also a peer input whose length differs from our output slot.
pub(crate) fn all_gather(
    comm: &mut Comm<'_>,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let peers = publish(comm, inputs)?;
    for (j, o) in outputs.iter_mut().enumerate() {
        let (i, p) = (j / n, j % n);
        if p == r {
            o.copy_from_slice(inputs[i]);
            continue;
        }
        let Some(len) = peers[p].len(i) else {
            return Err(size_error(comm, p, "input list", 0, o.len()));
        };
        if len != o.len() as u64 {
            return Err(size_error(comm, p, "input", len, o.len()));
        }
        peers[p].read(i, 0, o).map_err(|e| read_error(comm, p, e))?;
    }
    all_to_all(comm, &everyone(comm), STEP_DONE, &[], 0)?;
    Ok(())
}

/// Reduce-scatter through cross-memory attach: `out` receives `⊕ over ranks q (in rank order)
/// of q's blocks[rank]`, read piece by piece straight from every peer's memory — the same fold
/// order as the socket algorithm, so the same bits.
///
/// # Errors
/// As [`all_reduce`]; also a peer block whose length differs from ours.
pub(crate) fn reduce_scatter(
    comm: &mut Comm<'_>,
    blocks: &[&[u8]],
    out: &mut [u8],
    op: ReduceOp,
    dtype: DType,
) -> Result<()> {
    let (r, len) = (comm.rank(), out.len());
    let peers = publish(comm, blocks)?;
    for (p, pb) in peers.iter().enumerate() {
        match pb.len(r) {
            Some(l) if l == len as u64 => {}
            Some(l) => return Err(size_error(comm, p, "block for this rank", l, len)),
            None => return Err(size_error(comm, p, "block list", 0, len)),
        }
    }
    let mut scratch = comm.take_scratch(PIECE.min(len));
    let mut off = 0;
    while off < len {
        let l = PIECE.min(len - off);
        for (p, pb) in peers.iter().enumerate() {
            let acc = &mut out[off..off + l];
            let src: &[u8] = if p == r {
                &blocks[r][off..off + l]
            } else {
                let tmp = &mut scratch.bytes()[..l];
                pb.read(r, off, tmp).map_err(|e| read_error(comm, p, e))?;
                tmp
            };
            if p == 0 {
                acc.copy_from_slice(src);
            } else {
                reduce_into(op, dtype, acc, src)?;
            }
        }
        off += l;
    }
    comm.put_scratch(scratch);
    all_to_all(comm, &everyone(comm), STEP_DONE, &[], 0)?;
    Ok(())
}
