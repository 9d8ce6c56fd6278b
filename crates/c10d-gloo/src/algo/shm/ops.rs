//! The collectives through the segment: all-reduce (direct or all-pairs fold), broadcast,
//! reduce-scatter and all-gather, each written against the safe slot and arrival API.

use super::sync::*;
use super::Fold;
use crate::engine::Comm;
use crate::shm::segment::*;
use c10d_core::reduce::reduce_into;
use c10d_core::{DType, ReduceOp, Result};

/// One all-reduce through the segment (see the module docs).
pub(super) fn run(
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
    let own = crate::algo::part(buf.len() / es, n, r, es);
    match fold {
        Fold::Direct => write_slot(seg, r, parity, 0, buf),
        // Peers read only their own segments of this slot before the second arrival; ours
        // goes there once it is reduced. Copying 1/n less matters from ~1 MiB up.
        Fold::AllPairs => {
            write_slot(seg, r, parity, 0, &buf[..own.start]);
            write_slot(seg, r, parity, own.end, &buf[own.end..]);
        }
    }
    let mine = Desc::of(comm, 0, fold as u8);
    let first = start(seg, r, parity, mine);
    wait_all(comm, seg, first)?;
    check_descriptions(comm, seg, parity, mine)?;
    let len = buf.len();
    match fold {
        Fold::Direct => {
            // Rank 0's slot holds a copy of rank 0's buffer: nothing to copy back there.
            if r != 0 {
                buf.copy_from_slice(read_slot(seg, 0, parity, 0, len));
            }
            for p in 1..n {
                reduce_into(op, dtype, buf, read_slot(seg, p, parity, 0, len))?;
            }
            // The next op writes the other slot, which every peer finished reading before it
            // arrived here: its lines come back writable while the caller goes on.
            prefetch_for_write(seg, r, parity ^ 1, len);
        }
        Fold::AllPairs => {
            let part = |i: usize| crate::algo::part(len / es, n, i, es);
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

/// One broadcast through the segment (see [`broadcast`]).
pub(super) fn bcast(
    comm: &mut Comm<'_>,
    seg: &mut Segment,
    buf: &mut [u8],
    root: usize,
) -> Result<()> {
    let r = comm.rank();
    let parity = begin(comm, seg)?;
    if r == root {
        write_slot(seg, r, parity, 0, buf);
    }
    let mine = Desc::of(comm, root, 0);
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
pub(super) fn scatter_reduce(
    comm: &mut Comm<'_>,
    seg: &mut Segment,
    blocks: &[&[u8]],
    out: &mut [u8],
    op: ReduceOp,
    dtype: DType,
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let parity = write_parts_and_meet(comm, seg, blocks)?;
    let mine_at: usize = blocks[..r].iter().map(|b| b.len()).sum();
    let len = out.len();
    out.copy_from_slice(read_slot(seg, 0, parity, mine_at, len));
    for q in 1..n {
        reduce_into(op, dtype, out, read_slot(seg, q, parity, mine_at, len))?;
    }
    Ok(())
}

/// One all-gather through the segment (see [`all_gather`]).
pub(super) fn gather_all(
    comm: &mut Comm<'_>,
    seg: &mut Segment,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
) -> Result<()> {
    let n = comm.size();
    let parity = write_parts_and_meet(comm, seg, inputs)?;
    for p in 0..n {
        let mut at = 0;
        for (i, inp) in inputs.iter().enumerate() {
            outputs[i * n + p].copy_from_slice(read_slot(seg, p, parity, at, inp.len()));
            at += inp.len();
        }
    }
    Ok(())
}

/// Writes `parts` one after another into this rank's slot, publishes the op (no root, one
/// variant), and waits until every peer did the same and published the same op; returns the
/// slot parity of this op.
fn write_parts_and_meet(comm: &mut Comm<'_>, seg: &mut Segment, parts: &[&[u8]]) -> Result<u32> {
    let r = comm.rank();
    let parity = begin(comm, seg)?;
    let mut at = 0;
    for part in parts {
        write_slot(seg, r, parity, at, part);
        at += part.len();
    }
    let mine = Desc::of(comm, 0, 0);
    let first = start(seg, r, parity, mine);
    wait_all(comm, seg, first)?;
    check_descriptions(comm, seg, parity, mine)?;
    Ok(parity)
}
