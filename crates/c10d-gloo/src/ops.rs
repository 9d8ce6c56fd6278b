//! The ops of [`ProcessGroupGloo`]: `Collectives::run` sends each [`Op`] to the function
//! named as its method in PyTorch's `ProcessGroupGloo.cpp` (`allreduce`, `allgather_base` for
//! `_allgather_base`, `alltoall_base` …), which checks the arguments, builds the op's body and
//! submits it; the `Backend` trait's non-op methods come first.

use crate::algo;
use crate::bodies::*;
use crate::checks::*;
use crate::engine::{lock, CollBody};
use crate::process_group::Launch;
use crate::slices::*;
use crate::ProcessGroupGloo;
use c10d_core::reduce::{finalize, prescale};
use c10d_core::*;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Backend for ProcessGroupGloo {
    fn name(&self) -> &str {
        "gloo"
    }
    fn rank(&self) -> usize {
        self.id.rank
    }
    fn size(&self) -> usize {
        self.id.size
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }
    fn timeout(&self) -> Duration {
        *lock(&self.timeout)
    }
    fn set_timeout(&self, timeout: Duration) {
        *lock(&self.timeout) = timeout;
    }
    fn sequence_number(&self) -> u64 {
        lock(&self.shared.queue).seq
    }
    fn is_initialized(&self) -> bool {
        self.shared.initialized.load(Ordering::Acquire) || self.id.size == 1
    }

    fn monitored_barrier(&self, opts: &BarrierOptions, wait_all_ranks: bool) -> Result<()> {
        let timeout = self.op_timeout(opts.timeout);
        let body: CollBody = Box::new(move |comm, _ins, _outs| {
            algo::barrier::monitored(comm, timeout, wait_all_ranks)
        });
        // The engine's own deadline must not pre-empt the barrier's reporting.
        let w = self.submit(Launch {
            op: OpType::MonitoredBarrier,
            dtype: DType::U8,
            total: 0,
            timeout: Some(timeout.saturating_add(Duration::from_secs(5))),
            inputs: &[],
            outputs: &[],
            result: Vec::new(),
            body,
            blocking: true,
        })?;
        w.wait()
    }

    fn abort(&self) {
        self.stop(
            format!(
                "ProcessGroupGloo (group {}, rank {}) was aborted",
                self.id.group_name, self.id.rank
            ),
            false,
        );
        self.join();
    }

    fn shutdown(&self) {
        self.shut_down();
    }
}

impl Collectives for ProcessGroupGloo {
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
            Op::RecvAnysource { tensors, tag } => recv_anysource(self, &tensors, tag),
            op => Err(op.unsupported_by("gloo")),
        }
    }
}

fn broadcast(pg: &ProcessGroupGloo, tensors: &[Tensor], opts: &BroadcastOptions) -> Result<Work> {
    pg.checks().broadcast(tensors, opts)?;
    cpu("broadcast", tensors)?;
    let root = opts.root_rank;
    let src = if pg.id.rank == root {
        opts.root_tensor
    } else {
        0
    };
    let algo = pg.algo;
    let t0 = &tensors[0];
    let body: CollBody = Box::new(move |comm, _ins, mut outs| {
        let (a, b) = outs.split_at_mut(src);
        let (buf, b) = b.split_first_mut().expect("src < len");
        algo.broadcast(comm, buf, root)?;
        for t in a.iter_mut().chain(b.iter_mut()) {
            t.copy_from_slice(buf);
        }
        Ok(())
    });
    pg.submit(Launch {
        op: OpType::Broadcast,
        dtype: t0.dtype(),
        total: t0.nbytes() as u64,
        timeout: opts.timeout,
        inputs: &[],
        outputs: tensors,
        result: tensors.to_vec(),
        body,
        blocking: !opts.async_op,
    })
}

