//! What an open `coalescing_manager` block records (the ops, to launch fused or one by one at
//! its end) — kept in the world's state, filled and launched by `collectives`.

use c10d_core::{
    AllgatherOptions, AllreduceOptions, DistError, ProcessGroup, ReduceOp, ReduceScatterOptions,
    Result, Tensor, Work,
};

/// Recorded state of an open `World::coalescing_manager` block.
pub(crate) struct CoalescingState {
    pub(crate) pg: ProcessGroup,
    pub(crate) ops: Vec<CollOp>,
    pub(crate) works: Vec<Work>,
}

pub(crate) enum CollOp {
    AllReduce(Tensor, ReduceOp),
    AllGatherIntoTensor(Tensor, Tensor),
    ReduceScatterTensor(Tensor, Tensor, ReduceOp),
}

impl CollOp {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            CollOp::AllReduce(..) => "all_reduce",
            CollOp::AllGatherIntoTensor(..) => "all_gather_into_tensor",
            CollOp::ReduceScatterTensor(..) => "reduce_scatter_tensor",
        }
    }

    /// Issues this op alone (a backend without the fused op).
    pub(crate) fn launch(&self, pg: &ProcessGroup, async_op: bool) -> Result<Work> {
        match self {
            CollOp::AllReduce(t, op) => pg.all_reduce(
                std::slice::from_ref(t),
                &AllreduceOptions {
                    reduce_op: *op,
                    timeout: None,
                    async_op,
                },
            ),
            CollOp::AllGatherIntoTensor(out, inp) => pg.all_gather_into_tensor(
                out,
                inp,
                &AllgatherOptions {
                    timeout: None,
                    async_op,
                },
            ),
            CollOp::ReduceScatterTensor(out, inp, op) => pg.reduce_scatter_tensor(
                out,
                inp,
                &ReduceScatterOptions {
                    reduce_op: *op,
                    timeout: None,
                    async_op,
                },
            ),
        }
    }

    /// Issues `ops` (non-empty, all of `ops[0]`'s kind) as one coalesced op.
    pub(crate) fn launch_fused(pg: &ProcessGroup, ops: &[CollOp], async_op: bool) -> Result<Work> {
        match &ops[0] {
            CollOp::AllReduce(_, op) => {
                let mut ts = Vec::new();
                for o in ops {
                    if let CollOp::AllReduce(t, o2) = o {
                        if o2 != op {
                            return Err(DistError::invalid("coalescing_manager: all_reduce ops with different reduce ops cannot be coalesced"));
                        }
                        ts.push(t.clone());
                    }
                }
                pg.all_reduce_coalesced(
                    &ts,
                    &AllreduceOptions {
                        reduce_op: *op,
                        timeout: None,
                        async_op,
                    },
                )
            }
            CollOp::AllGatherIntoTensor(..) => {
                let (mut outs, mut ins) = (Vec::new(), Vec::new());
                for o in ops {
                    if let CollOp::AllGatherIntoTensor(out, inp) = o {
                        outs.push(out.clone());
                        ins.push(inp.clone());
                    }
                }
                pg.all_gather_into_tensor_coalesced(
                    &outs,
                    &ins,
                    &AllgatherOptions {
                        timeout: None,
                        async_op,
                    },
                )
            }
            CollOp::ReduceScatterTensor(_, _, op) => {
                let (mut outs, mut ins) = (Vec::new(), Vec::new());
                for o in ops {
                    if let CollOp::ReduceScatterTensor(out, inp, _) = o {
                        outs.push(out.clone());
                        ins.push(inp.clone());
                    }
                }
                pg.reduce_scatter_tensor_coalesced(
                    &outs,
                    &ins,
                    &ReduceScatterOptions {
                        reduce_op: *op,
                        timeout: None,
                        async_op,
                    },
                )
            }
        }
    }
}
