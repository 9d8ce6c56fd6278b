//! `StoreBackend`: a small CPU backend whose every collective goes through the group's store.
//!
//! Each rank publishes its contribution under a per-collective key and reads the others', so
//! it needs nothing but a [`Store`] and works for ranks-as-threads over a `HashStore` as well as
//! for processes over a `TcpStore`. It is slow (every byte passes through the store) and meant for
//! tests, for checking the world layer independently of a transport (it also implements
//! [`Backend::split`], so `split_group` takes the splitting path), and as a third-party
//! backend example for `c10d_world::register_backend`: it is *not* registered by default.
//!
//! Semantics follow [`Backend`]'s docs; ops run synchronously inside the call and return a
//! completed [`Work`] (the work carries the error when a peer does not arrive in time). Keys are
//! never deleted, so a store grows with the number of collectives. `recv_anysource` is not
//! supported.

use c10d_core::reduce::{finalize, prescale, reduce_into};
use c10d_core::{
    AllToAllOptions, AllgatherOptions, AllreduceOptions, Backend, BackendOptions, BarrierOptions,
    BroadcastOptions, Collectives, DeviceType, DistError, GatherOptions, Op, OpType, ReduceOp,
    ReduceOptions, ReduceScatterOptions, Result, ScatterOptions, Tensor, Work,
};
use c10d_store::{PrefixStore, Store};
use c10d_world::config::BackendCreateArgs;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A store-backed CPU backend (see the module docs).
pub struct StoreBackend {
    store: Arc<dyn Store>,
    rank: usize,
    size: usize,
    name: String,
    timeout: Mutex<Duration>,
    seq: AtomicU64,
    coll_seq: AtomicU64,
    p2p: Mutex<HashMap<(usize, usize, i64), u64>>,
    closed: AtomicBool,
}

impl StoreBackend {
    /// A backend for `rank` of `size` over `store` (keys are written directly into it; pass a
    /// prefixed store per group).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when `rank >= size`.
    pub fn new(
        store: Arc<dyn Store>,
        rank: usize,
        size: usize,
        timeout: Duration,
        name: &str,
    ) -> Result<Arc<StoreBackend>> {
        if rank >= size {
            return Err(DistError::invalid(format!(
                "StoreBackend: rank {rank} out of range for size {size}"
            )));
        }
        Ok(Arc::new(StoreBackend {
            store,
            rank,
            size,
            name: name.to_string(),
            timeout: Mutex::new(timeout),
            seq: AtomicU64::new(0),
            coll_seq: AtomicU64::new(0),
            p2p: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        }))
    }

    /// A creator for `c10d_world::register_backend`: `register_backend("store", StoreBackend::creator("store"), Some(&[c10d_core::DeviceType::Cpu]), false)`.
    pub fn creator(name: &'static str) -> c10d_world::config::BackendCreator {
        Arc::new(move |a: &BackendCreateArgs| {
            let b: Arc<dyn Backend> =
                StoreBackend::new(a.store.clone(), a.group_rank, a.group_size, a.timeout, name)?;
            Ok(Some(b))
        })
    }

