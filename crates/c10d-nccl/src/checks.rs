//! The argument checks of [`ProcessGroupNccl`](crate::ProcessGroupNccl)'s ops, the first thing
//! each op runs, before it touches a device (so they run, and are tested, without a GPU).
//!
//! They are c10d-core's shared [`Checks`] (PyTorch's texts, prefixed
//! `"ProcessGroupNCCL::<op>: "`, the same as every other backend's), reached through `Deref`,
//! plus what NCCL cannot do, as PyTorch's `ProcessGroupNCCL` refuses it:
//! - one tensor per list where NCCL takes one buffer (broadcast, allreduce, allgather's input);
//! - reduce_scatter's blocks all of one size (one flat `ncclReduceScatter`).
//!
//! The device checks ("Tensors must be CUDA and dense", one device per op) come next, when
//! the op finds its communicator.

use c10d_core::checks::{At, Checks};
use c10d_core::{BroadcastOptions, ReduceOp, Result, Tensor};

/// The class name PyTorch's messages carry.
pub const NAME: &str = "ProcessGroupNCCL";

fn at(op: &str) -> At<'_> {
    At { backend: NAME, op }
}

/// The checks of rank `rank` of a group of `size`: every op of [`Checks`], some with NCCL's
/// additions (the methods below, which take precedence over the shared ones).
#[derive(Debug, Clone, Copy)]
pub struct NcclChecks(Checks<'static>);

impl NcclChecks {
    /// Rank `rank` of a group of `size`.
    pub fn new(rank: usize, size: usize) -> Self {
        NcclChecks(Checks {
            backend: NAME,
            rank,
            size,
        })
    }

    /// [`Checks::broadcast`], one tensor.
    ///
    /// # Errors
    /// The shared texts; "requires a single-element tensor list".
    pub fn broadcast(&self, tensors: &[Tensor], opts: &BroadcastOptions) -> Result<()> {
        self.0.broadcast(tensors, opts)?;
        at("broadcast").single(tensors)
    }

    /// [`Checks::allreduce`], one tensor.
    ///
    /// # Errors
    /// The shared texts; "requires a single-element tensor list".
    pub fn allreduce(&self, tensors: &[Tensor], op: ReduceOp) -> Result<()> {
        self.0.allreduce(tensors, op)?;
        at("allreduce").single(tensors)
    }

    /// [`Checks::allgather`], one input (and so one output list).
    ///
    /// # Errors
    /// The shared texts; "requires a single-element input tensor list".
    pub fn allgather(&self, outputs: &[Vec<Tensor>], inputs: &[Tensor]) -> Result<()> {
        self.0.allgather(outputs, inputs)?;
        at("allgather").single_of(inputs.len(), "input")
    }

    /// [`Checks::reduce_scatter`], every input block as large as the output.
    ///
    /// # Errors
    /// The shared texts; "uneven input blocks are not supported (input k has m elements,
    /// output n)".
    pub fn reduce_scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Vec<Tensor>],
        op: ReduceOp,
    ) -> Result<()> {
        self.0.reduce_scatter(outputs, inputs, op)?;
        let n = outputs[0].numel();
        match inputs[0].iter().enumerate().find(|(_, t)| t.numel() != n) {
            Some((k, t)) => Err(at("reduce_scatter").invalid(format!(
                "uneven input blocks are not supported (input {k} has {} elements, output {n})",
                t.numel()
            ))),
            None => Ok(()),
        }
    }

    /// [`Checks::send`]; NCCL sends to its own rank.
    ///
    /// # Errors
    /// As [`Checks::send`].
    pub fn send(&self, tensors: &[Tensor], dst: usize) -> Result<()> {
        self.0.send(tensors, dst, true)
    }

    /// [`Checks::recv`] from `src`; NCCL receives from its own rank.
    ///
    /// # Errors
    /// As [`Checks::recv`].
    pub fn recv(&self, tensors: &[Tensor], src: usize) -> Result<()> {
        self.0.recv(tensors, Some(src), true)
    }
}

impl std::ops::Deref for NcclChecks {
    type Target = Checks<'static>;
    fn deref(&self) -> &Checks<'static> {
        &self.0
    }
}
