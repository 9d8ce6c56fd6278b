//! Every collective ([`Op`]) on CUDA tensors, as PyTorch's `ProcessGroupNCCL` runs it (one
//! function per op, named as its `ProcessGroupNCCL.cpp` method, reached from `run`'s `match`):
//! each op is a few NCCL calls inside one NCCL group (see [`ProcessGroupNccl::launch`]), each
//! through the checked calls of [`crate::result`]. List forms that NCCL has no call for: the
//! list all_gather is one `ncclBroadcast` per rank straight into the output list (no buffer,
//! as PyTorch's uneven all_gather), reduce_scatter goes through a flat temporary buffer from
//! the stream-ordered allocator (refused during CUDA graph capture), gather, scatter and
//! all_to_all through send/recv pairs; barrier all-reduces the communicator's own byte.

use crate::checks::NcclChecks;
use crate::process_group::{Enqueue, ProcessGroupNccl, Submit};
use c10d_core::{
    AllToAllOptions, AllgatherOptions, AllreduceCoalescedOptions, AllreduceOptions, Backend,
    BackendOptions, BarrierOptions, BroadcastOptions, Collectives, DeviceType, GatherOptions, Op,
    OpType, ReduceOptions, ReduceScatterOptions, Result, ScatterOptions, Tensor, Work,
};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

fn ptr(t: &Tensor) -> *mut c_void {
    t.device_ptr().unwrap_or(0) as *mut c_void
}

impl Enqueue<'_> {
    /// Element count of `t` as NCCL counts it (complex numbers are two reals).
    fn count(&self, t: &Tensor) -> Result<(usize, crate::sys::ncclDataType_t)> {
        let ty = self.nccl_type(t.dtype())?;
        Ok((t.numel() * ty.per_element, ty.dtype))
    }

    /// The launch arguments for all of `t`.
    fn whole(&self, t: &Tensor) -> Result<crate::result::Launch> {
        let (n, ty) = self.count(t)?;
        Ok(self.args(n, ty))
    }

    pub(crate) fn all_reduce(&mut self, t: &Tensor, op: c10d_core::ReduceOp) -> Result<()> {
        let red = self.reduction(op, t.dtype())?;
        // SAFETY: in-place on `t`'s device memory, kept alive by the op until its end event;
        // the communicator is live and locked; the stream belongs to its device.
        Ok(unsafe { crate::result::all_reduce(self.lib, ptr(t), ptr(t), red, self.whole(t)?) }?)
    }

    fn broadcast(&self, src: &Tensor, dst: &Tensor, root: usize) -> Result<()> {
        // SAFETY: as in `all_reduce`; `src` and `dst` hold as many elements (checked by the
        // caller); `root` < size was checked by the caller.
        Ok(unsafe {
            crate::result::broadcast(self.lib, ptr(src), ptr(dst), root, self.whole(dst)?)
        }?)
    }

    fn send(&self, t: &Tensor, peer: usize) -> Result<()> {
        // SAFETY: as in `all_reduce`; `peer` < size was checked by the caller.
        Ok(unsafe { crate::result::send(self.lib, ptr(t), peer, self.whole(t)?) }?)
    }

    fn recv(&self, t: &Tensor, peer: usize) -> Result<()> {
        // SAFETY: as in `send`, writing `t`.
        Ok(unsafe { crate::result::recv(self.lib, ptr(t), peer, self.whole(t)?) }?)
    }

    /// Every rank's `input` into `outs[rank]`: one `ncclBroadcast` per rank in the op's group.
    fn gather_list(&self, outs: &[Tensor], input: &Tensor, me: usize) -> Result<()> {
        outs.iter().enumerate().try_for_each(|(r, o)| {
            let src = if r == me { input } else { o };
            self.broadcast(src, o, r)
        })
    }

    /// Device-to-device copy on the NCCL stream now, before the group's kernels (inputs).
    fn copy(&mut self, dst: &Tensor, src: &Tensor) -> Result<()> {
        // Queued at once, whatever becomes of the group: the op's memory must outlive it.
        self.copied = true;
        // SAFETY: both are kept alive by the op until its end event; the stream is the NCCL
        // stream of their device.
        unsafe { crate::memory::copy_async(dst, src, self.stream as cudarc::driver::sys::CUstream) }
    }
}

