//! [`Op`]: one collective or point-to-point call as a value — the op, its tensors and its
//! options — so that every layer above the backends (the process group's dispatch, staging of
//! device tensors, the DETAIL checks, coalescing blocks, the Python engine) handles every op
//! alike, and a backend has one entry point ([`Collectives::run`](crate::Collectives::run)).
//!
//! One variant per PyTorch `c10d::Backend` virtual that takes tensors (`broadcast`,
//! `allreduce`, `_allgather_base`, `alltoall_base`, `send`, …), with PyTorch's argument
//! layouts: an `outputs: Vec<Vec<Tensor>>` is `std::vector<std::vector<at::Tensor>>`. Ranks
//! and roots are *group* ranks. `monitoredBarrier` is not an op here: it blocks and returns no
//! `Work` (see [`Backend::monitored_barrier`](crate::Backend::monitored_barrier)).
//!
//! Adding a collective: a variant here (with its `name`, `op_type`, tensor sides and check
//! below), its check in [`crate::checks`], its implementation in each backend that has it,
//! its call form ([`crate::Collectives`], the world's builder, the Python engine's call).

use crate::checks::Checks;
use crate::error::{DistError, Result};
use crate::op_type::OpType;
use crate::options::*;
use crate::tensor::Tensor;
use std::borrow::Cow;
use std::convert::Infallible;

