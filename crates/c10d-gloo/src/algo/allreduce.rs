//! All-reduce: direct exchange (small) and pipelined ring (large).
//!
//! The caller has already applied `prescale` (PREMUL_SUM) and applies `finalize` (AVG) after.

use super::part;
use super::step::{step, Phase};
use crate::engine::{Comm, Posts};
use c10d_core::reduce::reduce_into;
use c10d_core::{DType, ReduceOp, Result};

/// Direct exchange: every rank sends its buffer to every other rank, then computes
/// `x₀ ⊕ x₁ ⊕ … ⊕ xₙ₋₁` in rank order. One network hop; (n−1)·|x| bytes each way.
pub(crate) fn direct(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    op: ReduceOp,
    dtype: DType,
) -> Result<()> {
    let (r, n, len) = (comm.rank(), comm.size(), buf.len());
    if n == 1 || len == 0 {
        return Ok(());
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
        let sends: Vec<(usize, u32, &[u8])> =
            (0..n).filter(|p| *p != r).map(|p| (p, 0, &*buf)).collect();
        comm.exchange(&sends, &mut recvs)?;
    }
    let s = scratch.bytes();
    if r != 0 {
        s[r * len..(r + 1) * len].copy_from_slice(buf);
        buf.copy_from_slice(&s[..len]);
    }
    for p in 1..n {
        reduce_into(op, dtype, buf, &s[p * len..(p + 1) * len])?;
    }
    comm.put_scratch(scratch);
    Ok(())
}

fn rs_step(s: usize, k: usize) -> u32 {
    step(Phase::Data, s, k)
}
fn ag_step(s: usize, k: usize) -> u32 {
    step(Phase::Gather, s, k)
}

/// Geometry of the pipelined ring: the buffer (`count` elements of `es` bytes) is split into
/// n segments, each into `k_chunks` chunks; scratch holds two sets of `k_chunks` slots of
/// `slot` bytes (double-buffered by step parity).
struct RingPlan {
    r: usize,
    n: usize,
    es: usize,
    count: usize,
    k_chunks: usize,
    slot: usize,
}

impl RingPlan {
    fn new(r: usize, n: usize, len: usize, es: usize, chunk_bytes: usize) -> RingPlan {
        let count = len / es;
        let max_seg_elems = count.div_ceil(n);
        let k_chunks = (max_seg_elems * es).div_ceil(chunk_bytes.max(es)).max(1);
        let slot = max_seg_elems.div_ceil(k_chunks) * es;
        RingPlan {
            r,
            n,
            es,
            count,
            k_chunks,
            slot,
        }
    }
    /// Steps of each phase: n − 1.
    fn steps(&self) -> usize {
        self.n - 1
    }
    /// We receive from r − 1 ...
    fn left(&self) -> usize {
        (self.r + self.n - 1) % self.n
    }
    /// ... and send to r + 1.
    fn right(&self) -> usize {
        (self.r + 1) % self.n
    }
    /// Byte range of chunk k of segment i (mod n).
    fn chunk(&self, i: usize, k: usize) -> std::ops::Range<usize> {
        let sr = part(self.count, self.n, i % self.n, self.es);
        let elems = (sr.end - sr.start) / self.es;
        let c = part(elems, self.k_chunks, k, self.es);
        sr.start + c.start..sr.start + c.end
    }
    /// Reduce-scatter step s receives (and folds) chunk k of segment r − s − 1.
    fn rs_chunk(&self, s: usize, k: usize) -> std::ops::Range<usize> {
        self.chunk(self.r + self.n - s - 1, k)
    }
    /// All-gather step s receives the final chunk k of segment r − s.
    fn ag_chunk(&self, s: usize, k: usize) -> std::ops::Range<usize> {
        self.chunk(self.r + self.n - s, k)
    }
    /// Offset in scratch of the slot for chunk k of reduce-scatter step s.
    fn slot_offset(&self, s: usize, k: usize) -> usize {
        ((s % 2) * self.k_chunks + k) * self.slot
    }
    fn scratch_len(&self) -> usize {
        2 * self.k_chunks * self.slot
    }
}