fn allreduce(pg: &ProcessGroupGloo, tensors: &[Tensor], opts: &AllreduceOptions) -> Result<Work> {
    pg.checks().allreduce(tensors, opts.reduce_op)?;
    cpu("allreduce", tensors)?;
    let dtype = tensors[0].dtype();
    let body = all_reduce_body(pg.algo, opts.reduce_op, dtype, pg.id.size);
    pg.submit(Launch {
        op: OpType::Allreduce,
        dtype,
        total: tensors[0].nbytes() as u64,
        timeout: opts.timeout,
        inputs: &[],
        outputs: tensors,
        result: tensors.to_vec(),
        body,
        blocking: !opts.async_op,
    })
}

fn allreduce_coalesced(
    pg: &ProcessGroupGloo,
    tensors: &[Tensor],
    opts: &AllreduceCoalescedOptions,
) -> Result<Work> {
    let rop = opts.reduce_op;
    pg.checks().allreduce_coalesced(tensors, rop)?;
    cpu("allreduce_coalesced", tensors)?;
    let dtype = tensors[0].dtype();
    let total = nbytes(tensors) as usize;
    let (algo, n) = (pg.algo, pg.id.size);
    let body: CollBody = Box::new(move |comm, _ins, mut outs| {
        let mut s = comm.take_scratch(total);
        let flat = s.bytes();
        let mut off = 0;
        for t in outs.iter() {
            flat[off..off + t.len()].copy_from_slice(t);
            off += t.len();
        }
        prescale(rop, dtype, flat)?;
        algo.all_reduce(comm, flat, rop.combine_op(), dtype)?;
        finalize(rop, dtype, flat, n)?;
        let mut off = 0;
        for t in outs.iter_mut() {
            let l = t.len();
            t.copy_from_slice(&flat[off..off + l]);
            off += l;
        }
        comm.put_scratch(s);
        Ok(())
    });
    pg.submit(Launch {
        op: OpType::AllreduceCoalesced,
        dtype,
        total: total as u64,
        timeout: opts.timeout,
        inputs: &[],
        outputs: tensors,
        result: tensors.to_vec(),
        body,
        blocking: !opts.async_op,
    })
}

fn reduce(pg: &ProcessGroupGloo, tensors: &[Tensor], opts: &ReduceOptions) -> Result<Work> {
    pg.checks().reduce(tensors, opts)?;
    cpu("reduce", tensors)?;
    let dtype = tensors[0].dtype();
    let rop = opts.reduce_op;
    let (root, n) = (opts.root_rank, pg.id.size);
    let total = tensors[0].nbytes() as u64;
    // Direct to the root while its scratch (n buffers) stays small, segmented above.
    let segmented = n > 2 && tensors[0].nbytes() * n > pg.algo.small_reduce_scratch;
    let (body, ins, outs) = if pg.id.rank == root {
        (
            reduce_at_root(rop, dtype, root, n, segmented),
            &[][..],
            tensors,
        )
    } else {
        (
            reduce_contribute(rop, dtype, root, segmented),
            tensors,
            &[][..],
        )
    };
    pg.submit(Launch {
        op: OpType::Reduce,
        dtype,
        total,
        timeout: opts.timeout,
        inputs: ins,
        outputs: outs,
        result: tensors.to_vec(),
        body,
        blocking: !opts.async_op,
    })
}

fn allgather(
    pg: &ProcessGroupGloo,
    outputs: &[Vec<Tensor>],
    inputs: &[Tensor],
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks().allgather(outputs, inputs)?;
    cpu("allgather", inputs.iter().chain(outputs.iter().flatten()))?;
    let flat: Vec<Tensor> = outputs.iter().flatten().cloned().collect();
    let algo = pg.algo;
    let body: CollBody =
        Box::new(move |comm, ins, mut outs| algo.all_gather(comm, &ins, &mut outs));
    pg.submit(Launch {
        op: OpType::Allgather,
        dtype: inputs[0].dtype(),
        total: nbytes(inputs),
        timeout: opts.timeout,
        inputs,
        outputs: &flat,
        result: flat.clone(),
        body,
        blocking: !opts.async_op,
    })
}