impl ProcessGroupNccl {
    fn op<'a>(
        &self,
        kind: OpType,
        inputs: &'a [Tensor],
        outputs: &'a [Tensor],
        timeout: Option<Duration>,
    ) -> Submit<'a> {
        Submit {
            kind,
            inputs,
            outputs,
            timeout,
            host_blocking: false,
            peer: None,
        }
    }

    /// The argument checks of this rank of the group.
    fn checks(&self) -> NcclChecks {
        NcclChecks::new(self.rank, self.size)
    }
}

impl Backend for ProcessGroupNccl {
    fn name(&self) -> &str {
        "nccl"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Cuda
    }
    fn timeout(&self) -> Duration {
        self.default_timeout()
    }
    fn set_timeout(&self, timeout: Duration) {
        self.set_default_timeout(timeout);
    }
    fn sequence_number(&self) -> u64 {
        self.sequence()
    }
    fn set_sequence_number(&self, seq: u64) {
        self.set_sequence(seq);
    }
    fn is_initialized(&self) -> bool {
        self.current().is_some()
    }

    fn supports_coalescing(&self) -> bool {
        true
    }
    fn start_coalescing(&self) -> Result<()> {
        self.start_block()
    }
    fn end_coalescing(&self) -> Result<Work> {
        self.end_block()
    }

    fn supports_splitting(&self) -> bool {
        true
    }
    fn split(&self, ranks: &[usize], opts: &BackendOptions) -> Result<Option<Arc<dyn Backend>>> {
        let options = crate::options::NcclOptions {
            config: self.options.config.clone(),
            is_high_priority_stream: self.options.is_high_priority_stream,
            ..crate::options::NcclOptions::from_backend_options(opts, &self.env)
        };
        Ok(self
            .split_child(ranks, options)?
            .map(|pg| Arc::new(pg) as Arc<dyn Backend>))
    }

    /// `ncclCommShrink` where the loaded NCCL has it (2.27) and the communicator is live;
    /// pending ops are aborted first (`NCCL_SHRINK_ABORT`) when it reports an error. `None`
    /// otherwise: the caller makes a new group.
    fn shrink(
        &self,
        ranks_to_exclude: &[usize],
        opts: &BackendOptions,
    ) -> Result<Option<Arc<dyn Backend>>> {
        let usable = self.lib.comm_shrink().is_ok()
            && self.current().is_some_and(|dc| !dc.comm.is_aborted());
        if !usable {
            return Ok(None);
        }
        let failed = self
            .current()
            .is_some_and(|dc| dc.comm.async_error().is_some());
        let options = crate::options::NcclOptions {
            config: self.options.config.clone(),
            is_high_priority_stream: self.options.is_high_priority_stream,
            ..crate::options::NcclOptions::from_backend_options(opts, &self.env)
        };
        Ok(
            ProcessGroupNccl::shrink(self, ranks_to_exclude, failed, options)?
                .map(|pg| Arc::new(pg) as Arc<dyn Backend>),
        )
    }

    fn abort(&self) {
        self.abort_all("abort() was called");
    }
    fn shutdown(&self) {
        self.shutdown_all();
    }
}

impl Collectives for ProcessGroupNccl {
    fn run(&self, op: Op) -> Result<Work> {
        match op {
            Op::Broadcast { tensors, opts } => broadcast(self, &tensors, &opts),
            Op::AllReduce { tensors, opts } => allreduce(self, &tensors, &opts),
            Op::AllReduceCoalesced { tensors, opts } => allreduce_coalesced(self, &tensors, &opts),
            Op::Reduce { tensors, opts } => reduce(self, &tensors, &opts),
            Op::AllGather {
                outputs,
                inputs,
                opts,
            } => allgather(self, &outputs, &inputs, &opts),
            Op::AllGatherIntoTensor {
                output,
                input,
                opts,
            } => allgather_base(self, &output, &input, &opts),
            Op::AllGatherCoalesced {
                outputs,
                inputs,
                opts,
            } => allgather_coalesced(self, &outputs, &inputs, &opts),
            Op::AllGatherIntoTensorCoalesced {
                outputs,
                inputs,
                opts,
            } => allgather_into_tensor_coalesced(self, &outputs, &inputs, &opts),
            Op::Gather {
                outputs,
                inputs,
                opts,
            } => gather(self, &outputs, &inputs, &opts),
            Op::Scatter {
                outputs,
                inputs,
                opts,
            } => scatter(self, &outputs, &inputs, &opts),
            Op::ReduceScatter {
                outputs,
                inputs,
                opts,
            } => reduce_scatter(self, &outputs, &inputs, &opts),
            Op::ReduceScatterTensor {
                output,
                input,
                opts,
            } => reduce_scatter_base(self, &output, &input, &opts),
            Op::ReduceScatterTensorCoalesced {
                outputs,
                inputs,
                opts,
            } => reduce_scatter_tensor_coalesced(self, &outputs, &inputs, &opts),
            Op::AllToAllSingle {
                output,
                input,
                output_split_sizes,
                input_split_sizes,
                opts,
            } => alltoall_base(
                self,
                &output,
                &input,
                &output_split_sizes,
                &input_split_sizes,
                &opts,
            ),
            Op::AllToAll {
                outputs,
                inputs,
                opts,
            } => alltoall(self, &outputs, &inputs, &opts),
            Op::Barrier { opts } => barrier(self, &opts),
            Op::Send { tensors, dst, tag } => send(self, &tensors, dst, tag),
            Op::Recv { tensors, src, tag } => recv(self, &tensors, src, tag),
            op => Err(op.unsupported_by("nccl")),
        }
    }
}