    fn to(&self, t: Option<Duration>) -> Duration {
        t.unwrap_or_else(|| *self.timeout.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The shared argument checks of c10d-core, prefixed "StoreBackend::{op}: ".
    fn checks(&self) -> c10d_core::checks::Checks<'static> {
        c10d_core::checks::Checks {
            backend: "StoreBackend",
            rank: self.rank,
            size: self.size,
        }
    }

    fn begin(&self, op: OpType) -> Result<(u64, u64)> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(DistError::backend(format!(
                "StoreBackend {}: {} on a shut down or aborted group",
                self.name,
                op.name()
            )));
        }
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let cs = self.coll_seq.fetch_add(1, Ordering::SeqCst);
        Ok((seq, cs))
    }

    fn get(
        &self,
        key: &str,
        timeout: Duration,
        op: OpType,
        seq: u64,
        peer: usize,
    ) -> Result<Vec<u8>> {
        self.store.wait_timeout(&[key], timeout).map_err(|e| {
            DistError::backend(format!(
                "StoreBackend {} {} (seq {seq}) on rank {}: Timed out waiting {}ms for rank {peer}: {e}",
                self.name,
                op.name(),
                self.rank,
                timeout.as_millis()
            ))
        })?;
        self.store.get(key)
    }

    /// All ranks' blobs for collective `cs`.
    fn exchange(
        &self,
        cs: u64,
        mine: &[u8],
        timeout: Duration,
        op: OpType,
        seq: u64,
    ) -> Result<Vec<Vec<u8>>> {
        let mut hdr = vec![op_tag(op)];
        hdr.extend_from_slice(mine);
        self.store.set(&format!("c{cs}/{}", self.rank), &hdr)?;
        let mut out = Vec::with_capacity(self.size);
        for r in 0..self.size {
            if r == self.rank {
                out.push(mine.to_vec());
                continue;
            }
            let mut v = self.get(&format!("c{cs}/{r}"), timeout, op, seq, r)?;
            if v.first() != Some(&op_tag(op)) {
                return Err(DistError::backend(format!(
                    "StoreBackend {}: rank {} runs {} (seq {seq}) but rank {r} runs another collective",
                    self.name,
                    self.rank,
                    op.name()
                )));
            }
            v.remove(0);
            out.push(v);
        }
        Ok(out)
    }

    fn done(op: OpType, seq: u64, r: Result<()>, outputs: Vec<Tensor>) -> Result<Work> {
        Ok(Work::completed(op, seq, r, outputs))
    }

    fn bytes_of(ts: &[Tensor]) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        for t in ts {
            t.read_bytes(|b| v.extend_from_slice(b))?;
        }
        Ok(v)
    }

    fn reduce_blobs(
        &self,
        op: ReduceOp,
        dtype: c10d_core::DType,
        blobs: &[&[u8]],
    ) -> Result<Vec<u8>> {
        op.check_dtype(dtype)?;
        let Some(first) = blobs.first() else {
            return Ok(Vec::new()); // empty tensors: nothing to reduce
        };
        let mut acc = first.to_vec();
        prescale(op, dtype, &mut acc)?;
        for b in &blobs[1..] {
            if b.len() != acc.len() {
                return Err(DistError::backend(format!(
                    "StoreBackend {}: ranks contributed different sizes ({} vs {} bytes)",
                    self.name,
                    acc.len(),
                    b.len()
                )));
            }
            // Only PREMUL_SUM scales a contribution; other ops combine the peer's bytes as they are.
            if matches!(op, ReduceOp::PremulSum(_)) {
                let mut c = b.to_vec();
                prescale(op, dtype, &mut c)?;
                reduce_into(op.combine_op(), dtype, &mut acc, &c)?;
            } else {
                reduce_into(op.combine_op(), dtype, &mut acc, b)?;
            }
        }
        finalize(op, dtype, &mut acc, self.size)?;
        Ok(acc)
    }

    fn write_concat(ts: &[Tensor], data: &[u8]) -> Result<()> {
        let mut off = 0;
        for t in ts {
            let n = t.nbytes();
            let chunk = data
                .get(off..off + n)
                .ok_or_else(|| DistError::backend("StoreBackend: peer contribution too short"))?;
            t.write_bytes(|d| d.copy_from_slice(chunk))?;
            off += n;
        }
        Ok(())
    }
}

fn op_tag(op: OpType) -> u8 {
    op as u8
}

fn run<F: FnOnce() -> Result<()>>(
    op: OpType,
    seq: u64,
    outputs: Vec<Tensor>,
    f: F,
) -> Result<Work> {
    StoreBackend::done(op, seq, f(), outputs)
}

