//! # c10d-gloo
//!
//! The CPU collective backend of c10d-rs (PyTorch's `ProcessGroupGloo`): every collective of
//! `torch.distributed` on CPU tensors, between processes and hosts, over TCP on `mio` +
//! `socket2`.
//!
//! * [`ProcessGroupGloo::new`] makes a full mesh of TCP connections through the group's store
//!   (see the `transport` module) or, with [`GlooOptions::lazy_init`], at the first op.
//! * Ops of a group run in issue order on one engine per group: a blocking call runs on the
//!   caller's thread when the engine is free, everything else on the group's worker thread;
//!   see the `engine` module for why the event loop is per group rather than per process.
//! * Peers on the same host talk over abstract Unix sockets, others over TCP (see `transport`;
//!   [`GlooOptions::local_unix_sockets`] turns this off).
//! * When every rank of a group is on one host, all-reduces, all-gathers and reduce-scatters
//!   below the cross-memory-attach threshold (2 MiB) and broadcasts up to 2 MiB (in groups of up
//!   to 8 ranks; up to 64 KiB per rank in larger ones) go through a shared-memory segment the
//!   group sets up when it connects (see `algo::shm`): no socket and no system call on the fast
//!   path, a futex when a rank must wait, the fold order of the socket algorithm each replaces
//!   (same bits), every fault check of the socket path. `C10D_GLOO_SHM=0` /
//!   [`GlooOptions::shared_memory`] turns it off.
//! * When every rank of a group is on one host, all-reduces, all-gathers and reduce-scatters of
//!   at least [`GlooOptions::cma_min_bytes`] (2 MiB) copy straight out of the peers' buffers with
//!   Linux cross-memory attach (`process_vm_readv`, see `algo::cma`): one copy per byte instead
//!   of two through socket buffers, the sockets carrying only three rounds of control frames.
//!   Whether it is permitted is probed once per group and agreed by every rank; otherwise (or
//!   with `C10D_GLOO_CMA=0` on any rank) the socket algorithms run. Reads only: a peer can
//!   never write our memory; it can read it, as any process of the same user already may.
//! * Algorithms live in `algo::*`, one small module each: direct-exchange, all-pairs
//!   (reduce-scatter + all-gather) and pipelined-ring all-reduce, binomial-tree and
//!   pipelined-chain broadcast, direct all-gather / gather / scatter / all-to-all /
//!   reduce-scatter, direct and segmented reduce, dissemination barrier, monitored barrier.
//! * Every frame carries a header (see `wire`); a rank that runs a different collective, dtype
//!   or size than its peer fails with an error naming both ranks and both ops.
//!
//! Performance (2-core machine, loopback, best of N alternating runs vs PyTorch 2.15 Gloo in the
//! same run; `bash crates/c10d-world/benches/compare.sh`, which drives `c10d-bench`): 2 ranks
//! 1 KiB all-reduce ≈ 9–14 µs (PyTorch ≈ 1 ms), 4 ranks ≈ 40 µs (PyTorch ≈ 5.5 ms); 16 MiB
//! busbw ≈ 3.3–3.9× PyTorch's with 2 ranks, ≈ 2.1–2.35× with 4 (cross-memory attach; over Unix
//! sockets alone ≈ 2× and ≈ 1.4×); 4-rank broadcast 512 KiB–64 MiB 1.5–5.6×, all_to_all
//! ≥ 512 KiB 1.3–10×. With `C10D_GLOO_TCP_ONLY=1` (loopback TCP like PyTorch): 1 KiB ≈ 10–18 µs
//! / ≈ 100 µs, 16 MiB busbw ≈ 1.7× (2 ranks) and ≈ 1.2× (4 ranks), the rest being the kernel's
//! TCP cost.
//!
//! # Which file owns what
//!
//! (The workspace-wide picture, and how an op reaches this crate from `c10d_world`, is in
//! `docs/architecture.md` at the repository root.)
//!
//! | file | owns |
//! |------|------|
//! | `lib.rs` | [`ProcessGroupGloo`]: the `Backend` methods (argument checks with PyTorch's texts, choice of algorithm, the op's body), `submit` (tensor leases, sequence numbers, flight-recorder entry, queue) |
//! | `options.rs` | [`GlooOptions`] and the listen-address choice |
//! | `transport.rs` | connection set-up: listen, publish in the store, connect/accept the mesh, hello handshake |
//! | `engine/mod.rs` | the per-group engine, one concept per file (its table is in `engine/mod.rs`): |
//! | `engine/submit.rs` | queue, worker thread, drive loops, running a collective |
//! | `engine/setup.rs` | connecting the mesh (also under lazy init), the shared-memory verdict |
//! | `engine/poll.rs`, `engine/conn.rs` | the `mio` poll loop; connection I/O (write queue, receive state machine) |
//! | `engine/matching.rs`, `engine/p2p.rs` | frame matching for collectives; point-to-point ops |
//! | `engine/faults.rs` | lost or departed peers, failing the group, detaching buffers, error texts |
//! | `engine/comm.rs` | `Comm`, the algorithms' view of the engine (posts, waits, time-outs) |
//! | `engine/flow.rs`, `engine/liveness.rs` | read budget and back-pressure; ping/pong probes that name a silent rank |
//! | `wire.rs` | the 64-byte frame header |
//! | `algo/*.rs` | the algorithms, written against `Comm` (post sends/receives, wait, reduce); `algo/shm.rs` the shared-memory segment and its all-reduce |
//! | `bin/c10d-gloo-worker.rs` | rank process for benchmarks and process tests |
//!
//! # How a collective flows
//!
//! 1. `ProcessGroupGloo::all_reduce` (`lib.rs`) checks the arguments and builds the op's body,
//!    a closure that calls an `algo` function (e.g. `algo::allreduce::ring`) on a `Comm`.
//! 2. `submit` leases the tensors, numbers the op, records it in the flight recorder and
//!    queues it; a blocking call that finds the engine free drives it on the caller's thread,
//!    otherwise the group's worker thread does (`engine/mod.rs`, "who drives it").
//! 3. The engine runs queued collectives in issue order (`Engine::run_coll` in
//!    `engine/submit.rs`): connects first under lazy init, gives the body a `Comm` with the
//!    op's deadline, and completes the op's `Work` with the body's result.
//! 4. Inside the body the algorithm posts non-blocking sends and receives (each frame = header
//!    from `wire.rs` + payload, tagged by collective index and step) and waits on them; the
//!    waiting thread polls the sockets (`engine/poll.rs`), writes queued frames (`flush`,
//!    `engine/conn.rs`) and reads arriving frames straight into the posted buffers
//!    (`on_readable`, matched in `engine/matching.rs`).
//!
//! Differences from PyTorch's Gloo, on purpose: `ReduceOp::Avg` and `ReduceOp::PremulSum` are
//! supported (PyTorch's Gloo refuses them); AVG divides by the group size (also when a rank
//! passes several tensors). Argument errors use PyTorch's texts, prefixed
//! `"ProcessGroupGloo::<op>: "`.

