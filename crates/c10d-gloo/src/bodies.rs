//! The bodies of collectives: what runs on the engine once an op's turn comes, given its
//! leased bytes (`CollBody`), around the algorithm the table picks (pre-scaling, folding a
//! rank's own tensor list, AVG's division).

use crate::algo::{self, dispatch::Algo};
use crate::engine::{CollBody, Comm};
use crate::slices::split_sizes_ref;
use c10d_core::reduce::{finalize, prescale, reduce_into};
use c10d_core::*;

/// Reduce over a rank's tensor list into the first, then the network all-reduce (`n`
/// ranks, for AVG).
pub(crate) fn all_reduce_body(algo: Algo, rop: ReduceOp, dtype: DType, n: usize) -> CollBody {
    Box::new(move |comm, _ins, mut outs| {
        let (first, rest) = outs.split_first_mut().expect("non-empty tensor list");
        for t in rest.iter() {
            reduce_into(rop, dtype, first, t)?;
        }
        prescale(rop, dtype, first)?;
        algo.all_reduce(comm, first, rop.combine_op(), dtype)?;
        finalize(rop, dtype, first, n)?;
        for t in rest.iter_mut() {
            t.copy_from_slice(first);
        }
        Ok(())
    })
}

/// The root's part of `reduce`: out = finalize(prescale(out) ⊕ contributions of the others).
pub(crate) fn reduce_at_root(
    rop: ReduceOp,
    dtype: DType,
    root: usize,
    n: usize,
    segmented: bool,
) -> CollBody {
    Box::new(move |comm, _ins, mut outs| {
        prescale(rop, dtype, outs[0])?;
        if segmented {
            algo::reduce::reduce_segmented(comm, outs[0], rop.combine_op(), dtype, root)?;
        } else {
            algo::reduce::reduce(comm, outs[0], rop.combine_op(), dtype, root)?;
        }
        finalize(rop, dtype, outs[0], n)
    })
}

/// A non-root's part of `reduce`: sends its (prescaled, for PREMUL_SUM) input towards the root.
pub(crate) fn reduce_contribute(
    rop: ReduceOp,
    dtype: DType,
    root: usize,
    segmented: bool,
) -> CollBody {
    Box::new(move |comm, ins, _outs| {
        let send = |comm: &mut Comm<'_>, data: &[u8]| {
            if segmented {
                algo::reduce::contribute_segmented(comm, data, rop.combine_op(), dtype, root)
            } else {
                algo::reduce::contribute(comm, data, root)
            }
        };
        if matches!(rop, ReduceOp::PremulSum(_)) {
            let mut s = comm.take_scratch(ins[0].len());
            s.bytes().copy_from_slice(ins[0]);
            prescale(rop, dtype, s.bytes())?;
            send(comm, s.bytes())?;
            comm.put_scratch(s);
            Ok(())
        } else {
            send(comm, ins[0])
        }
    })
}

/// Prescale (copying for PREMUL_SUM), direct reduce-scatter, finalize.
pub(crate) fn reduce_scatter_body(
    algo: Algo,
    comm: &mut Comm<'_>,
    blocks: &[&[u8]],
    out: &mut [u8],
    rop: ReduceOp,
    dtype: DType,
    n: usize,
) -> Result<()> {
    if matches!(rop, ReduceOp::PremulSum(_)) {
        let total: usize = blocks.iter().map(|b| b.len()).sum();
        let mut s = comm.take_scratch(total);
        let sizes: Vec<usize> = blocks.iter().map(|b| b.len()).collect();
        {
            let flat = s.bytes();
            let mut off = 0;
            for b in blocks {
                flat[off..off + b.len()].copy_from_slice(b);
                off += b.len();
            }
            prescale(rop, dtype, flat)?;
        }
        let scaled = split_sizes_ref(s.bytes(), &sizes);
        algo.reduce_scatter(comm, &scaled, out, rop.combine_op(), dtype)?;
        comm.put_scratch(s);
    } else {
        algo.reduce_scatter(comm, blocks, out, rop.combine_op(), dtype)?;
    }
    finalize(rop, dtype, out, n)
}