impl Backend for StoreBackend {
    fn name(&self) -> &str {
        &self.name
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }
    fn timeout(&self) -> Duration {
        self.to(None)
    }
    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = timeout;
    }
    fn sequence_number(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    fn monitored_barrier(&self, opts: &BarrierOptions, wait_all_ranks: bool) -> Result<()> {
        let (seq, cs) = self.begin(OpType::MonitoredBarrier)?;
        let to = self.to(opts.timeout);
        let key = |r: usize| format!("mb{cs}/{r}");
        if self.rank == 0 {
            let start = Instant::now();
            let mut failed = Vec::new();
            for r in 1..self.size {
                let left = to
                    .saturating_sub(start.elapsed())
                    .max(Duration::from_millis(1));
                if self.store.wait_timeout(&[key(r).as_str()], left).is_err() {
                    if !wait_all_ranks {
                        return Err(DistError::backend(format!(
                            "Rank {r} failed to pass monitoredBarrier in {} ms",
                            to.as_millis()
                        )));
                    }
                    failed.push(r);
                }
            }
            if !failed.is_empty() {
                let list: Vec<String> = failed.iter().map(|r| r.to_string()).collect();
                return Err(DistError::backend(format!(
                    "Ranks {} failed to pass monitoredBarrier in {} ms",
                    list.join(", "),
                    to.as_millis()
                )));
            }
            self.store.set(&format!("mb{cs}/ack"), b"1")?;
            let _ = seq;
            Ok(())
        } else {
            self.store.set(&key(self.rank), b"1")?;
            self.store.wait_timeout(&[format!("mb{cs}/ack").as_str()], to).map_err(|e| {
                DistError::backend(format!(
                    "Rank {} successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank. Original exception: {e}",
                    self.rank
                ))
            })
        }
    }

    fn supports_splitting(&self) -> bool {
        true
    }

    /// Members get a new `StoreBackend` over `PrefixStore("split:<group name>", store)` with
    /// their position in `ranks` as rank; non-members get `None`. No communication is needed.
    fn split(&self, ranks: &[usize], opts: &BackendOptions) -> Result<Option<Arc<dyn Backend>>> {
        if ranks.iter().any(|&r| r >= self.size) {
            return Err(DistError::invalid(format!(
                "StoreBackend::split: ranks {ranks:?} out of range for size {}",
                self.size
            )));
        }
        let Some(me) = ranks.iter().position(|&r| r == self.rank) else {
            return Ok(None);
        };
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(
            &format!("split:{}", opts.group_name),
            self.store.clone(),
        ));
        let child: Arc<dyn Backend> =
            StoreBackend::new(store, me, ranks.len(), opts.timeout, &self.name)?;
        Ok(Some(child))
    }

    fn abort(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
    fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

impl Collectives for StoreBackend {
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
            Op::AllToAll {
                outputs,
                inputs,
                opts,
            } => alltoall(self, &outputs, &inputs, &opts),
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
            Op::Barrier { opts } => barrier(self, &opts),
            Op::Send { tensors, dst, tag } => send(self, &tensors, dst, tag),
            Op::Recv { tensors, src, tag } => recv(self, &tensors, src, tag),
            op => Err(op.unsupported_by(&self.name)),
        }
    }
}

fn broadcast(pg: &StoreBackend, tensors: &[Tensor], opts: &BroadcastOptions) -> Result<Work> {
    pg.checks().broadcast(tensors, opts)?;
    let (seq, cs) = pg.begin(OpType::Broadcast)?;
    let to = pg.to(opts.timeout);
    run(OpType::Broadcast, seq, tensors.to_vec(), || {
        let mine = if pg.rank == opts.root_rank {
            StoreBackend::bytes_of(&tensors[opts.root_tensor..=opts.root_tensor])?
        } else {
            Vec::new()
        };
        let all = pg.exchange(cs, &mine, to, OpType::Broadcast, seq)?;
        for t in tensors {
            if pg.rank != opts.root_rank || !t.shares_storage_with(&tensors[opts.root_tensor]) {
                StoreBackend::write_concat(std::slice::from_ref(t), &all[opts.root_rank])?;
            }
        }
        Ok(())
    })
}

fn allreduce(pg: &StoreBackend, tensors: &[Tensor], opts: &AllreduceOptions) -> Result<Work> {
    pg.checks().allreduce(tensors, opts.reduce_op)?;
    let (seq, cs) = pg.begin(OpType::Allreduce)?;
    let to = pg.to(opts.timeout);
    run(OpType::Allreduce, seq, tensors.to_vec(), || {
        let n = tensors[0].nbytes();
        let mine = StoreBackend::bytes_of(tensors)?;
        let all = pg.exchange(cs, &mine, to, OpType::Allreduce, seq)?;
        let parts: Vec<&[u8]> = all
            .iter()
            .flat_map(|b| b.chunks(n.max(1)).take(tensors.len()))
            .collect();
        let res = pg.reduce_blobs(opts.reduce_op, tensors[0].dtype(), &parts)?;
        for t in tensors {
            t.write_bytes(|d| d.copy_from_slice(&res))?;
        }
        Ok(())
    })
}