fn broadcast(pg: &ProcessGroupNccl, tensors: &[Tensor], opts: &BroadcastOptions) -> Result<Work> {
    pg.checks().broadcast(tensors, opts)?;
    let t = tensors[0].clone();
    pg.launch(
        pg.op(OpType::Broadcast, tensors, tensors, opts.timeout),
        |e| e.broadcast(&t, &t, opts.root_rank),
    )
}

fn allreduce(pg: &ProcessGroupNccl, tensors: &[Tensor], opts: &AllreduceOptions) -> Result<Work> {
    pg.checks().allreduce(tensors, opts.reduce_op)?;
    let t = tensors[0].clone();
    pg.launch(
        pg.op(OpType::Allreduce, tensors, tensors, opts.timeout),
        |e| e.all_reduce(&t, opts.reduce_op),
    )
}

fn allreduce_coalesced(
    pg: &ProcessGroupNccl,
    tensors: &[Tensor],
    opts: &AllreduceCoalescedOptions,
) -> Result<Work> {
    pg.checks().allreduce_coalesced(tensors, opts.reduce_op)?;
    let ts = tensors.to_vec();
    pg.launch(
        pg.op(OpType::AllreduceCoalesced, tensors, tensors, opts.timeout),
        |e| ts.iter().try_for_each(|t| e.all_reduce(t, opts.reduce_op)),
    )
}

fn reduce(pg: &ProcessGroupNccl, tensors: &[Tensor], opts: &ReduceOptions) -> Result<Work> {
    pg.checks().reduce(tensors, opts)?;
    let t = tensors[0].clone();
    pg.launch(pg.op(OpType::Reduce, tensors, tensors, opts.timeout), |e| {
        let red = e.reduction(opts.reduce_op, t.dtype())?;
        let l = e.whole(&t)?;
        // SAFETY: in-place on `t` (kept alive by the op); live, locked communicator.
        Ok(unsafe { crate::result::reduce(e.lib, ptr(&t), ptr(&t), red, opts.root_rank, l) }?)
    })
}

fn allgather(
    pg: &ProcessGroupNccl,
    outputs: &[Vec<Tensor>],
    inputs: &[Tensor],
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks().allgather(outputs, inputs)?;
    let input = inputs[0].clone();
    let outs = outputs[0].clone();
    let me = pg.rank;
    pg.launch(
        pg.op(OpType::Allgather, inputs, &outputs[0], opts.timeout),
        |e| e.gather_list(&outs, &input, me),
    )
}

fn allgather_base(
    pg: &ProcessGroupNccl,
    output: &Tensor,
    input: &Tensor,
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks().allgather_base(output, input)?;
    let (o, i) = (output.clone(), input.clone());
    let (ins, outs) = (std::slice::from_ref(input), std::slice::from_ref(output));
    pg.launch(pg.op(OpType::AllgatherBase, ins, outs, opts.timeout), |e| {
        gather_into(e, &o, &i)
    })
}

fn allgather_coalesced(
    pg: &ProcessGroupNccl,
    outputs: &[Vec<Tensor>],
    inputs: &[Tensor],
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks().allgather_coalesced(outputs, inputs)?;
    // outputs[r][i] receives inputs[i] of rank r: one list gather per input.
    let flats: Vec<(Vec<Tensor>, Tensor)> = (0..inputs.len())
        .map(|i| {
            (
                outputs.iter().map(|o| o[i].clone()).collect(),
                inputs[i].clone(),
            )
        })
        .collect();
    let all_out: Vec<Tensor> = outputs.iter().flatten().cloned().collect();
    let me = pg.rank;
    pg.launch(
        pg.op(OpType::AllgatherCoalesced, inputs, &all_out, opts.timeout),
        |e| {
            flats
                .iter()
                .try_for_each(|(outs, input)| e.gather_list(outs, input, me))
        },
    )
}