fn allgather_base(
    pg: &ProcessGroupGloo,
    output: &Tensor,
    input: &Tensor,
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks().allgather_base(output, input)?;
    cpu("_allgather_base", [output, input])?;
    let n = pg.id.size;
    let algo = pg.algo;
    let body: CollBody = Box::new(move |comm, ins, mut outs| {
        let mut parts = split_n(std::mem::take(&mut outs[0]), n);
        algo.all_gather(comm, &ins, &mut parts)
    });
    let (i, o) = (std::slice::from_ref(input), std::slice::from_ref(output));
    pg.submit(Launch {
        op: OpType::AllgatherBase,
        dtype: input.dtype(),
        total: input.nbytes() as u64,
        timeout: opts.timeout,
        inputs: i,
        outputs: o,
        result: vec![output.clone()],
        body,
        blocking: !opts.async_op,
    })
}

fn allgather_coalesced(
    pg: &ProcessGroupGloo,
    outputs: &[Vec<Tensor>],
    inputs: &[Tensor],
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks().allgather_coalesced(outputs, inputs)?;
    cpu(
        "allgather_coalesced",
        inputs.iter().chain(outputs.iter().flatten()),
    )?;
    let n = pg.id.size;
    // Flatten as [i * n + p] = outputs[p][i].
    let flat: Vec<Tensor> = (0..inputs.len())
        .flat_map(|i| (0..n).map(move |p| (i, p)))
        .map(|(i, p)| outputs[p][i].clone())
        .collect();
    let algo = pg.algo;
    let body: CollBody =
        Box::new(move |comm, ins, mut outs| algo.all_gather(comm, &ins, &mut outs));
    let result: Vec<Tensor> = outputs.iter().flatten().cloned().collect();
    pg.submit(Launch {
        op: OpType::AllgatherCoalesced,
        dtype: inputs[0].dtype(),
        total: nbytes(inputs),
        timeout: opts.timeout,
        inputs,
        outputs: &flat,
        result,
        body,
        blocking: !opts.async_op,
    })
}

fn allgather_into_tensor_coalesced(
    pg: &ProcessGroupGloo,
    outputs: &[Tensor],
    inputs: &[Tensor],
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks()
        .allgather_into_tensor_coalesced(outputs, inputs)?;
    cpu(
        "allgather_into_tensor_coalesced",
        inputs.iter().chain(outputs),
    )?;
    let n = pg.id.size;
    let algo = pg.algo;
    let body: CollBody = Box::new(move |comm, ins, outs| {
        // outs[i] split into n parts, flattened as [i * n + p].
        let mut parts: Vec<&mut [u8]> = outs.into_iter().flat_map(|o| split_n(o, n)).collect();
        algo.all_gather(comm, &ins, &mut parts)
    });
    pg.submit(Launch {
        op: OpType::AllgatherCoalesced,
        dtype: inputs[0].dtype(),
        total: nbytes(inputs),
        timeout: opts.timeout,
        inputs,
        outputs,
        result: outputs.to_vec(),
        body,
        blocking: !opts.async_op,
    })
}

fn gather(
    pg: &ProcessGroupGloo,
    outputs: &[Vec<Tensor>],
    inputs: &[Tensor],
    opts: &GatherOptions,
) -> Result<Work> {
    let root = opts.root_rank;
    // The root gathers into its list; the others send only.
    let gathered = pg.checks().gather(outputs, inputs, root)?;
    cpu("gather", gathered.iter().chain(inputs))?;
    let input = &inputs[0];
    let (dtype, total) = (input.dtype(), input.nbytes() as u64);
    let body: CollBody =
        Box::new(move |comm, ins, mut outs| algo::exchange::gather(comm, ins[0], &mut outs, root));
    pg.submit(Launch {
        op: OpType::Gather,
        dtype,
        total,
        timeout: opts.timeout,
        inputs,
        outputs: gathered,
        result: gathered.to_vec(),
        body,
        blocking: !opts.async_op,
    })
}