fn allreduce_coalesced(
    pg: &StoreBackend,
    tensors: &[Tensor],
    opts: &AllreduceOptions,
) -> Result<Work> {
    pg.checks().allreduce_coalesced(tensors, opts.reduce_op)?;
    let (seq, cs) = pg.begin(OpType::AllreduceCoalesced)?;
    let to = pg.to(opts.timeout);
    run(OpType::AllreduceCoalesced, seq, tensors.to_vec(), || {
        let mine = StoreBackend::bytes_of(tensors)?;
        let all = pg.exchange(cs, &mine, to, OpType::AllreduceCoalesced, seq)?;
        let parts: Vec<&[u8]> = all.iter().map(|b| b.as_slice()).collect();
        let res = pg.reduce_blobs(opts.reduce_op, tensors[0].dtype(), &parts)?;
        StoreBackend::write_concat(tensors, &res)
    })
}

fn reduce(pg: &StoreBackend, tensors: &[Tensor], opts: &ReduceOptions) -> Result<Work> {
    pg.checks().reduce(tensors, opts)?;
    let (seq, cs) = pg.begin(OpType::Reduce)?;
    let to = pg.to(opts.timeout);
    run(OpType::Reduce, seq, tensors.to_vec(), || {
        let mine = StoreBackend::bytes_of(tensors)?;
        let all = pg.exchange(cs, &mine, to, OpType::Reduce, seq)?;
        if pg.rank == opts.root_rank {
            let parts: Vec<&[u8]> = all.iter().map(|b| b.as_slice()).collect();
            let res = pg.reduce_blobs(opts.reduce_op, tensors[0].dtype(), &parts)?;
            StoreBackend::write_concat(tensors, &res)?;
        }
        Ok(())
    })
}

fn allgather(
    pg: &StoreBackend,
    outputs: &[Vec<Tensor>],
    inputs: &[Tensor],
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks().allgather(outputs, inputs)?;
    let (seq, cs) = pg.begin(OpType::Allgather)?;
    let to = pg.to(opts.timeout);
    run(
        OpType::Allgather,
        seq,
        outputs.iter().flatten().cloned().collect(),
        || {
            let mine = StoreBackend::bytes_of(inputs)?;
            let all = pg.exchange(cs, &mine, to, OpType::Allgather, seq)?;
            for (r, blob) in all.iter().enumerate() {
                let col: Vec<Tensor> = outputs.iter().map(|o| o[r].clone()).collect();
                StoreBackend::write_concat(&col, blob)?;
            }
            Ok(())
        },
    )
}

fn allgather_base(
    pg: &StoreBackend,
    output: &Tensor,
    input: &Tensor,
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks().allgather_base(output, input)?;
    let (seq, cs) = pg.begin(OpType::AllgatherBase)?;
    let to = pg.to(opts.timeout);
    run(OpType::AllgatherBase, seq, vec![output.clone()], || {
        let all = pg.exchange(
            cs,
            &StoreBackend::bytes_of(std::slice::from_ref(input))?,
            to,
            OpType::AllgatherBase,
            seq,
        )?;
        StoreBackend::write_concat(std::slice::from_ref(output), &all.concat())
    })
}

fn allgather_coalesced(
    pg: &StoreBackend,
    outputs: &[Vec<Tensor>],
    inputs: &[Tensor],
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks().allgather_coalesced(outputs, inputs)?;
    let (seq, cs) = pg.begin(OpType::AllgatherCoalesced)?;
    let to = pg.to(opts.timeout);
    run(
        OpType::AllgatherCoalesced,
        seq,
        outputs.iter().flatten().cloned().collect(),
        || {
            let all = pg.exchange(
                cs,
                &StoreBackend::bytes_of(inputs)?,
                to,
                OpType::AllgatherCoalesced,
                seq,
            )?;
            for (r, blob) in all.iter().enumerate() {
                StoreBackend::write_concat(&outputs[r], blob)?;
            }
            Ok(())
        },
    )
}