fn allgather_into_tensor_coalesced(
    pg: &ProcessGroupNccl,
    outputs: &[Tensor],
    inputs: &[Tensor],
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks()
        .allgather_into_tensor_coalesced(outputs, inputs)?;
    let pairs = pairs(outputs, inputs);
    pg.launch(
        pg.op(OpType::AllgatherCoalesced, inputs, outputs, opts.timeout),
        |e| pairs.iter().try_for_each(|(o, i)| gather_into(e, o, i)),
    )
}

fn gather(
    pg: &ProcessGroupNccl,
    outputs: &[Vec<Tensor>],
    inputs: &[Tensor],
    opts: &GatherOptions,
) -> Result<Work> {
    let root = opts.root_rank;
    let outs = pg.checks().gather(outputs, inputs, root)?.to_vec();
    let input = inputs[0].clone();
    let me = pg.rank;
    pg.launch(pg.op(OpType::Gather, inputs, &outs, opts.timeout), |e| {
        if me != root {
            return e.send(&input, root);
        }
        for (r, o) in outs.iter().enumerate() {
            if r == root {
                e.copy(o, &input)?
            } else {
                e.recv(o, r)?
            }
        }
        Ok(())
    })
}

fn scatter(
    pg: &ProcessGroupNccl,
    outputs: &[Tensor],
    inputs: &[Vec<Tensor>],
    opts: &ScatterOptions,
) -> Result<Work> {
    let root = opts.root_rank;
    let ins = pg.checks().scatter(outputs, inputs, root)?.to_vec();
    let output = outputs[0].clone();
    let me = pg.rank;
    pg.launch(pg.op(OpType::Scatter, &ins, outputs, opts.timeout), |e| {
        if me != root {
            return e.recv(&output, root);
        }
        for (r, i) in ins.iter().enumerate() {
            if r == root {
                e.copy(&output, i)?
            } else {
                e.send(i, r)?
            }
        }
        Ok(())
    })
}

fn reduce_scatter(
    pg: &ProcessGroupNccl,
    outputs: &[Tensor],
    inputs: &[Vec<Tensor>],
    opts: &ReduceScatterOptions,
) -> Result<Work> {
    const OP: &str = "reduce_scatter";
    pg.checks()
        .reduce_scatter(outputs, inputs, opts.reduce_op)?;
    let output = outputs[0].clone();
    let ins = inputs[0].clone();
    pg.launch(
        pg.op(OpType::ReduceScatter, &ins, outputs, opts.timeout),
        |e| {
            let n = output.numel();
            let flat = e.scratch(OP, output.dtype(), n * ins.len())?;
            for (k, i) in ins.iter().enumerate() {
                e.copy(&flat.flat_slice(k * n, n)?, i)?;
            }
            scatter_from(e, &output, &flat, opts.reduce_op)
        },
    )
}

fn reduce_scatter_base(
    pg: &ProcessGroupNccl,
    output: &Tensor,
    input: &Tensor,
    opts: &ReduceScatterOptions,
) -> Result<Work> {
    pg.checks()
        .reduce_scatter_base(output, input, opts.reduce_op)?;
    let (o, i) = (output.clone(), input.clone());
    let (ins, outs) = (std::slice::from_ref(input), std::slice::from_ref(output));
    pg.launch(
        pg.op(OpType::ReduceScatterBase, ins, outs, opts.timeout),
        |e| scatter_from(e, &o, &i, opts.reduce_op),
    )
}

fn reduce_scatter_tensor_coalesced(
    pg: &ProcessGroupNccl,
    outputs: &[Tensor],
    inputs: &[Tensor],
    opts: &ReduceScatterOptions,
) -> Result<Work> {
    pg.checks()
        .reduce_scatter_tensor_coalesced(outputs, inputs, opts.reduce_op)?;
    let pairs = pairs(outputs, inputs);
    pg.launch(
        pg.op(OpType::Coalesced, inputs, outputs, opts.timeout),
        |e| {
            pairs
                .iter()
                .try_for_each(|(o, i)| scatter_from(e, o, i, opts.reduce_op))
        },
    )
}

