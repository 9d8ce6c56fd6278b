//! Rooted reduce and reduce-scatter by direct exchange, reducing in rank order.
//!
//! Contributions must already be prescaled (PREMUL_SUM); the caller finalizes (AVG).

use crate::engine::Comm;
use c10d_core::reduce::reduce_into;
use c10d_core::{DType, ReduceOp, Result};

/// Reduce to `root`: non-roots send `data`; the root receives every contribution and computes
/// `x₀ ⊕ … ⊕ xₙ₋₁` in rank order into `data`.
pub(crate) fn reduce(
    comm: &mut Comm<'_>,
    data: &mut [u8],
    op: ReduceOp,
    dtype: DType,
    root: usize,
) -> Result<()> {
    let (r, n, len) = (comm.rank(), comm.size(), data.len());
    if n == 1 || len == 0 {
        return Ok(());
    }
    if r != root {
        return comm.exchange(&[(root, 0, &*data)], &mut []);
    }
    let mut scratch = comm.take_scratch(len * n);
    {
        let s = scratch.bytes();
        let mut recvs: Vec<(usize, u32, &mut [u8])> = s
            .chunks_mut(len)
            .enumerate()
            .filter(|(p, _)| *p != r)
            .map(|(p, b)| (p, 0, b))
            .collect();
        comm.exchange(&[], &mut recvs)?;
    }
    fold_in_rank_order(scratch.bytes(), data, r, n, op, dtype)?;
    comm.put_scratch(scratch);
    Ok(())
}

/// A non-root's part of [`reduce`]: send the (prescaled) contribution to `root`.
pub(crate) fn contribute(comm: &mut Comm<'_>, data: &[u8], root: usize) -> Result<()> {
    if comm.size() == 1 || data.is_empty() {
        return Ok(());
    }
    comm.exchange(&[(root, 0, data)], &mut [])
}

/// `out = slot₀ ⊕ … ⊕ slotₙ₋₁` where slot `own` is `out`'s current content.
fn fold_in_rank_order(
    slots: &mut [u8],
    out: &mut [u8],
    own: usize,
    n: usize,
    op: ReduceOp,
    dtype: DType,
) -> Result<()> {
    let len = out.len();
    if own != 0 {
        slots[own * len..(own + 1) * len].copy_from_slice(out);
        out.copy_from_slice(&slots[..len]);
    }
    for p in 1..n {
        reduce_into(op, dtype, out, &slots[p * len..(p + 1) * len])?;
    }
    Ok(())
}

/// Reduce-scatter: `blocks[p]` is this rank's contribution to rank p's result; `out` (the size
/// of `blocks[rank]`) receives `⊕ over ranks q of q's blocks[rank]`, in rank order.
pub(crate) fn reduce_scatter(
    comm: &mut Comm<'_>,
    blocks: &[&[u8]],
    out: &mut [u8],
    op: ReduceOp,
    dtype: DType,
) -> Result<()> {
    let (r, n, len) = (comm.rank(), comm.size(), out.len());
    out.copy_from_slice(blocks[r]);
    if n == 1 {
        return Ok(());
    }
    let mut scratch = comm.take_scratch((len * n).max(n));
    {
        let s = scratch.bytes();
        let mut recvs: Vec<(usize, u32, &mut [u8])> = s
            .chunks_mut(len.max(1))
            .take(n)
            .enumerate()
            .filter(|(p, _)| *p != r)
            .map(|(p, b)| (p, 0, &mut b[..len]))
            .collect();
        let sends: Vec<(usize, u32, &[u8])> = blocks
            .iter()
            .enumerate()
            .filter(|(p, _)| *p != r)
            .map(|(p, b)| (p, 0, *b))
            .collect();
        comm.exchange(&sends, &mut recvs)?;
    }
    if len > 0 {
        fold_in_rank_order(scratch.bytes(), out, r, n, op, dtype)?;
    }
    comm.put_scratch(scratch);
    Ok(())
}

/// Large rooted reduce: reduce-scatter on the full mesh, then gather of the reduced segments
/// to the root. Every rank folds one segment (its own contribution first, then the others in
/// rank order); scratch is one buffer's worth per rank instead of n buffers at the root, and
/// the root receives (n−1)/n of the buffer twice instead of n−1 whole buffers.
///
/// `data` is the (prescaled) contribution; on the root it also receives the result. The
/// root's in-place receives are safe by causality: a final segment arrives only after its
/// owner received the root's contribution to it.
pub(crate) fn reduce_segmented(
    comm: &mut Comm<'_>,
    data: &mut [u8],
    op: ReduceOp,
    dtype: DType,
    root: usize,
) -> Result<()> {
    segmented(comm, Contribution::Root(data), op, dtype, root)
}

/// Non-root side of [`reduce_segmented`] for a read-only contribution.
pub(crate) fn contribute_segmented(
    comm: &mut Comm<'_>,
    data: &[u8],
    op: ReduceOp,
    dtype: DType,
    root: usize,
) -> Result<()> {
    segmented(comm, Contribution::Peer(data), op, dtype, root)
}

/// A rank's buffer in [`segmented`]: the root's receives the result.
enum Contribution<'a> {
    Root(&'a mut [u8]),
    Peer(&'a [u8]),
}

fn segmented(
    comm: &mut Comm<'_>,
    data: Contribution<'_>,
    op: ReduceOp,
    dtype: DType,
    root: usize,
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let len = match &data {
        Contribution::Root(d) => d.len(),
        Contribution::Peer(d) => d.len(),
    };
    if n == 1 || len == 0 {
        return Ok(());
    }
    let es = dtype.size();
    let count = len / es;
    let seg = |i: usize| super::part(count, n, i, es);
    let my = seg(r);
    let my_len = my.len();
    let slot = |q: usize| q * my_len..(q + 1) * my_len;
    let peers: Vec<usize> = (0..n).filter(|p| *p != r).collect();
    let mut scratch = comm.take_scratch(n * my_len);
    comm.with_posts(|posts| {
        let is_root = matches!(data, Contribution::Root(_));
        let base = match data {
            Contribution::Root(d) => posts.buffer(d),
            Contribution::Peer(d) => posts.input(d),
        };
        let slots = posts.buffer(scratch.bytes());
        let mut rs_ids = Vec::with_capacity(n);
        for &q in &peers {
            rs_ids.push(posts.recv(q, 0, slots, slot(q))?);
        }
        if is_root {
            for &p in &peers {
                posts.recv(p, 1, base, seg(p))?;
            }
        }
        for &p in &peers {
            posts.send(p, 0, base, seg(p))?;
        }
        posts.wait(&rs_ids)?;
        // Fold order: own contribution, then the others in rank order.
        posts.copy((slots, slot(r)), (base, my.clone()))?;
        for &q in &peers {
            posts.fold(op, dtype, (slots, slot(r)), (slots, slot(q)))?;
        }
        if is_root {
            posts.copy((base, my), (slots, slot(r)))?;
        } else {
            posts.send(root, 1, slots, slot(r))?;
        }
        posts.wait_all()
    })?;
    comm.put_scratch(scratch);
    Ok(())
}