fn allgather_into_tensor_coalesced(
    pg: &StoreBackend,
    outputs: &[Tensor],
    inputs: &[Tensor],
    opts: &AllgatherOptions,
) -> Result<Work> {
    pg.checks()
        .allgather_into_tensor_coalesced(outputs, inputs)?;
    let (seq, cs) = pg.begin(OpType::Coalesced)?;
    let to = pg.to(opts.timeout);
    run(OpType::Coalesced, seq, outputs.to_vec(), || {
        let all = pg.exchange(
            cs,
            &StoreBackend::bytes_of(inputs)?,
            to,
            OpType::Coalesced,
            seq,
        )?;
        for (i, (out, inp)) in outputs.iter().zip(inputs).enumerate() {
            let off: usize = inputs[..i].iter().map(|t| t.nbytes()).sum();
            let mut data = Vec::new();
            for blob in &all {
                data.extend_from_slice(&blob[off..off + inp.nbytes()]);
            }
            StoreBackend::write_concat(std::slice::from_ref(out), &data)?;
        }
        Ok(())
    })
}

fn gather(
    pg: &StoreBackend,
    outputs: &[Vec<Tensor>],
    inputs: &[Tensor],
    opts: &GatherOptions,
) -> Result<Work> {
    pg.checks().gather(outputs, inputs, opts.root_rank)?;
    let (seq, cs) = pg.begin(OpType::Gather)?;
    let to = pg.to(opts.timeout);
    run(
        OpType::Gather,
        seq,
        outputs.iter().flatten().cloned().collect(),
        || {
            let all = pg.exchange(
                cs,
                &StoreBackend::bytes_of(inputs)?,
                to,
                OpType::Gather,
                seq,
            )?;
            if pg.rank == opts.root_rank {
                for (r, blob) in all.iter().enumerate() {
                    StoreBackend::write_concat(std::slice::from_ref(&outputs[0][r]), blob)?;
                }
            }
            Ok(())
        },
    )
}

fn scatter(
    pg: &StoreBackend,
    outputs: &[Tensor],
    inputs: &[Vec<Tensor>],
    opts: &ScatterOptions,
) -> Result<Work> {
    pg.checks().scatter(outputs, inputs, opts.root_rank)?;
    let (seq, cs) = pg.begin(OpType::Scatter)?;
    let to = pg.to(opts.timeout);
    run(OpType::Scatter, seq, outputs.to_vec(), || {
        let mine = if pg.rank == opts.root_rank {
            StoreBackend::bytes_of(&inputs[0])?
        } else {
            Vec::new()
        };
        let all = pg.exchange(cs, &mine, to, OpType::Scatter, seq)?;
        let n = outputs[0].nbytes();
        let root = &all[opts.root_rank];
        let chunk = root
            .get(pg.rank * n..(pg.rank + 1) * n)
            .ok_or_else(|| DistError::backend("StoreBackend::scatter: invalid tensor size"))?;
        StoreBackend::write_concat(outputs, chunk)
    })
}

fn reduce_scatter(
    pg: &StoreBackend,
    outputs: &[Tensor],
    inputs: &[Vec<Tensor>],
    opts: &ReduceScatterOptions,
) -> Result<Work> {
    pg.checks()
        .reduce_scatter(outputs, inputs, opts.reduce_op)?;
    let (seq, cs) = pg.begin(OpType::ReduceScatter)?;
    let to = pg.to(opts.timeout);
    run(OpType::ReduceScatter, seq, outputs.to_vec(), || {
        let all = pg.exchange(
            cs,
            &StoreBackend::bytes_of(&inputs[0])?,
            to,
            OpType::ReduceScatter,
            seq,
        )?;
        let off: usize = inputs[0][..pg.rank].iter().map(|t| t.nbytes()).sum();
        let n = inputs[0][pg.rank].nbytes();
        let parts: Vec<&[u8]> = all.iter().map(|b| &b[off..off + n]).collect();
        let res = pg.reduce_blobs(opts.reduce_op, outputs[0].dtype(), &parts)?;
        StoreBackend::write_concat(outputs, &res)
    })
}