fn scatter(
    pg: &ProcessGroupGloo,
    outputs: &[Tensor],
    inputs: &[Vec<Tensor>],
    opts: &ScatterOptions,
) -> Result<Work> {
    let root = opts.root_rank;
    // The root scatters from its list; the others receive only.
    let scattered = pg.checks().scatter(outputs, inputs, root)?;
    cpu("scatter", scattered.iter().chain(outputs))?;
    let out = &outputs[0];
    let (dtype, total) = (out.dtype(), out.nbytes() as u64);
    let body: CollBody =
        Box::new(move |comm, ins, mut outs| algo::exchange::scatter(comm, &ins, outs[0], root));
    pg.submit(Launch {
        op: OpType::Scatter,
        dtype,
        total,
        timeout: opts.timeout,
        inputs: scattered,
        outputs,
        result: outputs.to_vec(),
        body,
        blocking: !opts.async_op,
    })
}

fn reduce_scatter(
    pg: &ProcessGroupGloo,
    outputs: &[Tensor],
    inputs: &[Vec<Tensor>],
    opts: &ReduceScatterOptions,
) -> Result<Work> {
    let n = pg.id.size;
    pg.checks()
        .reduce_scatter(outputs, inputs, opts.reduce_op)?;
    cpu("reduce_scatter", inputs[0].iter().chain(outputs))?;
    let (dtype, rop) = (outputs[0].dtype(), opts.reduce_op);
    let algo = pg.algo;
    let body: CollBody = Box::new(move |comm, ins, mut outs| {
        reduce_scatter_body(algo, comm, &ins, outs[0], rop, dtype, n)
    });
    pg.submit(Launch {
        op: OpType::ReduceScatter,
        dtype,
        total: nbytes(&inputs[0]),
        timeout: opts.timeout,
        inputs: &inputs[0],
        outputs,
        result: outputs.to_vec(),
        body,
        blocking: !opts.async_op,
    })
}

fn reduce_scatter_base(
    pg: &ProcessGroupGloo,
    output: &Tensor,
    input: &Tensor,
    opts: &ReduceScatterOptions,
) -> Result<Work> {
    let n = pg.id.size;
    pg.checks()
        .reduce_scatter_base(output, input, opts.reduce_op)?;
    cpu("_reduce_scatter_base", [output, input])?;
    let (dtype, rop) = (output.dtype(), opts.reduce_op);
    let algo = pg.algo;
    let body: CollBody = Box::new(move |comm, ins, mut outs| {
        let blocks = split_n_ref(ins[0], n);
        reduce_scatter_body(algo, comm, &blocks, outs[0], rop, dtype, n)
    });
    let (i, o) = (std::slice::from_ref(input), std::slice::from_ref(output));
    pg.submit(Launch {
        op: OpType::ReduceScatterBase,
        dtype,
        total: input.nbytes() as u64,
        timeout: opts.timeout,
        inputs: i,
        outputs: o,
        result: vec![output.clone()],
        body,
        blocking: !opts.async_op,
    })
}

fn reduce_scatter_tensor_coalesced(
    pg: &ProcessGroupGloo,
    outputs: &[Tensor],
    inputs: &[Tensor],
    opts: &ReduceScatterOptions,
) -> Result<Work> {
    let (n, rop) = (pg.id.size, opts.reduce_op);
    pg.checks()
        .reduce_scatter_tensor_coalesced(outputs, inputs, rop)?;
    cpu(
        "reduce_scatter_tensor_coalesced",
        inputs.iter().chain(outputs),
    )?;
    let dtype = inputs[0].dtype();
    let algo = pg.algo;
    let body: CollBody = Box::new(move |comm, ins, outs| {
        for (inp, out) in ins.iter().zip(outs) {
            let blocks = split_n_ref(inp, n);
            reduce_scatter_body(algo, comm, &blocks, out, rop, dtype, n)?;
        }
        Ok(())
    });
    pg.submit(Launch {
        op: OpType::ReduceScatterBase,
        dtype,
        total: nbytes(inputs),
        timeout: opts.timeout,
        inputs,
        outputs,
        result: outputs.to_vec(),
        body,
        blocking: !opts.async_op,
    })
}