mod algo;
mod engine;
mod options;
mod transport;
mod wire;

pub use options::{AllreduceAlgorithm, BroadcastAlgorithm, GlooOptions};

use c10d_core::checks::At;
use c10d_core::flight_recorder::{GroupRecorder, OpRecord, Trace};
use c10d_core::reduce::{finalize, prescale, reduce_into};
use c10d_core::*;
use c10d_store::Store;
use engine::{
    lock, worker_loop, CollBody, CollOp, Comm, Connector, Engine, Ident, OpInfo, P2pOp, Queue,
    Shared, Submission, WAKER,
};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Algorithm settings copied into each op.
#[derive(Clone, Copy)]
struct Algo {
    allreduce: AllreduceAlgorithm,
    broadcast: BroadcastAlgorithm,
    small_allreduce: usize,
    small_broadcast: usize,
    small_reduce_scratch: usize,
    chunk: usize,
    cma_min: usize,
    cma_allowed: bool,
}

impl Algo {
    fn from_options(opts: &GlooOptions) -> Algo {
        Algo {
            allreduce: opts.allreduce_algorithm,
            broadcast: opts.broadcast_algorithm,
            small_allreduce: opts.small_allreduce_bytes,
            small_broadcast: opts.small_broadcast_bytes,
            small_reduce_scratch: opts.small_reduce_scratch_bytes,
            cma_min: opts.cma_min_bytes,
            cma_allowed: opts.cross_memory_attach,
            chunk: opts.pipeline_chunk_bytes.max(64),
        }
    }

    fn all_reduce(
        &self,
        comm: &mut Comm<'_>,
        buf: &mut [u8],
        op: ReduceOp,
        dtype: DType,
    ) -> Result<()> {
        // Shared memory where the direct exchange or all-pairs would run over sockets, with
        // their fold orders (same bits).
        if let Some(fold) = self.shm_fold(comm.size(), buf.len()) {
            if algo::shm::all_reduce(comm, buf, op, dtype, fold)? {
                return Ok(());
            }
        }
        if self.allreduce == AllreduceAlgorithm::Auto
            && buf.len() >= self.cma_min
            && algo::cma::all_reduce(comm, buf, op, dtype, self.cma_allowed)?
        {
            return Ok(());
        }
        match self.allreduce {
            AllreduceAlgorithm::Direct => algo::allreduce::direct(comm, buf, op, dtype),
            AllreduceAlgorithm::Ring => algo::allreduce::ring(comm, buf, op, dtype, self.chunk),
            AllreduceAlgorithm::AllPairs => {
                algo::allreduce::all_pairs(comm, buf, op, dtype, self.chunk)
            }
            AllreduceAlgorithm::Auto if buf.len() <= self.small_allreduce => {
                algo::allreduce::direct(comm, buf, op, dtype)
            }
            AllreduceAlgorithm::Auto if comm.size() <= 8 => {
                algo::allreduce::all_pairs(comm, buf, op, dtype, self.chunk)
            }
            AllreduceAlgorithm::Auto => algo::allreduce::ring(comm, buf, op, dtype, self.chunk),
        }
    }

    /// The socket algorithm a shared-memory all-reduce of `len` bytes stands in for, if any:
    /// the direct exchange up to `small_allreduce`, all-pairs below cross-memory attach's
    /// threshold (groups of at most 8, as `Auto` picks it).
    fn shm_fold(&self, n: usize, len: usize) -> Option<algo::shm::Fold> {
        if self.allreduce != AllreduceAlgorithm::Auto {
            return None;
        }
        if len <= self.small_allreduce {
            Some(algo::shm::Fold::Direct)
        } else if len < self.cma_min && n <= 8 {
            Some(algo::shm::Fold::AllPairs)
        } else {
            None
        }
    }

    /// All-gather (`outputs[i * n + p]` = rank p's `inputs[i]`): cross-memory attach when it
    /// applies and the outputs total at least `cma_min` bytes, else the direct exchange.
    fn all_gather(
        &self,
        comm: &mut Comm<'_>,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<()> {
        let total: usize = outputs.iter().map(|o| o.len()).sum();
        // Below cross-memory attach's threshold: the group's shared memory, if it has some.
        if total < self.cma_min && algo::shm::all_gather(comm, inputs, outputs)? {
            return Ok(());
        }
        if total >= self.cma_min && algo::cma::all_gather(comm, inputs, outputs, self.cma_allowed)?
        {
            return Ok(());
        }
        algo::exchange::all_gather(comm, inputs, outputs)
    }

    /// Reduce-scatter (see `algo::reduce::reduce_scatter`): cross-memory attach when it
    /// applies and the blocks total at least `cma_min` bytes, else the direct exchange.
    fn reduce_scatter(
        &self,
        comm: &mut Comm<'_>,
        blocks: &[&[u8]],
        out: &mut [u8],
        op: ReduceOp,
        dtype: DType,
    ) -> Result<()> {
        let total: usize = blocks.iter().map(|b| b.len()).sum();
        // Below cross-memory attach's threshold: the group's shared memory, if it has some (the
        // direct exchange's fold order, same bits).
        if total < self.cma_min && algo::shm::reduce_scatter(comm, blocks, out, op, dtype)? {
            return Ok(());
        }
        if total >= self.cma_min
            && algo::cma::reduce_scatter(comm, blocks, out, op, dtype, self.cma_allowed)?
        {
            return Ok(());
        }
        algo::reduce::reduce_scatter(comm, blocks, out, op, dtype)
    }

    fn broadcast(&self, comm: &mut Comm<'_>, buf: &mut [u8], root: usize) -> Result<()> {
        if self.broadcast == BroadcastAlgorithm::Auto && algo::shm::broadcast(comm, buf, root)? {
            return Ok(());
        }
        let chain = match self.broadcast {
            BroadcastAlgorithm::Tree => false,
            BroadcastAlgorithm::Chain => true,
            BroadcastAlgorithm::Auto => buf.len() > self.small_broadcast,
        };
        if chain {
            algo::broadcast::chain(comm, buf, root, self.chunk)
        } else {
            algo::broadcast::tree(comm, buf, root)
        }
    }
}