fn reduce_scatter_base(
    pg: &StoreBackend,
    output: &Tensor,
    input: &Tensor,
    opts: &ReduceScatterOptions,
) -> Result<Work> {
    pg.checks()
        .reduce_scatter_base(output, input, opts.reduce_op)?;
    let (seq, cs) = pg.begin(OpType::ReduceScatterBase)?;
    let to = pg.to(opts.timeout);
    run(OpType::ReduceScatterBase, seq, vec![output.clone()], || {
        let all = pg.exchange(
            cs,
            &StoreBackend::bytes_of(std::slice::from_ref(input))?,
            to,
            OpType::ReduceScatterBase,
            seq,
        )?;
        let n = output.nbytes();
        let parts: Vec<&[u8]> = all
            .iter()
            .map(|b| &b[pg.rank * n..(pg.rank + 1) * n])
            .collect();
        let res = pg.reduce_blobs(opts.reduce_op, output.dtype(), &parts)?;
        StoreBackend::write_concat(std::slice::from_ref(output), &res)
    })
}

fn reduce_scatter_tensor_coalesced(
    pg: &StoreBackend,
    outputs: &[Tensor],
    inputs: &[Tensor],
    opts: &ReduceScatterOptions,
) -> Result<Work> {
    pg.checks()
        .reduce_scatter_tensor_coalesced(outputs, inputs, opts.reduce_op)?;
    let (seq, cs) = pg.begin(OpType::Coalesced)?;
    let to = pg.to(opts.timeout);
    run(OpType::Coalesced, seq, outputs.to_vec(), || {
        let all = pg.exchange(
            cs,
            &StoreBackend::bytes_of(inputs)?,
            to,
            OpType::Coalesced,
            seq,
        )?;
        let mut off = 0;
        for (out, inp) in outputs.iter().zip(inputs) {
            let n = out.nbytes();
            let parts: Vec<&[u8]> = all
                .iter()
                .map(|b| &b[off + pg.rank * n..off + (pg.rank + 1) * n])
                .collect();
            let res = pg.reduce_blobs(opts.reduce_op, out.dtype(), &parts)?;
            StoreBackend::write_concat(std::slice::from_ref(out), &res)?;
            off += inp.nbytes();
        }
        Ok(())
    })
}

fn alltoall(
    pg: &StoreBackend,
    outputs: &[Tensor],
    inputs: &[Tensor],
    opts: &AllToAllOptions,
) -> Result<Work> {
    pg.checks().alltoall(outputs, inputs)?;
    let (seq, cs) = pg.begin(OpType::Alltoall)?;
    let to = pg.to(opts.timeout);
    run(OpType::Alltoall, seq, outputs.to_vec(), || {
        let all = pg.exchange(
            cs,
            &StoreBackend::bytes_of(inputs)?,
            to,
            OpType::Alltoall,
            seq,
        )?;
        for (r, blob) in all.iter().enumerate() {
            let n = outputs[r].nbytes();
            let off = pg.rank * n;
            let chunk = blob
                .get(off..off + n)
                .ok_or_else(|| DistError::backend("StoreBackend::alltoall: invalid tensor size"))?;
            StoreBackend::write_concat(std::slice::from_ref(&outputs[r]), chunk)?;
        }
        Ok(())
    })
}