/// One op with its tensors and options (PyTorch's `Backend` call, as a value).
///
/// Tensor lists, single tensors and split sizes are [`Cow`]s: the call forms of
/// [`Collectives`](crate::Collectives) borrow the caller's slices (an op costs no allocation
/// and no reference count on its way to the backend, as PyTorch's `std::vector<at::Tensor>&`
/// arguments); [`Op::into_owned`] keeps one beyond the call (a coalescing block does), and
/// ops built from scratch (the Python engine, staging) own theirs (`Cow::Owned`, or
/// `vec.into()`). Cloning clones the tensor handles (the data is shared). See the module docs.
#[derive(Clone)]
#[non_exhaustive]
pub enum Op<'a> {
    /// `broadcast`: `tensors[opts.root_tensor]` of `opts.root_rank` to every rank's tensors.
    Broadcast {
        /// In place: read on the root, written elsewhere.
        tensors: Cow<'a, [Tensor]>,
        /// Root rank and tensor.
        opts: BroadcastOptions,
    },
    /// `allreduce`: in-place reduction of all tensors of all ranks into every tensor.
    AllReduce {
        /// In place, one dtype and element count.
        tensors: Cow<'a, [Tensor]>,
        /// The reduction.
        opts: AllreduceOptions,
    },
    /// `allreduce_coalesced`: several tensors of one dtype reduced as one flat buffer.
    AllReduceCoalesced {
        /// In place, one dtype, any sizes.
        tensors: Cow<'a, [Tensor]>,
        /// The reduction.
        opts: AllreduceCoalescedOptions,
    },
    /// `reduce`: reduction into `tensors[opts.root_tensor]` on `opts.root_rank`.
    Reduce {
        /// One tensor, in place.
        tensors: Cow<'a, [Tensor]>,
        /// Root and reduction.
        opts: ReduceOptions,
    },
    /// `allgather`: `outputs[i][r]` receives `inputs[i]` of rank r.
    AllGather {
        /// One list of group-size tensors per input.
        outputs: Cow<'a, [Vec<Tensor>]>,
        /// This rank's contributions.
        inputs: Cow<'a, [Tensor]>,
        /// Timeout.
        opts: AllgatherOptions,
    },
    /// `_allgather_base` (`all_gather_into_tensor`): `output` is the dim-0 concatenation of
    /// every rank's `input`.
    AllGatherIntoTensor {
        /// Group size × `input`'s elements.
        output: Cow<'a, Tensor>,
        /// This rank's block.
        input: Cow<'a, Tensor>,
        /// Timeout.
        opts: AllgatherOptions,
    },
    /// `allgather_coalesced`: `outputs[r][i]` receives `inputs[i]` of rank r.
    AllGatherCoalesced {
        /// One list per rank, shaped as `inputs`.
        outputs: Cow<'a, [Vec<Tensor>]>,
        /// This rank's tensors.
        inputs: Cow<'a, [Tensor]>,
        /// Timeout.
        opts: AllgatherOptions,
    },
    /// `allgather_into_tensor_coalesced`: one `_allgather_base` per (output, input) pair, as
    /// one op.
    AllGatherIntoTensorCoalesced {
        /// One output per input.
        outputs: Cow<'a, [Tensor]>,
        /// This rank's blocks.
        inputs: Cow<'a, [Tensor]>,
        /// Timeout.
        opts: AllgatherOptions,
    },
    /// `gather`: on the root, `outputs[0][r]` receives rank r's `inputs[0]`; `outputs` empty
    /// elsewhere.
    Gather {
        /// On the root one list of group-size tensors; empty elsewhere.
        outputs: Cow<'a, [Vec<Tensor>]>,
        /// One tensor.
        inputs: Cow<'a, [Tensor]>,
        /// Root.
        opts: GatherOptions,
    },
    /// `scatter`: rank r's `outputs[0]` receives the root's `inputs[0][r]`.
    Scatter {
        /// One tensor.
        outputs: Cow<'a, [Tensor]>,
        /// On the root one list of group-size tensors; empty elsewhere.
        inputs: Cow<'a, [Vec<Tensor>]>,
        /// Root.
        opts: ScatterOptions,
    },
    /// `reduce_scatter`: rank r's `outputs[0]` = op over ranks of `inputs[0][r]`.
    ReduceScatter {
        /// One tensor.
        outputs: Cow<'a, [Tensor]>,
        /// One list of group-size tensors.
        inputs: Cow<'a, [Vec<Tensor>]>,
        /// The reduction.
        opts: ReduceScatterOptions,
    },
    /// `_reduce_scatter_base` (`reduce_scatter_tensor`): `input` is group size × `output`
    /// along dim 0.
    ReduceScatterTensor {
        /// This rank's block of the result.
        output: Cow<'a, Tensor>,
        /// Every rank's block, in rank order.
        input: Cow<'a, Tensor>,
        /// The reduction.
        opts: ReduceScatterOptions,
    },
    /// `reduce_scatter_tensor_coalesced`: one `_reduce_scatter_base` per pair, as one op.
    ReduceScatterTensorCoalesced {
        /// One output per input.
        outputs: Cow<'a, [Tensor]>,
        /// Group size × each output.
        inputs: Cow<'a, [Tensor]>,
        /// The reduction.
        opts: ReduceScatterOptions,
    },
    /// `alltoall_base` (`all_to_all_single`): dim-0 splits of `input` go to each rank,
    /// received splits land in `output` in rank order. Empty split lists mean equal splits.
    AllToAllSingle {
        /// Received blocks in rank order.
        output: Cow<'a, Tensor>,
        /// Blocks to send, in rank order.
        input: Cow<'a, Tensor>,
        /// Dim-0 rows received from each rank (empty: equal).
        output_split_sizes: Cow<'a, [usize]>,
        /// Dim-0 rows sent to each rank (empty: equal).
        input_split_sizes: Cow<'a, [usize]>,
        /// Timeout.
        opts: AllToAllOptions,
    },
    /// `alltoall`: `outputs[j]` receives rank j's `inputs[self]`.
    AllToAll {
        /// One tensor per rank.
        outputs: Cow<'a, [Tensor]>,
        /// One tensor per rank.
        inputs: Cow<'a, [Tensor]>,
        /// Timeout.
        opts: AllToAllOptions,
    },
    /// `barrier`: completes after every rank entered it and all earlier ops of this group
    /// finished.
    Barrier {
        /// Device and timeout.
        opts: BarrierOptions,
    },
    /// `send` to group rank `dst` with `tag`.
    Send {
        /// One tensor.
        tensors: Cow<'a, [Tensor]>,
        /// Group rank.
        dst: usize,
        /// Matches the receiver's tag.
        tag: i64,
    },
    /// `recv` from group rank `src` with `tag`.
    Recv {
        /// One tensor.
        tensors: Cow<'a, [Tensor]>,
        /// Group rank.
        src: usize,
        /// Matches the sender's tag.
        tag: i64,
    },
    /// `recvAnysource`: receive from whichever rank sends with `tag` first (see
    /// [`Work::source_rank`](crate::Work::source_rank)).
    RecvAnysource {
        /// One tensor.
        tensors: Cow<'a, [Tensor]>,
        /// Matches the sender's tag.
        tag: i64,
    },
}