fn alltoall_base(
    pg: &ProcessGroupNccl,
    output: &Tensor,
    input: &Tensor,
    output_split_sizes: &[usize],
    input_split_sizes: &[usize],
    opts: &AllToAllOptions,
) -> Result<Work> {
    let (out_counts, in_counts) =
        pg.checks()
            .alltoall_base(output, input, output_split_sizes, input_split_sizes)?;
    let (o, i) = (output.clone(), input.clone());
    let (ins, outs) = (std::slice::from_ref(input), std::slice::from_ref(output));
    pg.launch(pg.op(OpType::AlltoallBase, ins, outs, opts.timeout), |e| {
        let (mut so, mut ro) = (0, 0);
        for r in 0..out_counts.len() {
            e.send(&i.flat_slice(so, in_counts[r])?, r)?;
            e.recv(&o.flat_slice(ro, out_counts[r])?, r)?;
            so += in_counts[r];
            ro += out_counts[r];
        }
        Ok(())
    })
}

fn alltoall(
    pg: &ProcessGroupNccl,
    outputs: &[Tensor],
    inputs: &[Tensor],
    opts: &AllToAllOptions,
) -> Result<Work> {
    pg.checks().alltoall(outputs, inputs)?;
    let (os, is) = (outputs.to_vec(), inputs.to_vec());
    pg.launch(
        pg.op(OpType::Alltoall, inputs, outputs, opts.timeout),
        |e| {
            for r in 0..os.len() {
                e.send(&is[r], r)?;
                e.recv(&os[r], r)?;
            }
            Ok(())
        },
    )
}

fn barrier(pg: &ProcessGroupNccl, opts: &BarrierOptions) -> Result<Work> {
    let device = match (opts.device, opts.device_ids.first()) {
        (Some(d), _) => d,
        (None, Some(&i)) => c10d_core::Device::Cuda(i),
        (None, None) => pg.default_device()?,
    };
    let t = pg.device_comm(device)?.barrier_byte.clone();
    // No leases on the group's own byte: concurrent barriers of one group may share it.
    let mut op = pg.op(OpType::Barrier, &[], &[], opts.timeout);
    op.host_blocking = true;
    pg.launch(op, |e| {
        e.keep.push(t.clone());
        e.all_reduce(&t, c10d_core::ReduceOp::Sum)
    })
}

fn send(pg: &ProcessGroupNccl, tensors: &[Tensor], dst: usize, _tag: i64) -> Result<Work> {
    pg.checks().send(tensors, dst)?;
    let t = tensors[0].clone();
    let op = Submit {
        peer: Some(dst),
        ..pg.op(OpType::Send, tensors, &[], None)
    };
    pg.launch(op, |e| e.send(&t, dst))
}

fn recv(pg: &ProcessGroupNccl, tensors: &[Tensor], src: usize, _tag: i64) -> Result<Work> {
    pg.checks().recv(tensors, src)?;
    let t = tensors[0].clone();
    let op = Submit {
        peer: Some(src),
        ..pg.op(OpType::Recv, &[], tensors, None)
    };
    pg.launch(op, |e| e.recv(&t, src))
}

/// `output` = the concatenation of every rank's `input` (ncclAllGather).
fn gather_into(e: &mut Enqueue<'_>, output: &Tensor, input: &Tensor) -> Result<()> {
    let l = e.whole(input)?;
    // SAFETY: `output` holds size × `input` elements (checked by the caller); both alive for
    // the op; live, locked communicator.
    Ok(unsafe { crate::result::all_gather(e.lib, ptr(input), ptr(output), l) }?)
}

/// `output` = this rank's block of the reduction of every rank's `input` (ncclReduceScatter).
fn scatter_from(
    e: &mut Enqueue<'_>,
    output: &Tensor,
    input: &Tensor,
    op: c10d_core::ReduceOp,
) -> Result<()> {
    let red = e.reduction(op, output.dtype())?;
    let l = e.whole(output)?;
    // SAFETY: `input` holds size × `output` elements (checked by the caller); both alive for
    // the op; live, locked communicator.
    Ok(unsafe { crate::result::reduce_scatter(e.lib, ptr(input), ptr(output), red, l) }?)
}

/// The (output, input) pairs of a `*_tensor_coalesced` op (checked by the caller).
fn pairs(outputs: &[Tensor], inputs: &[Tensor]) -> Vec<(Tensor, Tensor)> {
    outputs
        .iter()
        .cloned()
        .zip(inputs.iter().cloned())
        .collect()
}