fn alltoall_base(
    pg: &StoreBackend,
    output: &Tensor,
    input: &Tensor,
    out_splits: &[usize],
    in_splits: &[usize],
    opts: &AllToAllOptions,
) -> Result<Work> {
    let (outs, ins) = pg
        .checks()
        .alltoall_base(output, input, out_splits, in_splits)?;
    let elem = input.dtype().size();
    let (seq, cs) = pg.begin(OpType::AlltoallBase)?;
    let to = pg.to(opts.timeout);
    run(OpType::AlltoallBase, seq, vec![output.clone()], || {
        let mut mine = Vec::new();
        for s in &ins {
            mine.extend_from_slice(&(s * elem).to_le_bytes());
        }
        mine.extend(StoreBackend::bytes_of(std::slice::from_ref(input))?);
        let all = pg.exchange(cs, &mine, to, OpType::AlltoallBase, seq)?;
        let mut data = Vec::new();
        for (r, blob) in all.iter().enumerate() {
            let (hdr, body) = blob.split_at(8 * pg.size);
            let sizes: Vec<usize> = hdr
                .chunks(8)
                .map(|c| usize::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            let off: usize = sizes[..pg.rank].iter().sum();
            let n = sizes[pg.rank];
            if n != outs[r] * elem {
                return Err(DistError::backend(format!(
                    "StoreBackend::alltoall_base: rank {r} sends {n} bytes, expected {}",
                    outs[r] * elem
                )));
            }
            data.extend_from_slice(&body[off..off + n]);
        }
        StoreBackend::write_concat(std::slice::from_ref(output), &data)
    })
}

fn barrier(pg: &StoreBackend, opts: &BarrierOptions) -> Result<Work> {
    let (seq, cs) = pg.begin(OpType::Barrier)?;
    let to = pg.to(opts.timeout);
    run(OpType::Barrier, seq, Vec::new(), || {
        pg.exchange(cs, &[], to, OpType::Barrier, seq).map(|_| ())
    })
}

fn send(pg: &StoreBackend, tensors: &[Tensor], dst: usize, tag: i64) -> Result<Work> {
    pg.checks().send(tensors, dst, true)?;
    if pg.closed.load(Ordering::SeqCst) {
        return Err(DistError::backend(
            "StoreBackend: send on a shut down group",
        ));
    }
    let seq = pg.seq.fetch_add(1, Ordering::SeqCst);
    let n = {
        let mut m = pg.p2p.lock().unwrap_or_else(|e| e.into_inner());
        let c = m.entry((pg.rank, dst, tag)).or_insert(0);
        *c += 1;
        *c - 1
    };
    run(OpType::Send, seq, tensors.to_vec(), || {
        pg.store.set(
            &format!("p2p/{}/{dst}/{tag}/{n}", pg.rank),
            &StoreBackend::bytes_of(tensors)?,
        )
    })
}

fn recv(pg: &StoreBackend, tensors: &[Tensor], src: usize, tag: i64) -> Result<Work> {
    pg.checks().recv(tensors, Some(src), true)?;
    if pg.closed.load(Ordering::SeqCst) {
        return Err(DistError::backend(
            "StoreBackend: recv on a shut down group",
        ));
    }
    let seq = pg.seq.fetch_add(1, Ordering::SeqCst);
    let n = {
        let mut m = pg.p2p.lock().unwrap_or_else(|e| e.into_inner());
        let c = m.entry((src, pg.rank, tag)).or_insert(0);
        *c += 1;
        *c - 1
    };
    let to = pg.to(None);
    let (w, c) = Work::new(OpType::Recv, seq);
    let store = pg.store.clone();
    let key = format!("p2p/{src}/{}/{tag}/{n}", pg.rank);
    let (me, name) = (pg.rank, pg.name.clone());
    let tensors = tensors.to_vec();
    // Receives complete on a helper thread so that isend/irecv pairs in any order cannot
    // deadlock; the wait is bounded by the timeout.
    std::thread::Builder::new()
        .name(format!("store-backend-recv-{me}"))
        .spawn(move || {
            let r = store
                .wait_timeout(&[key.as_str()], to)
                .map_err(|e| {
                    DistError::backend(format!(
                        "StoreBackend {name} RECV (seq {seq}) on rank {me}: Timed out waiting {}ms for rank {src}: {e}",
                        to.as_millis()
                    ))
                })
                .and_then(|_| store.get(&key))
                .and_then(|data| StoreBackend::write_concat(&tensors, &data));
            c.set_outputs(tensors);
            c.set_source_rank(src);
            c.complete(r);
        })
        .map_err(|e| DistError::backend(format!("StoreBackend: cannot spawn a receive thread: {e}")))?;
    Ok(w)
}