/// Pipelined ring: reduce-scatter then all-gather over the ring r → r+1.
///
/// The buffer is split into n segments, each into K chunks of at most `chunk_bytes`.
/// Reduce-scatter step s (0 ≤ s < n−1): send segment r−s to the right, receive segment r−s−1
/// from the left into scratch and fold it into our copy; the chunk just folded is forwarded at
/// once (step s+1), so folding overlaps the wire. After n−1 steps segment r+1 is final here.
/// All-gather step s: receive final segment r−s straight into the buffer and forward it.
/// Scratch is double-buffered by step parity, so receives for step s+2 are posted as soon as
/// chunk k of step s is folded and frames rarely wait in the early queue.
///
/// Buffer reuse is right by causality: a final chunk can only arrive after every rank's
/// contribution to it was received, which includes our own send of that chunk.
pub(crate) fn ring(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    op: ReduceOp,
    dtype: DType,
    chunk_bytes: usize,
) -> Result<()> {
    let (r, n, len) = (comm.rank(), comm.size(), buf.len());
    if n == 1 || len == 0 {
        return Ok(());
    }
    let p = RingPlan::new(r, n, len, dtype.size(), chunk_bytes);
    let (steps, kc, left, right) = (p.steps(), p.k_chunks, p.left(), p.right());
    let mut scratch = comm.take_scratch(p.scratch_len());
    comm.with_posts(|posts| {
        let (b, slots) = (posts.buffer(buf), posts.buffer(scratch.bytes()));
        let slot = |s: usize, k: usize| {
            let at = p.slot_offset(s, k);
            at..at + p.rs_chunk(s, k).len()
        };
        // Receive ids in (step, chunk) order: index s * kc + k.
        let (mut rs_ids, mut ag_ids) = (vec![0u64; steps * kc], vec![0u64; steps * kc]);
        // Reduce-scatter receives posted so far.
        let mut posted_rs = 0usize;
        let post_rs = |posts: &mut Posts<'_, '_, '_>, s: usize, k: usize| {
            posts.recv(left, rs_step(s, k), slots, slot(s, k))
        };
        let post_ag_all = |posts: &mut Posts<'_, '_, '_>, ag_ids: &mut [u64]| -> Result<()> {
            for (i, id) in ag_ids.iter_mut().enumerate() {
                *id = posts.recv(left, ag_step(i / kc, i % kc), b, p.ag_chunk(i / kc, i % kc))?;
            }
            Ok(())
        };
        // Receives for steps 0 and 1 (and the all-gather once every step is posted).
        while posted_rs < steps.min(2) * kc {
            rs_ids[posted_rs] = post_rs(posts, posted_rs / kc, posted_rs % kc)?;
            posted_rs += 1;
        }
        if posted_rs == steps * kc {
            post_ag_all(posts, &mut ag_ids)?;
        }
        // Reduce-scatter: send our segment r, then fold and forward each arriving chunk.
        for k in 0..kc {
            posts.send(right, rs_step(0, k), b, p.chunk(r, k))?;
        }
        for (s, k) in (0..steps * kc).map(|i| (i / kc, i % kc)) {
            posts.wait(&[rs_ids[s * kc + k]])?;
            let c = p.rs_chunk(s, k);
            posts.fold(op, dtype, (b, c.clone()), (slots, slot(s, k)))?;
            let next = if s + 1 < steps {
                rs_step(s + 1, k)
            } else {
                ag_step(0, k)
            };
            posts.send(right, next, b, c)?;
            if s + 2 < steps {
                rs_ids[posted_rs] = post_rs(posts, s + 2, k)?;
                posted_rs += 1;
                if posted_rs == steps * kc {
                    post_ag_all(posts, &mut ag_ids)?;
                }
            }
        }
        // All-gather: each final chunk arrives in place; forward it unless it is the last step.
        for (i, &id) in ag_ids.iter().enumerate() {
            let (s, k) = (i / kc, i % kc);
            posts.wait(&[id])?;
            if s + 1 < steps {
                posts.send(right, ag_step(s + 1, k), b, p.ag_chunk(s, k))?;
            }
        }
        posts.wait_all()
    })?;
    comm.put_scratch(scratch);
    Ok(())
}

