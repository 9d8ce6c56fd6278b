//! All-reduce by recursive doubling, for small buffers in groups too large for the direct
//! exchange: ⌈log₂ n⌉ + 2 hops, and each rank talks to at most ⌊log₂ n⌋ + 1 peers (the direct
//! exchange talks to all n − 1, which at thousands of ranks is thousands of connections).
//!
//! With p = the largest power of two ≤ n:
//! 1. the ranks `p + i` (i < n − p) send their buffer to rank `i`, which folds it in
//!    (`xᵢ ⊕ xₚ₊ᵢ`);
//! 2. the first p ranks run log₂ p rounds; in round k rank r exchanges its partial result with
//!    `r ⊕ 2ᵏ` (bitwise xor) and both compute `lower ⊕ higher`, the lower rank's partial first,
//!    so the two hold the same bits after every round;
//! 3. rank `i` sends the result back to rank `p + i`.
//!
//! Every rank ends with the same bits (the same folds in the same order); the order differs from
//! the direct exchange's rank order, as any two algorithms' orders do.

use super::step::{step, Phase};
use crate::engine::Comm;
use c10d_core::reduce::reduce_into;
use c10d_core::{DType, ReduceOp, Result};

/// The largest power of two ≤ `n` (n ≥ 1).
fn pow2_floor(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// The peers rank `r` of `n` talks to (its fold partner, then its round partners).
#[cfg(test)]
fn peers(r: usize, n: usize) -> Vec<usize> {
    let p = pow2_floor(n);
    if r >= p {
        return vec![r - p];
    }
    let mut v: Vec<usize> = (r + p < n).then_some(r + p).into_iter().collect();
    v.extend((0..p.trailing_zeros()).map(|k| r ^ (1 << k)));
    v
}

/// Recursive-doubling all-reduce of `buf` in place (see the module docs).
///
/// # Errors
/// As [`Comm::exchange`]; a reduction error (never for a dtype the op was checked against).
pub(crate) fn all_reduce(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    op: ReduceOp,
    dtype: DType,
) -> Result<()> {
    let (r, n, len) = (comm.rank(), comm.size(), buf.len());
    if n == 1 || len == 0 {
        return Ok(());
    }
    let p = pow2_floor(n);
    let (fold, back) = (step(Phase::Data, 0, 0), step(Phase::Gather, 0, 0));
    if r >= p {
        comm.exchange(&[(r - p, fold, &*buf)], &mut [])?;
        return comm.exchange(&[], &mut [(r - p, back, buf)]);
    }
    let mut scratch = comm.take_scratch(len);
    let res = fold_and_double(comm, buf, scratch.bytes(), (op, dtype), p);
    comm.put_scratch(scratch);
    res?;
    if r + p < n {
        comm.exchange(&[(r + p, back, &*buf)], &mut [])?;
    }
    Ok(())
}

/// Steps 1 and 2 on a rank below `p`: fold in the extra rank's buffer, then the rounds.
fn fold_and_double(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    tmp: &mut [u8],
    (op, dtype): (ReduceOp, DType),
    p: usize,
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    if r + p < n {
        comm.exchange(&[], &mut [(r + p, step(Phase::Data, 0, 0), tmp)])?;
        reduce_into(op, dtype, buf, tmp)?;
    }
    for k in 0..p.trailing_zeros() as usize {
        let partner = r ^ (1 << k);
        let st = step(Phase::Data, k + 1, 0);
        comm.exchange(&[(partner, st, &*buf)], &mut [(partner, st, &mut *tmp)])?;
        if r < partner {
            reduce_into(op, dtype, buf, tmp)?;
        } else {
            reduce_into(op, dtype, tmp, buf)?;
            buf.copy_from_slice(tmp);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_few_and_symmetric() {
        for n in 1..=600 {
            for r in 0..n {
                let mine = peers(r, n);
                assert!(
                    mine.len() <= 1 + n.ilog2() as usize,
                    "n {n} r {r}: {mine:?}"
                );
                for q in mine {
                    assert!(
                        q < n && q != r && peers(q, n).contains(&r),
                        "n {n}: {r} ↔ {q}"
                    );
                }
            }
        }
        assert_eq!(pow2_floor(512), 512);
        assert_eq!(pow2_floor(511), 256);
    }
}