fn alltoall_base(
    pg: &ProcessGroupGloo,
    output: &Tensor,
    input: &Tensor,
    output_split_sizes: &[usize],
    input_split_sizes: &[usize],
    opts: &AllToAllOptions,
) -> Result<Work> {
    let (outs, ins) =
        pg.checks()
            .alltoall_base(output, input, output_split_sizes, input_split_sizes)?;
    cpu("alltoall_base", [output, input])?;
    let elem = input.dtype().size();
    let out_b: Vec<usize> = outs.into_iter().map(|c| c * elem).collect();
    let in_b: Vec<usize> = ins.into_iter().map(|c| c * elem).collect();
    let body: CollBody = Box::new(move |comm, ins, mut outs| {
        let ib = split_sizes_ref(ins[0], &in_b);
        let mut ob = split_sizes(std::mem::take(&mut outs[0]), &out_b);
        algo::exchange::all_to_all(comm, &ib, &mut ob)
    });
    let (i, o) = (std::slice::from_ref(input), std::slice::from_ref(output));
    // Ranks may legally send different amounts (uneven splits), so the op's total is not
    // comparable across ranks: 0 here; every frame's size is still checked against its receive.
    pg.submit(Launch {
        op: OpType::AlltoallBase,
        dtype: input.dtype(),
        total: 0,
        timeout: opts.timeout,
        inputs: i,
        outputs: o,
        result: vec![output.clone()],
        body,
        blocking: !opts.async_op,
    })
}

fn alltoall(
    pg: &ProcessGroupGloo,
    outputs: &[Tensor],
    inputs: &[Tensor],
    opts: &AllToAllOptions,
) -> Result<Work> {
    pg.checks().alltoall(outputs, inputs)?;
    cpu("alltoall", inputs.iter().chain(outputs))?;
    let dtype = inputs[0].dtype();
    let body: CollBody =
        Box::new(move |comm, ins, mut outs| algo::exchange::all_to_all(comm, &ins, &mut outs));
    // As in all_to_all_single: per-rank totals may legally differ; frames are still checked.
    pg.submit(Launch {
        op: OpType::Alltoall,
        dtype,
        total: 0,
        timeout: opts.timeout,
        inputs,
        outputs,
        result: outputs.to_vec(),
        body,
        blocking: !opts.async_op,
    })
}

fn barrier(pg: &ProcessGroupGloo, opts: &BarrierOptions) -> Result<Work> {
    let body: CollBody = Box::new(move |comm, _ins, _outs| algo::barrier::dissemination(comm));
    pg.submit(Launch {
        op: OpType::Barrier,
        dtype: DType::U8,
        total: 0,
        timeout: opts.timeout,
        inputs: &[],
        outputs: &[],
        result: Vec::new(),
        body,
        blocking: !opts.async_op,
    })
}

fn send(pg: &ProcessGroupGloo, tensors: &[Tensor], dst: usize, tag: i64) -> Result<Work> {
    pg.submit_p2p(OpType::Send, tensors, Some(dst), tag)
}

fn recv(pg: &ProcessGroupGloo, tensors: &[Tensor], src: usize, tag: i64) -> Result<Work> {
    pg.submit_p2p(OpType::Recv, tensors, Some(src), tag)
}

fn recv_anysource(pg: &ProcessGroupGloo, tensors: &[Tensor], tag: i64) -> Result<Work> {
    pg.submit_p2p(OpType::RecvAnysource, tensors, None, tag)
}