/// The CPU backend (mirrors `torch.distributed.ProcessGroupGloo`). Implements
/// [`c10d_core::Backend`] with name `"gloo"` for [`DeviceType::Cpu`].
///
/// Ops are validated synchronously (argument errors are returned as `Err` with PyTorch's
/// texts) and then run asynchronously, in issue order, on the group's worker thread; the
/// returned [`Work`] completes when the op finished on this rank. Failures (timeouts, a lost
/// peer, a collective mismatch, abort) fail the `Work` with [`DistError::Backend`].
pub struct ProcessGroupGloo {
    shared: Arc<Shared>,
    engine: Arc<Mutex<Engine>>,
    id: Ident,
    group_desc: String,
    timeout: Mutex<Duration>,
    algo: Algo,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// This group's handle on the process's flight recorder.
    fr: Arc<GroupRecorder>,
}

impl std::fmt::Debug for ProcessGroupGloo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroupGloo(group={}, rank={}, size={})",
            self.id.group_name, self.id.rank, self.id.size
        )
    }
}

fn inval(op: &str, msg: impl std::fmt::Display) -> DistError {
    DistError::invalid(format!("ProcessGroupGloo::{op}: {msg}"))
}

/// The shared checks of c10d-core, prefixed "ProcessGroupGloo::{op}: ".
fn at(op: &str) -> At<'_> {
    At {
        backend: "ProcessGroupGloo",
        op,
    }
}

/// Input/output pairs of a `*_tensor_coalesced` op: non-empty lists of one length, all on CPU.
fn check_coalesced_pairs(op: &str, outputs: &[Tensor], inputs: &[Tensor]) -> Result<()> {
    at(op).pairs(outputs, inputs)?;
    let refs: Vec<&Tensor> = inputs.iter().chain(outputs).collect();
    check_cpu(op, &refs)
}

/// The root's tensor list of gather (`kind` "output") or scatter (`kind` "input").
fn check_root_list(op: &str, lists: &[Vec<Tensor>], n: usize, kind: &str) -> Result<()> {
    at(op).root_list(lists, n, kind)
}

fn check_cpu(op: &str, ts: &[&Tensor]) -> Result<()> {
    if ts.iter().any(|t| !t.is_cpu()) {
        return Err(inval(op, "unsupported device type"));
    }
    Ok(())
}

/// "invalid tensor type" / "invalid tensor size" against `proto`.
fn check_same(op: &str, ts: &[&Tensor], proto: &Tensor) -> Result<()> {
    at(op).same(ts, proto)
}

fn check_op(op: &str, rop: ReduceOp, dtype: DType) -> Result<()> {
    rop.check_dtype(dtype)
        .map_err(|e| e.with_prefix(&format!("ProcessGroupGloo::{op}: ")))
}

/// Splits `buf` into `n` equal parts (works for empty buffers too).
fn split_n(mut buf: &mut [u8], n: usize) -> Vec<&mut [u8]> {
    let each = buf.len() / n.max(1);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let (a, b) = std::mem::take(&mut buf).split_at_mut(each);
        v.push(a);
        buf = b;
    }
    v
}

fn split_n_ref(mut buf: &[u8], n: usize) -> Vec<&[u8]> {
    let each = buf.len() / n.max(1);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let (a, b) = buf.split_at(each);
        v.push(a);
        buf = b;
    }
    v
}

/// Splits `buf` into parts of the given byte sizes.
fn split_sizes<'a>(mut buf: &'a mut [u8], sizes: &[usize]) -> Vec<&'a mut [u8]> {
    sizes
        .iter()
        .map(|s| {
            let (a, b) = std::mem::take(&mut buf).split_at_mut(*s);
            buf = b;
            a
        })
        .collect()
}

fn split_sizes_ref<'a>(mut buf: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    sizes
        .iter()
        .map(|s| {
            let (a, b) = buf.split_at(*s);
            buf = b;
            a
        })
        .collect()
}

/// `reduce`'s argument checks: root rank and tensor in range, one CPU tensor, op valid for
/// its dtype.
fn check_reduce(tensors: &[Tensor], opts: &ReduceOptions, size: usize) -> Result<()> {
    const OP: &str = "reduce";
    at(OP).root(opts.root_rank, size)?;
    if opts.root_tensor >= tensors.len() {
        return Err(inval(
            OP,
            format!("invalid root tensor: {}", opts.root_tensor),
        ));
    }
    if tensors.len() != 1 {
        return Err(inval(OP, "requires a single-element tensor list"));
    }
    check_cpu(OP, &[&tensors[0]])?;
    check_op(OP, opts.reduce_op, tensors[0].dtype())
}

