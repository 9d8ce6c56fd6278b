//! The Python backend's call form of every op: PyTorch's `Backend` method name, the tensors
//! the op writes and those it reads (as lists of lists of descriptors: a flat list is one
//! list, one tensor a list of one), and the options, turned into one [`Op`].

use c10d_core::*;
use pyo3::exceptions::PyValueError;
use pyo3::PyResult;
use std::borrow::Cow;
use std::time::Duration;

/// The options of one call, as `Engine.run` receives them (unused ones keep their defaults).
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// The op's timeout (`None`: the group's).
    pub timeout: Option<Duration>,
    /// PyTorch's `opts.asyncOp`.
    pub async_op: bool,
    /// Root rank (broadcast, reduce, gather, scatter).
    pub root: usize,
    /// Root tensor index (broadcast, reduce).
    pub root_tensor: usize,
    /// Reduction (reducing ops).
    pub reduce_op: ReduceOp,
    /// `alltoall_base`'s dim-0 rows received from / sent to each rank (empty: even).
    pub splits: (Vec<usize>, Vec<usize>),
    /// Peer group rank (send, recv) and tag.
    pub peer: (usize, i64),
}

fn flat(lists: Vec<Vec<Tensor>>) -> Vec<Tensor> {
    lists.into_iter().flatten().collect()
}

fn single(name: &str, lists: Vec<Vec<Tensor>>) -> PyResult<Cow<'static, Tensor>> {
    let mut ts = flat(lists);
    match (ts.pop(), ts.is_empty()) {
        (Some(t), true) => Ok(Cow::Owned(t)),
        _ => Err(PyValueError::new_err(format!(
            "c10drs: {name} takes one output and one input tensor"
        ))),
    }
}

/// The op `name` (PyTorch's `Backend` method: `"allreduce"`, `"_allgather_base"`,
/// `"alltoall_base"`, `"recvAnysource"` …) over `outs` (written) and `ins` (read).
///
/// # Errors
/// `ValueError` for an unknown name or a single-tensor op given other than one tensor.
pub fn build(
    name: &str,
    outs: Vec<Vec<Tensor>>,
    ins: Vec<Vec<Tensor>>,
    o: CallOptions,
) -> PyResult<Op<'static>> {
    let (timeout, async_op, reduce_op) = (o.timeout, o.async_op, o.reduce_op);
    let gather = AllgatherOptions { timeout, async_op };
    let scatter = ReduceScatterOptions {
        reduce_op,
        timeout,
        async_op,
    };
    let all = AllreduceOptions {
        reduce_op,
        timeout,
        async_op,
    };
    Ok(match name {
        "broadcast" => Op::Broadcast {
            tensors: flat(outs).into(),
            opts: BroadcastOptions {
                root_rank: o.root,
                root_tensor: o.root_tensor,
                timeout,
                async_op,
            },
        },
        "allreduce" => Op::AllReduce {
            tensors: flat(outs).into(),
            opts: all,
        },
        "allreduce_coalesced" => Op::AllReduceCoalesced {
            tensors: flat(outs).into(),
            opts: all,
        },
        "reduce" => Op::Reduce {
            tensors: flat(outs).into(),
            opts: ReduceOptions {
                reduce_op,
                root_rank: o.root,
                root_tensor: o.root_tensor,
                timeout,
                async_op,
            },
        },
        "allgather" => Op::AllGather {
            outputs: outs.into(),
            inputs: flat(ins).into(),
            opts: gather,
        },
        "_allgather_base" => Op::AllGatherIntoTensor {
            output: single(name, outs)?,
            input: single(name, ins)?,
            opts: gather,
        },
        "allgather_coalesced" => Op::AllGatherCoalesced {
            outputs: outs.into(),
            inputs: flat(ins).into(),
            opts: gather,
        },
        "allgather_into_tensor_coalesced" => Op::AllGatherIntoTensorCoalesced {
            outputs: flat(outs).into(),
            inputs: flat(ins).into(),
            opts: gather,
        },
        "gather" => Op::Gather {
            outputs: outs.into(),
            inputs: flat(ins).into(),
            opts: GatherOptions {
                root_rank: o.root,
                timeout,
                async_op,
            },
        },
        "scatter" => Op::Scatter {
            outputs: flat(outs).into(),
            inputs: ins.into(),
            opts: ScatterOptions {
                root_rank: o.root,
                timeout,
                async_op,
            },
        },
        "reduce_scatter" => Op::ReduceScatter {
            outputs: flat(outs).into(),
            inputs: ins.into(),
            opts: scatter,
        },
        "_reduce_scatter_base" => Op::ReduceScatterTensor {
            output: single(name, outs)?,
            input: single(name, ins)?,
            opts: scatter,
        },
        "reduce_scatter_tensor_coalesced" => Op::ReduceScatterTensorCoalesced {
            outputs: flat(outs).into(),
            inputs: flat(ins).into(),
            opts: scatter,
        },
        "alltoall_base" => Op::AllToAllSingle {
            output: single(name, outs)?,
            input: single(name, ins)?,
            output_split_sizes: o.splits.0.into(),
            input_split_sizes: o.splits.1.into(),
            opts: AllToAllOptions { timeout, async_op },
        },
        "alltoall" => Op::AllToAll {
            outputs: flat(outs).into(),
            inputs: flat(ins).into(),
            opts: AllToAllOptions { timeout, async_op },
        },
        "barrier" => Op::Barrier {
            opts: BarrierOptions {
                timeout,
                async_op,
                ..Default::default()
            },
        },
        "send" => Op::Send {
            tensors: flat(ins).into(),
            dst: o.peer.0,
            tag: o.peer.1,
        },
        "recv" => Op::Recv {
            tensors: flat(outs).into(),
            src: o.peer.0,
            tag: o.peer.1,
        },
        "recvAnysource" => Op::RecvAnysource {
            tensors: flat(outs).into(),
            tag: o.peer.1,
        },
        other => {
            return Err(PyValueError::new_err(format!(
                "c10drs: unknown op {other:?}"
            )))
        }
    })
}