/// Which side of an op a tensor is on: read only, or written (in-place tensors are written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Read by the op.
    Input,
    /// Written by the op (and read too, for in-place ops).
    Output,
}

/// The tensors of one side of an op, borrowed in the op's own layout.
#[derive(Debug, Clone, Copy)]
pub enum TensorList<'a> {
    /// A flat list.
    Flat(&'a [Tensor]),
    /// A list of lists.
    Nested(&'a [Vec<Tensor>]),
}

impl<'a> TensorList<'a> {
    /// Every tensor, in order (lists of lists flattened).
    pub fn iter(&self) -> impl Iterator<Item = &'a Tensor> + 'a {
        let (flat, nested): (&'a [Tensor], &'a [Vec<Tensor>]) = match *self {
            TensorList::Flat(f) => (f, &[]),
            TensorList::Nested(n) => (&[], n),
        };
        flat.iter().chain(nested.iter().flatten())
    }

    /// True when the side holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }
}

const NONE: TensorList<'static> = TensorList::Flat(&[]);

impl<'a> Op<'a> {
    /// PyTorch's name of the op as a `Backend` method (`"allreduce"`, `"_allgather_base"`,
    /// `"alltoall_base"`, `"recvAnysource"` …), the name argument errors carry.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Broadcast { .. } => "broadcast",
            Op::AllReduce { .. } => "allreduce",
            Op::AllReduceCoalesced { .. } => "allreduce_coalesced",
            Op::Reduce { .. } => "reduce",
            Op::AllGather { .. } => "allgather",
            Op::AllGatherIntoTensor { .. } => "_allgather_base",
            Op::AllGatherCoalesced { .. } => "allgather_coalesced",
            Op::AllGatherIntoTensorCoalesced { .. } => "allgather_into_tensor_coalesced",
            Op::Gather { .. } => "gather",
            Op::Scatter { .. } => "scatter",
            Op::ReduceScatter { .. } => "reduce_scatter",
            Op::ReduceScatterTensor { .. } => "_reduce_scatter_base",
            Op::ReduceScatterTensorCoalesced { .. } => "reduce_scatter_tensor_coalesced",
            Op::AllToAllSingle { .. } => "alltoall_base",
            Op::AllToAll { .. } => "alltoall",
            Op::Barrier { .. } => "barrier",
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
            Op::RecvAnysource { .. } => "recvAnysource",
        }
    }

    /// PyTorch's error for an op a backend lacks: [`DistError::Unsupported`] "Backend
    /// {backend} does not support {op}".
    pub fn unsupported_by(&self, backend: &str) -> DistError {
        DistError::unsupported(format!(
            "Backend {backend} does not support {}",
            self.name()
        ))
    }

    /// The op's [`OpType`] (what its `Work` and flight-recorder entry say).
    pub fn op_type(&self) -> OpType {
        match self {
            Op::Broadcast { .. } => OpType::Broadcast,
            Op::AllReduce { .. } => OpType::Allreduce,
            Op::AllReduceCoalesced { .. } => OpType::AllreduceCoalesced,
            Op::Reduce { .. } => OpType::Reduce,
            Op::AllGather { .. } => OpType::Allgather,
            Op::AllGatherIntoTensor { .. } => OpType::AllgatherBase,
            Op::AllGatherCoalesced { .. } => OpType::AllgatherCoalesced,
            Op::AllGatherIntoTensorCoalesced { .. } => OpType::Coalesced,
            Op::Gather { .. } => OpType::Gather,
            Op::Scatter { .. } => OpType::Scatter,
            Op::ReduceScatter { .. } => OpType::ReduceScatter,
            Op::ReduceScatterTensor { .. } => OpType::ReduceScatterBase,
            Op::ReduceScatterTensorCoalesced { .. } => OpType::Coalesced,
            Op::AllToAllSingle { .. } => OpType::AlltoallBase,
            Op::AllToAll { .. } => OpType::Alltoall,
            Op::Barrier { .. } => OpType::Barrier,
            Op::Send { .. } => OpType::Send,
            Op::Recv { .. } => OpType::Recv,
            Op::RecvAnysource { .. } => OpType::RecvAnysource,
        }
    }

    /// The tensors the op reads only, and those it writes (in-place tensors are outputs),
    /// as PyTorch lists them.
    pub fn sides(&self) -> (TensorList<'_>, TensorList<'_>) {
        use TensorList::{Flat, Nested};
        let one = std::slice::from_ref;
        match self {
            Op::Broadcast { tensors, .. }
            | Op::AllReduce { tensors, .. }
            | Op::AllReduceCoalesced { tensors, .. }
            | Op::Reduce { tensors, .. }
            | Op::Recv { tensors, .. }
            | Op::RecvAnysource { tensors, .. } => (NONE, Flat(tensors)),
            Op::Send { tensors, .. } => (Flat(tensors), NONE),
            Op::AllGather {
                outputs, inputs, ..
            }
            | Op::AllGatherCoalesced {
                outputs, inputs, ..
            }
            | Op::Gather {
                outputs, inputs, ..
            } => (Flat(inputs), Nested(outputs)),
            Op::Scatter {
                outputs, inputs, ..
            }
            | Op::ReduceScatter {
                outputs, inputs, ..
            } => (Nested(inputs), Flat(outputs)),
            Op::AllGatherIntoTensor { output, input, .. }
            | Op::ReduceScatterTensor { output, input, .. }
            | Op::AllToAllSingle { output, input, .. } => {
                (Flat(one(input.as_ref())), Flat(one(output.as_ref())))
            }
            Op::AllGatherIntoTensorCoalesced {
                outputs, inputs, ..
            }
            | Op::ReduceScatterTensorCoalesced {
                outputs, inputs, ..
            }
            | Op::AllToAll {
                outputs, inputs, ..
            } => (Flat(inputs), Flat(outputs)),
            Op::Barrier { .. } => (NONE, NONE),
        }
    }

    /// Every tensor of the op, inputs first.
    pub fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        let (ins, outs) = self.sides();
        ins.iter().chain(outs.iter())
    }

    /// Bytes the op's tensors hold on this rank: inputs plus outputs (in-place tensors once).
    pub fn nbytes(&self) -> usize {
        self.tensors().map(Tensor::nbytes).sum()
    }

    /// The op with every tensor replaced by `f(side, tensor)`, in the same layout (used to
    /// stage device tensors through host copies).
    ///
    /// # Errors
    /// The first error `f` returns.
    pub fn try_map_tensors(
        self,
        f: impl FnMut(Side, Tensor) -> Result<Tensor>,
    ) -> Result<Op<'static>> {
        self.map_tensors(f)
    }

    /// The op owning its tensors and lists (for keeping it beyond the call that made it, as a
    /// coalescing block does). Clones the tensor handles a borrowed op points at.
    pub fn into_owned(self) -> Op<'static> {
        let Ok(op) = self.map_tensors(|_, t| Ok::<_, Infallible>(t));
        op
    }

    /// [`Op::try_map_tensors`] for any error type.
    fn map_tensors<E>(
        self,
        mut f: impl FnMut(Side, Tensor) -> std::result::Result<Tensor, E>,
    ) -> std::result::Result<Op<'static>, E> {
        let mut flat =
            |side, ts: Cow<'_, [Tensor]>| -> std::result::Result<Cow<'static, [Tensor]>, E> {
                let mapped: std::result::Result<Vec<Tensor>, E> =
                    ts.into_owned().into_iter().map(|t| f(side, t)).collect();
                Ok(Cow::Owned(mapped?))
            };
        use Side::{Input as I, Output as O};
        Ok(match self {
            Op::Broadcast { tensors, opts } => Op::Broadcast {
                tensors: flat(O, tensors)?,
                opts,
            },
            Op::AllReduce { tensors, opts } => Op::AllReduce {
                tensors: flat(O, tensors)?,
                opts,
            },
            Op::AllReduceCoalesced { tensors, opts } => Op::AllReduceCoalesced {
                tensors: flat(O, tensors)?,
                opts,
            },
            Op::Reduce { tensors, opts } => Op::Reduce {
                tensors: flat(O, tensors)?,
                opts,
            },
            Op::AllGather {
                outputs,
                inputs,
                opts,
            } => Op::AllGather {
                outputs: map_nested(outputs, |l| flat(O, l.into()))?,
                inputs: flat(I, inputs)?,
                opts,
            },
            Op::AllGatherIntoTensor {
                output,
                input,
                opts,
            } => Op::AllGatherIntoTensor {
                output: single(O, output, &mut flat)?,
                input: single(I, input, &mut flat)?,
                opts,
            },
            Op::AllGatherCoalesced {
                outputs,
                inputs,
                opts,
            } => Op::AllGatherCoalesced {
                outputs: map_nested(outputs, |l| flat(O, l.into()))?,
                inputs: flat(I, inputs)?,
                opts,
            },
            Op::AllGatherIntoTensorCoalesced {
                outputs,
                inputs,
                opts,
            } => Op::AllGatherIntoTensorCoalesced {
                outputs: flat(O, outputs)?,
                inputs: flat(I, inputs)?,
                opts,
            },
            Op::Gather {
                outputs,
                inputs,
                opts,
            } => Op::Gather {
                outputs: map_nested(outputs, |l| flat(O, l.into()))?,
                inputs: flat(I, inputs)?,
                opts,
            },
            Op::Scatter {
                outputs,
                inputs,
                opts,
            } => Op::Scatter {
                outputs: flat(O, outputs)?,
                inputs: map_nested(inputs, |l| flat(I, l.into()))?,
                opts,
            },
            Op::ReduceScatter {
                outputs,
                inputs,
                opts,
            } => Op::ReduceScatter {
                outputs: flat(O, outputs)?,
                inputs: map_nested(inputs, |l| flat(I, l.into()))?,
                opts,
            },
            Op::ReduceScatterTensor {
                output,
                input,
                opts,
            } => Op::ReduceScatterTensor {
                output: single(O, output, &mut flat)?,
                input: single(I, input, &mut flat)?,
                opts,
            },
            Op::ReduceScatterTensorCoalesced {
                outputs,
                inputs,
                opts,
            } => Op::ReduceScatterTensorCoalesced {
                outputs: flat(O, outputs)?,
                inputs: flat(I, inputs)?,
                opts,
            },
            Op::AllToAllSingle {
                output,
                input,
                output_split_sizes,
                input_split_sizes,
                opts,
            } => Op::AllToAllSingle {
                output: single(O, output, &mut flat)?,
                input: single(I, input, &mut flat)?,
                output_split_sizes: Cow::Owned(output_split_sizes.into_owned()),
                input_split_sizes: Cow::Owned(input_split_sizes.into_owned()),
                opts,
            },
            Op::AllToAll {
                outputs,
                inputs,
                opts,
            } => Op::AllToAll {
                outputs: flat(O, outputs)?,
                inputs: flat(I, inputs)?,
                opts,
            },
            Op::Barrier { opts } => Op::Barrier { opts },
            Op::Send { tensors, dst, tag } => Op::Send {
                tensors: flat(I, tensors)?,
                dst,
                tag,
            },
            Op::Recv { tensors, src, tag } => Op::Recv {
                tensors: flat(O, tensors)?,
                src,
                tag,
            },
            Op::RecvAnysource { tensors, tag } => Op::RecvAnysource {
                tensors: flat(O, tensors)?,
                tag,
            },
        })
    }

    /// Checks the op's arguments as `ProcessGroupGloo` does, with its texts (see
    /// [`crate::checks`]); `to_self`: whether a send or receive may name this rank.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] naming the backend
    /// and op, e.g. "ProcessGroupGloo::allreduce: invalid tensor type …".
    pub fn check(&self, checks: &Checks<'_>, to_self: bool) -> Result<()> {
        let c = checks;
        match self {
            Op::Broadcast { tensors, opts } => c.broadcast(tensors, opts),
            Op::AllReduce { tensors, opts } => c.allreduce(tensors, opts.reduce_op),
            Op::AllReduceCoalesced { tensors, opts } => {
                c.allreduce_coalesced(tensors, opts.reduce_op)
            }
            Op::Reduce { tensors, opts } => c.reduce(tensors, opts),
            Op::AllGather {
                outputs, inputs, ..
            } => c.allgather(outputs, inputs),
            Op::AllGatherIntoTensor { output, input, .. } => c.allgather_base(output, input),
            Op::AllGatherCoalesced {
                outputs, inputs, ..
            } => c.allgather_coalesced(outputs, inputs),
            Op::AllGatherIntoTensorCoalesced {
                outputs, inputs, ..
            } => c.allgather_into_tensor_coalesced(outputs, inputs),
            Op::Gather {
                outputs,
                inputs,
                opts,
            } => c.gather(outputs, inputs, opts.root_rank).map(drop),
            Op::Scatter {
                outputs,
                inputs,
                opts,
            } => c.scatter(outputs, inputs, opts.root_rank).map(drop),
            Op::ReduceScatter {
                outputs,
                inputs,
                opts,
            } => c.reduce_scatter(outputs, inputs, opts.reduce_op),
            Op::ReduceScatterTensor {
                output,
                input,
                opts,
            } => c.reduce_scatter_base(output, input, opts.reduce_op),
            Op::ReduceScatterTensorCoalesced {
                outputs,
                inputs,
                opts,
            } => c.reduce_scatter_tensor_coalesced(outputs, inputs, opts.reduce_op),
            Op::AllToAllSingle {
                output,
                input,
                output_split_sizes,
                input_split_sizes,
                ..
            } => c
                .alltoall_base(output, input, output_split_sizes, input_split_sizes)
                .map(drop),
            Op::AllToAll {
                outputs, inputs, ..
            } => c.alltoall(outputs, inputs),
            Op::Barrier { .. } => Ok(()),
            Op::Send { tensors, dst, .. } => c.send(tensors, *dst, to_self),
            Op::Recv { tensors, src, .. } => c.recv(tensors, Some(*src), to_self),
            Op::RecvAnysource { tensors, .. } => c.recv(tensors, None, to_self),
        }
    }
}

fn map_nested<E>(
    lists: Cow<'_, [Vec<Tensor>]>,
    mut f: impl FnMut(Vec<Tensor>) -> std::result::Result<Cow<'static, [Tensor]>, E>,
) -> std::result::Result<Cow<'static, [Vec<Tensor>]>, E> {
    lists
        .into_owned()
        .into_iter()
        .map(|l| f(l).map(Cow::into_owned))
        .collect()
}

/// One tensor through a list mapper (`flat`).
fn single<E>(
    side: Side,
    t: Cow<'_, Tensor>,
    flat: &mut impl FnMut(Side, Cow<'_, [Tensor]>) -> std::result::Result<Cow<'static, [Tensor]>, E>,
) -> std::result::Result<Cow<'static, Tensor>, E> {
    let mut mapped = flat(side, Cow::Owned(vec![t.into_owned()]))?.into_owned();
    Ok(Cow::Owned(
        mapped.pop().expect("a list made from one tensor keeps it"),
    ))
}

impl std::fmt::Debug for Op<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ins, outs) = self.sides();
        write!(
            f,
            "Op({}, {} input(s), {} output(s))",
            self.name(),
            ins.iter().count(),
            outs.iter().count()
        )
    }
}

#[cfg(test)]
mod tests;
