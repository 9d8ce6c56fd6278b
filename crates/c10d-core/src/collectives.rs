//! [`Collectives`]: the one entry point that runs an [`Op`], and PyTorch's call forms built
//! on it (`pg.all_reduce(&tensors, &opts)` …), written once for every backend, every wrapper
//! and [`ProcessGroup`](crate::ProcessGroup).
//!
//! An implementer writes [`Collectives::run`] only; the other methods build the op from
//! PyTorch's C++ signatures (`std::vector<std::vector<at::Tensor>>` is `&[Vec<Tensor>]`) and
//! run it. Do not override them: wrappers see ops only through `run`.

use crate::error::Result;
use crate::op::Op;
use crate::options::*;
use crate::tensor::Tensor;
use crate::work::Work;
use std::borrow::Cow;

/// Runs ops: a backend, a wrapper of one, or a process group (which picks the backend of the
/// tensors' device type).
///
/// Argument errors are returned synchronously as `Err` (naming the backend and op, with
/// PyTorch's texts); communication errors fail the returned [`Work`].
pub trait Collectives {
    /// Runs `op` (PyTorch's per-op `Backend` virtuals, as one entry point).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`](crate::DistError::InvalidArgument) for bad arguments,
    /// [`DistError::Unsupported`](crate::DistError::Unsupported) "Backend {name} does not
    /// support {op}" for an op the backend lacks; a failure after the op was accepted fails
    /// the returned work instead.
    fn run(&self, op: Op<'_>) -> Result<Work>;

    /// `broadcast` ([`Op::Broadcast`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn broadcast(&self, tensors: &[Tensor], opts: &BroadcastOptions) -> Result<Work> {
        self.run(Op::Broadcast {
            tensors: Cow::Borrowed(tensors),
            opts: opts.clone(),
        })
    }
    /// `allreduce` ([`Op::AllReduce`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn all_reduce(&self, tensors: &[Tensor], opts: &AllreduceOptions) -> Result<Work> {
        self.run(Op::AllReduce {
            tensors: Cow::Borrowed(tensors),
            opts: opts.clone(),
        })
    }
    /// `allreduce_coalesced` ([`Op::AllReduceCoalesced`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn all_reduce_coalesced(
        &self,
        tensors: &[Tensor],
        opts: &AllreduceCoalescedOptions,
    ) -> Result<Work> {
        self.run(Op::AllReduceCoalesced {
            tensors: Cow::Borrowed(tensors),
            opts: opts.clone(),
        })
    }
    /// `reduce` ([`Op::Reduce`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn reduce(&self, tensors: &[Tensor], opts: &ReduceOptions) -> Result<Work> {
        self.run(Op::Reduce {
            tensors: Cow::Borrowed(tensors),
            opts: opts.clone(),
        })
    }
    /// `allgather` ([`Op::AllGather`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn all_gather(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        self.run(Op::AllGather {
            outputs: Cow::Borrowed(outputs),
            inputs: Cow::Borrowed(inputs),
            opts: opts.clone(),
        })
    }
    /// `_allgather_base` / `all_gather_into_tensor` ([`Op::AllGatherIntoTensor`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn all_gather_into_tensor(
        &self,
        output: &Tensor,
        input: &Tensor,
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        self.run(Op::AllGatherIntoTensor {
            output: Cow::Borrowed(output),
            input: Cow::Borrowed(input),
            opts: opts.clone(),
        })
    }
    /// `allgather_coalesced` ([`Op::AllGatherCoalesced`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn all_gather_coalesced(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        self.run(Op::AllGatherCoalesced {
            outputs: Cow::Borrowed(outputs),
            inputs: Cow::Borrowed(inputs),
            opts: opts.clone(),
        })
    }
    /// `allgather_into_tensor_coalesced` ([`Op::AllGatherIntoTensorCoalesced`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn all_gather_into_tensor_coalesced(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        self.run(Op::AllGatherIntoTensorCoalesced {
            outputs: Cow::Borrowed(outputs),
            inputs: Cow::Borrowed(inputs),
            opts: opts.clone(),
        })
    }
    /// `gather` ([`Op::Gather`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn gather(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &GatherOptions,
    ) -> Result<Work> {
        self.run(Op::Gather {
            outputs: Cow::Borrowed(outputs),
            inputs: Cow::Borrowed(inputs),
            opts: opts.clone(),
        })
    }
    /// `scatter` ([`Op::Scatter`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Vec<Tensor>],
        opts: &ScatterOptions,
    ) -> Result<Work> {
        self.run(Op::Scatter {
            outputs: Cow::Borrowed(outputs),
            inputs: Cow::Borrowed(inputs),
            opts: opts.clone(),
        })
    }
    /// `reduce_scatter` ([`Op::ReduceScatter`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn reduce_scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Vec<Tensor>],
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        self.run(Op::ReduceScatter {
            outputs: Cow::Borrowed(outputs),
            inputs: Cow::Borrowed(inputs),
            opts: opts.clone(),
        })
    }
    /// `_reduce_scatter_base` / `reduce_scatter_tensor` ([`Op::ReduceScatterTensor`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn reduce_scatter_tensor(
        &self,
        output: &Tensor,
        input: &Tensor,
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        self.run(Op::ReduceScatterTensor {
            output: Cow::Borrowed(output),
            input: Cow::Borrowed(input),
            opts: opts.clone(),
        })
    }
    /// `reduce_scatter_tensor_coalesced` ([`Op::ReduceScatterTensorCoalesced`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn reduce_scatter_tensor_coalesced(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        self.run(Op::ReduceScatterTensorCoalesced {
            outputs: Cow::Borrowed(outputs),
            inputs: Cow::Borrowed(inputs),
            opts: opts.clone(),
        })
    }
    /// `alltoall_base` / `all_to_all_single` ([`Op::AllToAllSingle`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn all_to_all_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
        opts: &AllToAllOptions,
    ) -> Result<Work> {
        self.run(Op::AllToAllSingle {
            output: Cow::Borrowed(output),
            input: Cow::Borrowed(input),
            output_split_sizes: Cow::Borrowed(output_split_sizes),
            input_split_sizes: Cow::Borrowed(input_split_sizes),
            opts: opts.clone(),
        })
    }
    /// `alltoall` ([`Op::AllToAll`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn all_to_all(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &AllToAllOptions,
    ) -> Result<Work> {
        self.run(Op::AllToAll {
            outputs: Cow::Borrowed(outputs),
            inputs: Cow::Borrowed(inputs),
            opts: opts.clone(),
        })
    }
    /// `barrier` ([`Op::Barrier`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn barrier(&self, opts: &BarrierOptions) -> Result<Work> {
        self.run(Op::Barrier { opts: opts.clone() })
    }
    /// `send` to group rank `dst` with `tag` ([`Op::Send`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn send(&self, tensors: &[Tensor], dst: usize, tag: i64) -> Result<Work> {
        self.run(Op::Send {
            tensors: Cow::Borrowed(tensors),
            dst,
            tag,
        })
    }
    /// `recv` from group rank `src` with `tag` ([`Op::Recv`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn recv(&self, tensors: &[Tensor], src: usize, tag: i64) -> Result<Work> {
        self.run(Op::Recv {
            tensors: Cow::Borrowed(tensors),
            src,
            tag,
        })
    }
    /// `recvAnysource` (see [`Work::source_rank`]) ([`Op::RecvAnysource`]).
    ///
    /// # Errors
    /// As [`Collectives::run`].
    fn recv_anysource(&self, tensors: &[Tensor], tag: i64) -> Result<Work> {
        self.run(Op::RecvAnysource {
            tensors: Cow::Borrowed(tensors),
            tag,
        })
    }
}