/// Direct reduce-scatter + all-gather on the full mesh ("all-pairs"), chunked.
///
/// Segment p of the buffer is reduced by rank p: every rank sends its copy of segment p to p
/// (chunk by chunk), p folds the contributions (its own, then the others in rank order) as
/// each chunk arrives from everyone, and sends the final chunk straight back to every rank, which receives it in place.
/// Each rank sends and receives 2(n−1)/n of the buffer, like the ring, but there are only two
/// dependent phases instead of 2(n−1) steps, so a descheduled rank stalls nobody for long —
/// what matters when ranks outnumber cores.
///
/// In-place receives are right by causality: a final chunk of segment p can only arrive after
/// p received our contribution to it, i.e. after our send of those bytes was written.
pub(crate) fn all_pairs(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    op: ReduceOp,
    dtype: DType,
    chunk_bytes: usize,
) -> Result<()> {
    let (r, n, len) = (comm.rank(), comm.size(), buf.len());
    if n == 1 || len == 0 {
        return Ok(());
    }
    let es = dtype.size();
    let count = len / es;
    let max_seg_elems = count.div_ceil(n);
    let k_chunks = (max_seg_elems * es).div_ceil(chunk_bytes.max(es)).max(1);
    let seg = |i: usize| part(count, n, i, es);
    let chunk = |i: usize, k: usize| {
        let sr = seg(i);
        let c = part((sr.end - sr.start) / es, k_chunks, k, es);
        sr.start + c.start..sr.start + c.end
    };
    let my = seg(r);
    let my_len = my.len();
    let mut scratch = comm.take_scratch(n * my_len); // slot r unused
    let peers: Vec<usize> = (0..n).filter(|p| *p != r).collect();
    comm.with_posts(|posts| {
        let (b, slots) = (posts.buffer(buf), posts.buffer(scratch.bytes()));
        // Where peer q's contribution to chunk k of our segment lands.
        let slot = |q: usize, k: usize| {
            let c = chunk(r, k);
            let at = q * my_len + (c.start - my.start);
            at..at + c.len()
        };
        let mut rs_ids = vec![0u64; n * k_chunks];
        for &q in &peers {
            for k in 0..k_chunks {
                rs_ids[q * k_chunks + k] =
                    posts.recv(q, step(Phase::Data, 0, k), slots, slot(q, k))?;
            }
        }
        for &q in &peers {
            for k in 0..k_chunks {
                posts.recv(q, step(Phase::Gather, 0, k), b, chunk(q, k))?;
            }
        }
        for k in 0..k_chunks {
            for &q in &peers {
                posts.send(q, step(Phase::Data, 0, k), b, chunk(q, k))?;
            }
        }
        for k in 0..k_chunks {
            let ids: Vec<u64> = peers.iter().map(|q| rs_ids[q * k_chunks + k]).collect();
            posts.wait(&ids)?;
            // Fold order: own contribution, then the others in rank order. Fixed for segment r,
            // and only rank r computes it, so every rank receives the same bits.
            for &q in &peers {
                posts.fold(op, dtype, (b, chunk(r, k)), (slots, slot(q, k)))?;
            }
            for &q in &peers {
                posts.send(q, step(Phase::Gather, 0, k), b, chunk(r, k))?;
            }
        }
        posts.wait_all()
    })?;
    comm.put_scratch(scratch);
    Ok(())
}
