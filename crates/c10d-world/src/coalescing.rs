//! What an open `coalescing_manager` block records — the [`Op`]s issued in it, to launch fused
//! or one by one at its end — kept in the world's state, filled and launched by `collectives`.

use c10d_core::{
    AllgatherOptions, AllreduceOptions, DistError, Op, ProcessGroup, ReduceOp,
    ReduceScatterOptions, Result, Tensor, Work,
};

/// Recorded state of an open `World::coalescing_manager` block.
pub(crate) struct CoalescingState {
    pub(crate) pg: ProcessGroup,
    pub(crate) ops: Vec<Op<'static>>,
    pub(crate) works: Vec<Work>,
}

/// The Python name of a recorded op, for PyTorch's coalescing-manager texts.
pub(crate) fn python_name(op: &Op<'_>) -> &'static str {
    match op {
        Op::AllReduce { .. } => "all_reduce",
        Op::AllGatherIntoTensor { .. } => "all_gather_into_tensor",
        Op::ReduceScatterTensor { .. } => "reduce_scatter_tensor",
        other => other.name(),
    }
}

/// `op` as the block launches it alone (a backend without the fused op): the block's
/// `async_op`.
pub(crate) fn alone(op: &Op<'_>, async_op: bool) -> Op<'static> {
    let mut op = op.clone().into_owned();
    match &mut op {
        Op::AllReduce { opts, .. } => opts.async_op = async_op,
        Op::AllGatherIntoTensor { opts, .. } => opts.async_op = async_op,
        Op::ReduceScatterTensor { opts, .. } => opts.async_op = async_op,
        _ => {}
    }
    op
}

/// The one op that runs `ops` (non-empty, all of `ops[0]`'s kind) together: their
/// `*_coalesced` form.
///
/// # Errors
/// Ops of one kind with different reduce ops, or a kind with no coalesced form.
pub(crate) fn fuse(ops: &[Op<'_>], async_op: bool) -> Result<Op<'static>> {
    match &ops[0] {
        Op::AllReduce { opts, .. } => Ok(Op::AllReduceCoalesced {
            tensors: ops
                .iter()
                .map(|o| in_place(o, opts.reduce_op))
                .collect::<Result<_>>()?,
            opts: AllreduceOptions {
                reduce_op: opts.reduce_op,
                timeout: None,
                async_op,
            },
        }),
        Op::AllGatherIntoTensor { .. } => {
            let (outputs, inputs) = pairs(ops, None)?;
            Ok(Op::AllGatherIntoTensorCoalesced {
                outputs: outputs.into(),
                inputs: inputs.into(),
                opts: AllgatherOptions {
                    timeout: None,
                    async_op,
                },
            })
        }
        Op::ReduceScatterTensor { opts, .. } => {
            let (outputs, inputs) = pairs(ops, Some(opts.reduce_op))?;
            Ok(Op::ReduceScatterTensorCoalesced {
                outputs: outputs.into(),
                inputs: inputs.into(),
                opts: ReduceScatterOptions {
                    reduce_op: opts.reduce_op,
                    timeout: None,
                    async_op,
                },
            })
        }
        other => Err(DistError::invalid(format!(
            "Coalescing manager does not support fast-path coalescing of {}",
            python_name(other)
        ))),
    }
}

fn mixed(what: &str) -> DistError {
    DistError::invalid(format!(
        "coalescing_manager: {what} ops with different reduce ops cannot be coalesced"
    ))
}

/// The tensor of a recorded all_reduce with reduce op `want`.
fn in_place(op: &Op<'_>, want: ReduceOp) -> Result<Tensor> {
    match op {
        Op::AllReduce { tensors, opts } if opts.reduce_op == want => Ok(tensors[0].clone()),
        _ => Err(mixed("all_reduce")),
    }
}

/// The (outputs, inputs) of recorded `*_tensor` ops; `want`: their reduce op, if any.
fn pairs(ops: &[Op<'_>], want: Option<ReduceOp>) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let pair = |op: &Op<'_>| match op {
        Op::AllGatherIntoTensor { output, input, .. } => {
            Ok((Tensor::clone(output), Tensor::clone(input)))
        }
        Op::ReduceScatterTensor {
            output,
            input,
            opts,
        } if Some(opts.reduce_op) == want => Ok((Tensor::clone(output), Tensor::clone(input))),
        _ => Err(mixed("reduce_scatter_tensor")),
    };
    let mut outs = Vec::with_capacity(ops.len());
    let mut ins = Vec::with_capacity(ops.len());
    for op in ops {
        let (o, i) = pair(op)?;
        outs.push(o);
        ins.push(i);
    }
    Ok((outs, ins))
}