/// The root's part of `reduce`: out = finalize(prescale(out) ⊕ contributions of the others).
fn reduce_at_root(rop: ReduceOp, dtype: DType, root: usize, n: usize, segmented: bool) -> CollBody {
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
fn reduce_contribute(rop: ReduceOp, dtype: DType, root: usize, segmented: bool) -> CollBody {
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

fn nbytes(ts: &[Tensor]) -> u64 {
    ts.iter().map(|t| t.nbytes() as u64).sum()
}

/// Starts the thread that drives `engine` (named `gloo-<group>-r<rank>`).
fn spawn_worker(
    engine: &Arc<Mutex<Engine>>,
    shared: &Arc<Shared>,
    group_name: &str,
    rank: usize,
) -> Result<std::thread::JoinHandle<()>> {
    let (e2, s2) = (engine.clone(), shared.clone());
    std::thread::Builder::new()
        .name(format!("gloo-{group_name}-r{rank}"))
        .spawn(move || worker_loop(e2, s2))
        .map_err(|e| {
            DistError::backend(format!("ProcessGroupGloo: cannot start worker thread: {e}"))
        })
}

impl ProcessGroupGloo {
    /// Creates the backend for `rank` of `size` and (unless lazy) connects the full mesh.
    ///
    /// `store` must already be prefixed for this group; the listen address is published
    /// under `gloo/addr/<rank>` in it.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for `rank >= size` or a bad interface name,
    /// [`DistError::Network`] when connecting times out (after `opts.timeout`), and
    /// [`DistError::Backend`] when a peer's handshake does not match (group name, size, rank).
    pub fn new(
        store: Arc<dyn Store>,
        rank: usize,
        size: usize,
        opts: GlooOptions,
    ) -> Result<Arc<ProcessGroupGloo>> {
        if size == 0 || rank >= size {
            return Err(DistError::invalid(format!(
                "ProcessGroupGloo: invalid rank {rank} for group size {size}"
            )));
        }
        let listen_addr = opts.resolve_listen_addr()?;
        let fr = FlightRecorder::global()?.register_group(
            "gloo",
            &opts.group_name,
            &opts.group_desc,
            &opts.global_ranks,
            rank,
            size,
        );
        let id = Ident {
            group_name: opts.group_name.clone(),
            rank,
            size,
            global_ranks: opts.global_ranks.clone(),
        };
        let poll = mio::Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), WAKER)?;
        let shared = Arc::new(Shared::new(waker));
        let connector = Connector {
            store,
            listen_addr,
            timeout: opts.timeout,
            socket_buffer_bytes: opts.socket_buffer_bytes,
            local_unix_sockets: opts.local_unix_sockets,
            shared_memory: opts.shared_memory,
        };
        let (streams, shm, connector) = if opts.lazy_init || size == 1 {
            (None, None, Some(connector))
        } else {
            let streams = connector.connect(&id, &|| false)?;
            let shm = connector.shared_memory(&id, &streams)?;
            (Some(streams), Some(shm), None)
        };
        let mut engine = Engine::new(shared.clone(), poll, id.clone(), streams, connector)?;
        if let Some(shm) = shm {
            engine.set_shm(shm);
        }
        let engine = Arc::new(Mutex::new(engine));
        let worker = spawn_worker(&engine, &shared, &opts.group_name, rank)?;
        Ok(Arc::new(ProcessGroupGloo {
            shared,
            engine,
            id,
            group_desc: opts.group_desc.clone(),
            timeout: Mutex::new(opts.timeout),
            algo: Algo::from_options(&opts),
            worker: Mutex::new(Some(worker)),
            fr,
        }))
    }

    /// The group description given at construction.
    pub fn group_desc(&self) -> &str {
        &self.group_desc
    }

    /// The group name given at construction.
    pub fn group_name(&self) -> &str {
        &self.id.group_name
    }

    /// This group's handle on the process's flight recorder (its `pg_id` tells this group's
    /// entries apart in [`FlightRecorder::dump`]).
    pub fn flight_recorder(&self) -> &Arc<GroupRecorder> {
        &self.fr
    }

    /// Whether same-host all-reduces, all-gathers and reduce-scatters of this group copy
    /// straight between the ranks' memory (see [`GlooOptions::cma_min_bytes`]): `None` until
    /// the first op that could (every rank on this host, at least that many bytes) probed it, then the verdict
    /// every rank of the group agreed on. No PyTorch counterpart (diagnostics).
    pub fn cross_memory_attach(&self) -> Option<bool> {
        match self.shared.cma.load(Ordering::Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    /// Whether small same-host all-reduces of this group go through its shared-memory segment
    /// (see [`GlooOptions::shared_memory`]): `None` until the group connected (lazy init), then
    /// the verdict every rank agreed on. No PyTorch counterpart (diagnostics).
    pub fn shared_memory(&self) -> Option<bool> {
        match self.shared.shm.load(Ordering::Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    fn op_timeout(&self, t: Option<Duration>) -> Duration {
        t.unwrap_or_else(|| *lock(&self.timeout))
    }

    /// Queues a collective. `inputs`/`outputs` are leased now; `body` runs on the worker with
    /// their host bytes in the same order.
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        op: OpType,
        dtype: DType,
        total: u64,
        timeout: Option<Duration>,
        inputs: &[Tensor],
        outputs: &[Tensor],
        result: Vec<Tensor>,
        body: CollBody,
        inline: bool,
    ) -> Result<Work> {
        let leases = TensorLeases::acquire(inputs, outputs).map_err(|e| {
            e.with_prefix(&format!("ProcessGroupGloo::{}: ", op.name().to_lowercase()))
        })?;
        let timeout = self.op_timeout(timeout);
        let mut q = lock(&self.shared.queue);
        let seq = q.seq;
        q.seq += 1;
        let coll_seq = q.coll_seq;
        q.coll_seq += 1;
        let (work, mut completer) = Work::new(op, seq);
        completer.set_trace(self.record(&q, op, None, (inputs, outputs), timeout));
        completer.set_outputs(result);
        if let Some(e) = q.stop.clone() {
            drop(q);
            drop(leases);
            completer.complete(Err(e.map_message(|m| {
                format!("{op} (seq {seq}) on rank {} failed: {m}", self.id.rank)
            })));
            return Ok(work);
        }
        let info = OpInfo {
            coll_seq,
            seq,
            op,
            dtype,
            total,
        };
        q.subs.push_back(Submission::Coll(CollOp {
            info,
            timeout,
            leases,
            body,
            completer,
        }));
        drop(q);
        if inline {
            // A blocking call: run it on this thread when the engine is free (no thread hop).
            if let Ok(mut eng) = self.engine.try_lock() {
                eng.guarded(|e| e.drive_until(|| work.is_completed()));
                let more = eng.has_pending_io() || eng.is_stopping();
                drop(eng);
                let mut q = lock(&self.shared.queue);
                if more || !q.subs.is_empty() {
                    q.kick = true;
                    self.shared.cv.notify_one();
                }
                return Ok(work);
            }
        }
        self.notify();
        Ok(work)
    }

    fn submit_p2p(
        &self,
        op: OpType,
        tensors: &[Tensor],
        peer: Option<usize>,
        tag: i64,
    ) -> Result<Work> {
        let name = match op {
            OpType::Send => "send",
            OpType::Recv => "recv",
            _ => "recvAnysource",
        };
        if tensors.len() != 1 {
            return Err(inval(name, "requires a single-element tensor list"));
        }
        check_cpu(name, &[&tensors[0]])?;
        if let Some(p) = peer {
            if p >= self.id.size || p == self.id.rank {
                let what = if op == OpType::Send {
                    "destination"
                } else {
                    "source"
                };
                return Err(inval(
                    name,
                    format!(
                        "invalid {what} rank {p} (rank {} of a group of {})",
                        self.id.rank, self.id.size
                    ),
                ));
            }
        }
        let (ins, outs) = if op == OpType::Send {
            (tensors, &[][..])
        } else {
            (&[][..], tensors)
        };
        let leases = TensorLeases::acquire(ins, outs)
            .map_err(|e| e.with_prefix(&format!("ProcessGroupGloo::{name}: ")))?;
        let timeout = *lock(&self.timeout);
        let mut q = lock(&self.shared.queue);
        let seq = q.seq;
        q.seq += 1;
        let (work, mut completer) = Work::new(op, seq);
        completer.set_trace(self.record(&q, op, peer, (tensors, tensors), timeout));
        completer.set_outputs(tensors.to_vec());
        if let Some(e) = q.stop.clone() {
            drop(q);
            drop(leases);
            completer.complete(Err(e));
            return Ok(work);
        }
        let dtype = tensors[0].dtype();
        q.subs.push_back(Submission::P2p(P2pOp {
            seq,
            op,
            peer,
            tag,
            dtype,
            timeout,
            leases,
            completer,
        }));
        drop(q);
        self.notify();
        Ok(work)
    }

    /// Records a just-numbered op in the flight recorder (`q` holds the counters including
    /// it). In-place ops are recorded with the same tensors as input and output, as PyTorch
    /// does: a side left empty by the lease split takes the other one.
    fn record(
        &self,
        q: &Queue,
        op: OpType,
        peer: Option<usize>,
        (inputs, outputs): (&[Tensor], &[Tensor]),
        timeout: Duration,
    ) -> Option<Trace> {
        self.fr.record(&OpRecord {
            op,
            collective_seq_id: q.coll_seq,
            p2p_seq_id: q.seq - q.coll_seq,
            op_id: q.seq,
            peer,
            inputs: if inputs.is_empty() { outputs } else { inputs },
            outputs: if outputs.is_empty() { inputs } else { outputs },
            timeout,
        })
    }

    /// Wakes the worker wherever it sleeps: on the condvar (idle) or in epoll (driving).
    fn notify(&self) {
        self.shared.cv.notify_one();
        if let Err(e) = self.shared.waker.wake() {
            log::error!("ProcessGroupGloo: waking the worker failed: {e}");
        }
    }

    fn stop(&self, msg: String, graceful: bool) {
        // Ops failed by an abort or shutdown are no reason for a flight-recorder dump.
        self.fr.set_shutting_down();
        {
            let mut q = lock(&self.shared.queue);
            if q.stop.is_none() {
                q.stop = Some(DistError::backend(msg));
                q.graceful = graceful;
            }
        }
        self.notify();
    }

    fn join(&self) {
        let h = lock(&self.worker).take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// Reduce over a rank's tensor list into the first, then the network all-reduce.
    fn all_reduce_body(&self, rop: ReduceOp, dtype: DType) -> CollBody {
        let algo = self.algo;
        let n = self.id.size;
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
}

impl Drop for ProcessGroupGloo {
    fn drop(&mut self) {
        self.stop(
            format!(
                "ProcessGroupGloo (group {}, rank {}) was shut down",
                self.id.group_name, self.id.rank
            ),
            true,
        );
        self.join();
    }
}

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

    fn broadcast(&self, tensors: &[Tensor], opts: &BroadcastOptions) -> Result<Work> {
        const OP: &str = "broadcast";
        if opts.root_rank >= self.id.size {
            return Err(inval(OP, format!("invalid root rank: {}", opts.root_rank)));
        }
        if opts.root_tensor >= tensors.len() {
            return Err(inval(
                OP,
                format!("invalid root tensor: {}", opts.root_tensor),
            ));
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        check_cpu(OP, &refs)?;
        check_same(OP, &refs, &tensors[0])?;
        let root = opts.root_rank;
        let src = if self.id.rank == root {
            opts.root_tensor
        } else {
            0
        };
        let algo = self.algo;
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
        self.submit(
            OpType::Broadcast,
            t0.dtype(),
            t0.nbytes() as u64,
            opts.timeout,
            &[],
            tensors,
            tensors.to_vec(),
            body,
            !opts.async_op,
        )
    }

    fn all_reduce(&self, tensors: &[Tensor], opts: &AllreduceOptions) -> Result<Work> {
        const OP: &str = "allreduce";
        if tensors.is_empty() {
            return Err(inval(OP, "requires non-empty tensor list"));
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        check_cpu(OP, &refs)?;
        check_same(OP, &refs, &tensors[0])?;
        let dtype = tensors[0].dtype();
        check_op(OP, opts.reduce_op, dtype)?;
        let body = self.all_reduce_body(opts.reduce_op, dtype);
        self.submit(
            OpType::Allreduce,
            dtype,
            tensors[0].nbytes() as u64,
            opts.timeout,
            &[],
            tensors,
            tensors.to_vec(),
            body,
            !opts.async_op,
        )
    }

    fn all_reduce_coalesced(
        &self,
        tensors: &[Tensor],
        opts: &AllreduceCoalescedOptions,
    ) -> Result<Work> {
        const OP: &str = "allreduce_coalesced";
        if tensors.is_empty() {
            return Err(inval(OP, "requires non-empty tensor list"));
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        check_cpu(OP, &refs)?;
        let dtype = tensors[0].dtype();
        if tensors.iter().any(|t| t.dtype() != dtype) {
            return Err(inval(OP, "tensors must all have the same type"));
        }
        let rop = opts.reduce_op;
        check_op(OP, rop, dtype)?;
        let total = nbytes(tensors) as usize;
        let (algo, n) = (self.algo, self.id.size);
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
        self.submit(
            OpType::AllreduceCoalesced,
            dtype,
            total as u64,
            opts.timeout,
            &[],
            tensors,
            tensors.to_vec(),
            body,
            !opts.async_op,
        )
    }

    fn reduce(&self, tensors: &[Tensor], opts: &ReduceOptions) -> Result<Work> {
        check_reduce(tensors, opts, self.id.size)?;
        let dtype = tensors[0].dtype();
        let rop = opts.reduce_op;
        let (root, n) = (opts.root_rank, self.id.size);
        let total = tensors[0].nbytes() as u64;
        // Direct to the root while its scratch (n buffers) stays small, segmented above.
        let segmented = n > 2 && tensors[0].nbytes() * n > self.algo.small_reduce_scratch;
        let (body, ins, outs) = if self.id.rank == root {
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
        self.submit(
            OpType::Reduce,
            dtype,
            total,
            opts.timeout,
            ins,
            outs,
            tensors.to_vec(),
            body,
            !opts.async_op,
        )
    }

    fn all_gather(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        const OP: &str = "allgather";
        if inputs.is_empty() {
            return Err(inval(OP, "requires non-empty input tensor list"));
        }
        if outputs.len() != inputs.len() {
            return Err(inval(
                OP,
                "requires input/output tensor lists to have the same length",
            ));
        }
        let n = self.id.size;
        for (i, o) in outputs.iter().enumerate() {
            if o.len() != n {
                return Err(inval(
                    OP,
                    format!(
                        "invalid output tensor list at index {i} (expected length {n}, got {})",
                        o.len()
                    ),
                ));
            }
        }
        let refs: Vec<&Tensor> = inputs.iter().chain(outputs.iter().flatten()).collect();
        check_cpu(OP, &refs)?;
        check_same(OP, &inputs.iter().collect::<Vec<_>>(), &inputs[0])?;
        for (i, o) in outputs.iter().enumerate() {
            check_same(OP, &o.iter().collect::<Vec<_>>(), &inputs[i])?;
        }
        let flat: Vec<Tensor> = outputs.iter().flatten().cloned().collect();
        let algo = self.algo;
        let body: CollBody =
            Box::new(move |comm, ins, mut outs| algo.all_gather(comm, &ins, &mut outs));
        self.submit(
            OpType::Allgather,
            inputs[0].dtype(),
            nbytes(inputs),
            opts.timeout,
            inputs,
            &flat,
            flat.clone(),
            body,
            !opts.async_op,
        )
    }

    fn all_gather_into_tensor(
        &self,
        output: &Tensor,
        input: &Tensor,
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        const OP: &str = "_allgather_base";
        check_cpu(OP, &[output, input])?;
        if output.dtype() != input.dtype() {
            return Err(inval(
                OP,
                "output tensor must have the same type as input tensor",
            ));
        }
        let n = self.id.size;
        if output.numel() != input.numel() * n {
            return Err(inval(
                OP,
                "output tensor size must be equal to world_size times input tensor size",
            ));
        }
        let algo = self.algo;
        let body: CollBody = Box::new(move |comm, ins, mut outs| {
            let mut parts = split_n(std::mem::take(&mut outs[0]), n);
            algo.all_gather(comm, &ins, &mut parts)
        });
        let (i, o) = (std::slice::from_ref(input), std::slice::from_ref(output));
        self.submit(
            OpType::AllgatherBase,
            input.dtype(),
            input.nbytes() as u64,
            opts.timeout,
            i,
            o,
            vec![output.clone()],
            body,
            !opts.async_op,
        )
    }

    fn all_gather_coalesced(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        const OP: &str = "allgather_coalesced";
        let n = self.id.size;
        if inputs.is_empty() {
            return Err(inval(OP, "requires non-empty input tensor list"));
        }
        if outputs.len() != n {
            return Err(inval(OP, "output lists should be equal to world size"));
        }
        let refs: Vec<&Tensor> = inputs.iter().chain(outputs.iter().flatten()).collect();
        check_cpu(OP, &refs)?;
        for o in outputs {
            if o.len() != inputs.len() {
                return Err(inval(OP, "invalid output size"));
            }
            for (i, (t, inp)) in o.iter().zip(inputs).enumerate() {
                if t.numel() != inp.numel() {
                    return Err(inval(
                        OP,
                        format!("invalid size of output tensor at index {i}"),
                    ));
                }
                if t.dtype() != inp.dtype() {
                    return Err(inval(OP, format!("invalid tensor type at index {i}")));
                }
            }
        }
        // Flatten as [i * n + p] = outputs[p][i].
        let flat: Vec<Tensor> = (0..inputs.len())
            .flat_map(|i| (0..n).map(move |p| (i, p)))
            .map(|(i, p)| outputs[p][i].clone())
            .collect();
        let algo = self.algo;
        let body: CollBody =
            Box::new(move |comm, ins, mut outs| algo.all_gather(comm, &ins, &mut outs));
        let result: Vec<Tensor> = outputs.iter().flatten().cloned().collect();
        self.submit(
            OpType::AllgatherCoalesced,
            inputs[0].dtype(),
            nbytes(inputs),
            opts.timeout,
            inputs,
            &flat,
            result,
            body,
            !opts.async_op,
        )
    }

    fn all_gather_into_tensor_coalesced(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &AllgatherOptions,
    ) -> Result<Work> {
        const OP: &str = "allgather_into_tensor_coalesced";
        let n = self.id.size;
        check_coalesced_pairs(OP, outputs, inputs)?;
        for (i, (o, inp)) in outputs.iter().zip(inputs).enumerate() {
            if o.dtype() != inp.dtype() {
                return Err(inval(OP, format!("invalid tensor type at index {i}")));
            }
            if o.numel() != inp.numel() * n {
                return Err(inval(OP, format!("invalid size of output tensor at index {i}: must be world_size times the input size")));
            }
        }
        let algo = self.algo;
        let body: CollBody = Box::new(move |comm, ins, outs| {
            // outs[i] split into n parts, flattened as [i * n + p].
            let mut parts: Vec<&mut [u8]> = outs.into_iter().flat_map(|o| split_n(o, n)).collect();
            algo.all_gather(comm, &ins, &mut parts)
        });
        self.submit(
            OpType::AllgatherCoalesced,
            inputs[0].dtype(),
            nbytes(inputs),
            opts.timeout,
            inputs,
            outputs,
            outputs.to_vec(),
            body,
            !opts.async_op,
        )
    }

    fn gather(
        &self,
        outputs: &[Vec<Tensor>],
        inputs: &[Tensor],
        opts: &GatherOptions,
    ) -> Result<Work> {
        const OP: &str = "gather";
        let (r, n, root) = (self.id.rank, self.id.size, opts.root_rank);
        if root >= n {
            return Err(inval(OP, format!("invalid root rank: {root}")));
        }
        if inputs.len() != 1 {
            return Err(inval(OP, "requires a single-element input tensor list"));
        }
        let input = &inputs[0];
        let dtype = input.dtype();
        let total = input.nbytes() as u64;
        if r == root {
            check_root_list(OP, outputs, n, "output")?;
            let refs: Vec<&Tensor> = outputs[0].iter().chain(inputs).collect();
            check_cpu(OP, &refs)?;
            check_same(OP, &outputs[0].iter().collect::<Vec<_>>(), input)?;
            let body: CollBody = Box::new(move |comm, ins, mut outs| {
                algo::exchange::gather(comm, ins[0], &mut outs, root)
            });
            self.submit(
                OpType::Gather,
                dtype,
                total,
                opts.timeout,
                inputs,
                &outputs[0],
                outputs[0].clone(),
                body,
                !opts.async_op,
            )
        } else {
            if !outputs.is_empty() {
                return Err(inval(OP, "requires empty output on non-root"));
            }
            check_cpu(OP, &[input])?;
            let body: CollBody = Box::new(move |comm, ins, mut outs| {
                algo::exchange::gather(comm, ins[0], &mut outs, root)
            });
            self.submit(
                OpType::Gather,
                dtype,
                total,
                opts.timeout,
                inputs,
                &[],
                Vec::new(),
                body,
                !opts.async_op,
            )
        }
    }

    fn scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Vec<Tensor>],
        opts: &ScatterOptions,
    ) -> Result<Work> {
        const OP: &str = "scatter";
        let (r, n, root) = (self.id.rank, self.id.size, opts.root_rank);
        if root >= n {
            return Err(inval(OP, format!("invalid root rank: {root}")));
        }
        if outputs.len() != 1 {
            return Err(inval(OP, "requires a single-element output tensor list"));
        }
        let out = &outputs[0];
        let (dtype, total) = (out.dtype(), out.nbytes() as u64);
        if r == root {
            check_root_list(OP, inputs, n, "input")?;
            let refs: Vec<&Tensor> = inputs[0].iter().chain(outputs).collect();
            check_cpu(OP, &refs)?;
            check_same(OP, &inputs[0].iter().collect::<Vec<_>>(), out)?;
            let body: CollBody = Box::new(move |comm, ins, mut outs| {
                algo::exchange::scatter(comm, &ins, outs[0], root)
            });
            self.submit(
                OpType::Scatter,
                dtype,
                total,
                opts.timeout,
                &inputs[0],
                outputs,
                outputs.to_vec(),
                body,
                !opts.async_op,
            )
        } else {
            if !inputs.is_empty() {
                return Err(inval(OP, "requires empty input on non-root"));
            }
            check_cpu(OP, &[out])?;
            let body: CollBody = Box::new(move |comm, ins, mut outs| {
                algo::exchange::scatter(comm, &ins, outs[0], root)
            });
            self.submit(
                OpType::Scatter,
                dtype,
                total,
                opts.timeout,
                &[],
                outputs,
                outputs.to_vec(),
                body,
                !opts.async_op,
            )
        }
    }

    fn reduce_scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Vec<Tensor>],
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        const OP: &str = "reduce_scatter";
        let (r, n) = (self.id.rank, self.id.size);
        if outputs.len() != 1 {
            return Err(inval(OP, "requires a single-element output tensor list"));
        }
        if inputs.len() != 1 {
            return Err(inval(OP, "requires a single-element input list"));
        }
        if inputs[0].len() != n {
            return Err(inval(
                OP,
                format!(
                    "Incorrect input list size {}. Input list size should be {n}.",
                    inputs[0].len()
                ),
            ));
        }
        let out = &outputs[0];
        let refs: Vec<&Tensor> = inputs[0].iter().chain(outputs).collect();
        check_cpu(OP, &refs)?;
        if let Some(t) = inputs[0].iter().find(|t| t.dtype() != out.dtype()) {
            return Err(inval(
                OP,
                format!(
                    "invalid tensor type (expected {}, got {})",
                    out.dtype(),
                    t.dtype()
                ),
            ));
        }
        if inputs[0][r].numel() != out.numel() {
            return Err(inval(
                OP,
                format!(
                    "invalid tensor size (input {r} has {} elements, output {})",
                    inputs[0][r].numel(),
                    out.numel()
                ),
            ));
        }
        let (dtype, rop) = (out.dtype(), opts.reduce_op);
        check_op(OP, rop, dtype)?;
        let algo = self.algo;
        let body: CollBody = Box::new(move |comm, ins, mut outs| {
            reduce_scatter_body(algo, comm, &ins, outs[0], rop, dtype, n)
        });
        self.submit(
            OpType::ReduceScatter,
            dtype,
            nbytes(&inputs[0]),
            opts.timeout,
            &inputs[0],
            outputs,
            outputs.to_vec(),
            body,
            !opts.async_op,
        )
    }

    fn reduce_scatter_tensor(
        &self,
        output: &Tensor,
        input: &Tensor,
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        const OP: &str = "_reduce_scatter_base";
        let n = self.id.size;
        check_cpu(OP, &[output, input])?;
        if output.dtype() != input.dtype() {
            return Err(inval(
                OP,
                "input tensor must be the same type as the output tensor.",
            ));
        }
        if input.numel() != output.numel() * n {
            return Err(inval(
                OP,
                "input tensor must be the same size as output size times world size",
            ));
        }
        let (dtype, rop) = (output.dtype(), opts.reduce_op);
        check_op(OP, rop, dtype)?;
        let algo = self.algo;
        let body: CollBody = Box::new(move |comm, ins, mut outs| {
            let blocks = split_n_ref(ins[0], n);
            reduce_scatter_body(algo, comm, &blocks, outs[0], rop, dtype, n)
        });
        let (i, o) = (std::slice::from_ref(input), std::slice::from_ref(output));
        self.submit(
            OpType::ReduceScatterBase,
            dtype,
            input.nbytes() as u64,
            opts.timeout,
            i,
            o,
            vec![output.clone()],
            body,
            !opts.async_op,
        )
    }

    fn reduce_scatter_tensor_coalesced(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &ReduceScatterOptions,
    ) -> Result<Work> {
        const OP: &str = "reduce_scatter_tensor_coalesced";
        let n = self.id.size;
        check_coalesced_pairs(OP, outputs, inputs)?;
        let rop = opts.reduce_op;
        let dtype = inputs[0].dtype();
        for (i, (o, inp)) in outputs.iter().zip(inputs).enumerate() {
            if o.dtype() != inp.dtype() || inp.dtype() != dtype {
                return Err(inval(OP, format!("invalid tensor type at index {i}")));
            }
            if inp.numel() != o.numel() * n {
                return Err(inval(
                    OP,
                    format!(
                        "input tensor {i} must be the same size as output size times world size"
                    ),
                ));
            }
        }
        check_op(OP, rop, dtype)?;
        let algo = self.algo;
        let body: CollBody = Box::new(move |comm, ins, outs| {
            for (inp, out) in ins.iter().zip(outs) {
                let blocks = split_n_ref(inp, n);
                reduce_scatter_body(algo, comm, &blocks, out, rop, dtype, n)?;
            }
            Ok(())
        });
        self.submit(
            OpType::ReduceScatterBase,
            dtype,
            nbytes(inputs),
            opts.timeout,
            inputs,
            outputs,
            outputs.to_vec(),
            body,
            !opts.async_op,
        )
    }

    fn all_to_all_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
        opts: &AllToAllOptions,
    ) -> Result<Work> {
        const OP: &str = "alltoall_base";
        let n = self.id.size;
        check_cpu(OP, &[output, input])?;
        if output.dtype() != input.dtype() {
            return Err(inval(OP, "tensors with different dtypes"));
        }
        let splits = |t: &Tensor, s: &[usize], what: &str| -> Result<Vec<usize>> {
            let rows = t.shape().first().copied().unwrap_or(1);
            let row_bytes = t.nbytes().checked_div(rows).unwrap_or(0);
            if s.is_empty() {
                if rows % n != 0 {
                    return Err(inval(
                        OP,
                        format!(
                            "{what} tensor's dim 0 ({rows}) must be divisible by world size {n}"
                        ),
                    ));
                }
                return Ok(vec![rows / n * row_bytes; n]);
            }
            if s.len() != n {
                return Err(inval(
                    OP,
                    format!(
                        "{what} split sizes have {} entries, expected world size {n}",
                        s.len()
                    ),
                ));
            }
            let sum = s.iter().try_fold(0usize, |a, x| a.checked_add(*x));
            if sum != Some(rows) {
                return Err(inval(
                    OP,
                    format!("{what} split sizes {s:?} do not sum to dim 0 ({rows})"),
                ));
            }
            Ok(s.iter().map(|x| x * row_bytes).collect())
        };
        let out_b = splits(output, output_split_sizes, "output")?;
        let in_b = splits(input, input_split_sizes, "input")?;
        let r = self.id.rank;
        if out_b[r] != in_b[r] {
            return Err(inval(
                OP,
                format!(
                    "rank {r} sends itself {} bytes but expects {} bytes from itself (input and output split sizes disagree at index {r})",
                    in_b[r], out_b[r]
                ),
            ));
        }
        let body: CollBody = Box::new(move |comm, ins, mut outs| {
            let ib = split_sizes_ref(ins[0], &in_b);
            let mut ob = split_sizes(std::mem::take(&mut outs[0]), &out_b);
            algo::exchange::all_to_all(comm, &ib, &mut ob)
        });
        let (i, o) = (std::slice::from_ref(input), std::slice::from_ref(output));
        // Ranks may legally send different amounts (uneven splits), so the op's total is not
        // comparable across ranks: 0 here; every frame's size is still checked against its receive.
        self.submit(
            OpType::AlltoallBase,
            input.dtype(),
            0,
            opts.timeout,
            i,
            o,
            vec![output.clone()],
            body,
            !opts.async_op,
        )
    }

    fn all_to_all(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &AllToAllOptions,
    ) -> Result<Work> {
        const OP: &str = "alltoall";
        let n = self.id.size;
        if inputs.len() != n {
            return Err(inval(
                OP,
                format!(
                    "input tensor list size {} does not match world size {n}",
                    inputs.len()
                ),
            ));
        }
        if outputs.len() != n {
            return Err(inval(
                OP,
                format!(
                    "output tensor list size {} does not match world size {n}",
                    outputs.len()
                ),
            ));
        }
        let refs: Vec<&Tensor> = inputs.iter().chain(outputs).collect();
        check_cpu(OP, &refs)?;
        let dtype = inputs[0].dtype();
        if refs.iter().any(|t| t.dtype() != dtype) {
            return Err(inval(
                OP,
                "input and output tensors must have the same type",
            ));
        }
        let r = self.id.rank;
        if inputs[r].numel() != outputs[r].numel() {
            return Err(inval(
                OP,
                format!(
                    "rank {r} sends itself {} elements but expects {} from itself (input and output tensors at index {r} differ in size)",
                    inputs[r].numel(),
                    outputs[r].numel()
                ),
            ));
        }
        let body: CollBody =
            Box::new(move |comm, ins, mut outs| algo::exchange::all_to_all(comm, &ins, &mut outs));
        // As in all_to_all_single: per-rank totals may legally differ; frames are still checked.
        self.submit(
            OpType::Alltoall,
            dtype,
            0,
            opts.timeout,
            inputs,
            outputs,
            outputs.to_vec(),
            body,
            !opts.async_op,
        )
    }

    fn barrier(&self, opts: &BarrierOptions) -> Result<Work> {
        let body: CollBody = Box::new(move |comm, _ins, _outs| algo::barrier::dissemination(comm));
        self.submit(
            OpType::Barrier,
            DType::U8,
            0,
            opts.timeout,
            &[],
            &[],
            Vec::new(),
            body,
            !opts.async_op,
        )
    }

    fn monitored_barrier(&self, opts: &BarrierOptions, wait_all_ranks: bool) -> Result<()> {
        let timeout = self.op_timeout(opts.timeout);
        let body: CollBody = Box::new(move |comm, _ins, _outs| {
            algo::barrier::monitored(comm, timeout, wait_all_ranks)
        });
        // The engine's own deadline must not pre-empt the barrier's reporting.
        let w = self.submit(
            OpType::MonitoredBarrier,
            DType::U8,
            0,
            Some(timeout.saturating_add(Duration::from_secs(5))),
            &[],
            &[],
            Vec::new(),
            body,
            true,
        )?;
        w.wait()
    }

    fn send(&self, tensors: &[Tensor], dst: usize, tag: i64) -> Result<Work> {
        self.submit_p2p(OpType::Send, tensors, Some(dst), tag)
    }

    fn recv(&self, tensors: &[Tensor], src: usize, tag: i64) -> Result<Work> {
        self.submit_p2p(OpType::Recv, tensors, Some(src), tag)
    }

    fn recv_anysource(&self, tensors: &[Tensor], tag: i64) -> Result<Work> {
        self.submit_p2p(OpType::RecvAnysource, tensors, None, tag)
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
        self.stop(
            format!(
                "ProcessGroupGloo (group {}, rank {}) was shut down",
                self.id.group_name, self.id.rank
            ),
            true,
        );
        self.join();
    }
}

/// Prescale (copying for PREMUL_SUM), direct reduce-scatter, finalize.
fn reduce_scatter_body(
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
