//! [`ProcessGroupGloo`]: creation, the worker thread, submission of ops to the engine (tensor
//! leases, sequence numbers, flight-recorder entry, queue; blocking calls driven on the
//! caller's thread), abort and shutdown. The ops themselves are in `ops.rs`.

use crate::algo::dispatch::Algo;
use crate::checks::{checks, cpu};
use crate::engine::deadline_after;
use crate::engine::{
    lock, worker_loop, CollBody, CollOp, Engine, Ident, Links, OpInfo, P2pOp, Queue, Shared,
    Submission, WAKER,
};
use crate::GlooOptions;
use c10d_core::flight_recorder::{hold_failure_dumps, GroupRecorder, OpRecord, Stamp, Trace};
use c10d_core::*;
use c10d_store::Store;
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What [`ProcessGroupGloo::submit`] queues: one collective, as its op method built it.
pub(crate) struct Launch<'a> {
    pub op: OpType,
    /// The dtype peers compare frames against.
    pub dtype: DType,
    /// Bytes the op moves on this rank, as peers compare them.
    pub total: u64,
    /// The op's own timeout (`None`: the group's).
    pub timeout: Option<Duration>,
    /// Leased for reading; the body gets their bytes first, in this order.
    pub inputs: &'a [Tensor],
    /// Leased for writing; the body gets their bytes after the inputs'.
    pub outputs: &'a [Tensor],
    /// What the `Work` returns as its result (`Work::result`).
    pub result: Vec<Tensor>,
    /// Runs on the engine when the op's turn comes.
    pub body: CollBody,
    /// A blocking call (`async_op == false`): driven on the caller's thread when the engine
    /// is free (no thread hop).
    pub blocking: bool,
}

/// The CPU backend (mirrors `torch.distributed.ProcessGroupGloo`). Implements
/// [`c10d_core::Backend`] with name `"gloo"` for [`DeviceType::Cpu`].
///
/// Ops are validated synchronously (argument errors are returned as `Err` with PyTorch's
/// texts) and then run asynchronously, in issue order, on the group's worker thread; the
/// returned [`Work`] completes when the op finished on this rank. Failures (timeouts, a lost
/// peer, a collective mismatch, abort) fail the `Work` with [`DistError::Backend`].
pub struct ProcessGroupGloo {
    pub(crate) shared: Arc<Shared>,
    pub(crate) engine: Arc<Mutex<Engine>>,
    pub(crate) id: Ident,
    pub(crate) group_desc: String,
    pub(crate) timeout: Mutex<Duration>,
    pub(crate) algo: Algo,
    pub(crate) worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// This group's handle on the process's flight recorder.
    pub(crate) fr: Arc<GroupRecorder>,
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
                .with_io_source(e)
        })
}

/// Listens, publishes this rank's identity and address, and starts the group's accept thread.
fn start_links(
    store: Arc<dyn Store>,
    id: &Ident,
    opts: &GlooOptions,
    listen_addr: std::net::IpAddr,
    shared: &Arc<Shared>,
) -> Result<Links> {
    use crate::transport::{self, accept::Acceptor, hello::Who, identity::Identity};
    let listeners = transport::listen(listen_addr, opts.local_unix_sockets)?;
    let mine = Identity::mine(listeners.unix_name(), opts.two_level);
    transport::publish(store.as_ref(), id.rank, &listeners, &mine)?;
    let me = Who {
        group_name: id.group_name.clone(),
        rank: id.rank,
        size: id.size,
    };
    let auth = c10d_store::AuthSecret::from_env()?;
    let tls = c10d_store::TlsConfig::given_or_env(opts.tls.as_ref())?;
    let mailbox = Arc::new(Default::default());
    let waker = shared.clone();
    Acceptor {
        me: me.clone(),
        socket_buffer_bytes: opts.socket_buffer_bytes,
        auth: auth.clone(),
        tls: tls.clone(),
        mailbox: Arc::clone(&mailbox),
        wake: Box::new(move || {
            let _ = waker.waker.wake();
        }),
    }
    .spawn(listeners)?;
    let dialer = transport::dial::Dialer {
        store,
        me,
        mine,
        socket_buffer_bytes: opts.socket_buffer_bytes,
        auth,
        tls,
    };
    Ok(Links {
        dialer,
        mailbox,
        timeout: opts.timeout,
        identities: None,
    })
}

impl ProcessGroupGloo {
    /// Creates the backend for `rank` of `size`; unless lazy, connects its ring neighbours
    /// (other peers connect when an op first needs them).
    ///
    /// `store` must already be prefixed for this group; the listen address is published
    /// under `gloo/addr/<rank>` in it.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for `rank >= size` or a bad interface name,
    /// [`DistError::Network`] when connecting times out (after `opts.timeout`) or a peer fails
    /// authentication, and [`DistError::Backend`] when a peer's handshake does not match
    /// (group name, size, rank). With `C10D_AUTH_SECRET_FILE` set, every connection of the mesh
    /// proves the job's secret first (`c10d_store::auth`); a bad secret file is
    /// [`DistError::InvalidArgument`]. With TLS ([`GlooOptions::tls`] or `C10D_TLS_*`), every
    /// TCP connection of the mesh is encrypted; a peer without a certificate of the job's CA
    /// fails the handshake ([`DistError::Network`]); bad TLS files are
    /// [`DistError::InvalidArgument`].
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
        let links = start_links(store, &id, &opts, listen_addr, &shared)?;
        let mut engine = Engine::new(shared.clone(), poll, id.clone(), links);
        if !opts.lazy_init && size > 1 {
            // As PyTorch's eager set-up, the constructor returns once the group can run: here,
            // once its ring neighbours are connected (every other peer connects when an op
            // first needs it); the shared-memory segment is set up by the first op that needs it, `algo::shm::probe`.
            let neighbours = [(rank + 1) % size, (rank + size - 1) % size];
            engine.connect_now(&neighbours, deadline_after(opts.timeout))?;
            engine.ensure_initialized();
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

    /// Whether this same-host group has a shared-memory segment that its small all-reduces,
    /// broadcasts, all-gathers and reduce-scatters go through (see
    /// [`GlooOptions::shared_memory`]): `None` until the first op that could use one set it up
    /// (the segment is reserved lazily, sized to that op), then the verdict every rank agreed on
    /// (`Some(false)`: a rank refused, or `/dev/shm` had no room: the group uses sockets). No
    /// PyTorch counterpart (diagnostics).
    pub fn shared_memory(&self) -> Option<bool> {
        match self.shared.shm.load(Ordering::Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    /// How many peers this rank has connected to so far: connections are made when an op first
    /// needs a peer (and, without lazy init, to the two ring neighbours at creation), so this
    /// grows with the algorithms used, not with the group (a 1 KiB all_reduce of 512 ranks:
    /// at most 12). Counts connections made, including ones lost since. No PyTorch counterpart
    /// (diagnostics).
    pub fn connected_peers(&self) -> usize {
        self.shared.connections.load(Ordering::Relaxed)
    }

    pub(crate) fn op_timeout(&self, t: Option<Duration>) -> Duration {
        t.unwrap_or_else(|| *lock(&self.timeout))
    }

    /// Queues a collective: leases its tensors, numbers it, records it in the flight recorder
    /// and hands it to the engine. A blocking call that finds the engine free runs it on the
    /// calling thread: at once when nothing is queued before it (see
    /// [`ProcessGroupGloo::run_at_once`]), else after the ops queued before it. The returned
    /// `Work` completes when the body ran on this rank.
    ///
    /// # Errors
    /// A tensor already leased by a running op ("… is in use …").
    pub(crate) fn submit(&self, launch: Launch<'_>) -> Result<Work> {
        let Launch {
            op,
            dtype,
            total,
            timeout,
            inputs,
            outputs,
            result,
            body,
            blocking,
        } = launch;
        let leases = TensorLeases::acquire(inputs, outputs).map_err(|e| {
            e.with_prefix(&format!("ProcessGroupGloo::{}: ", op.name().to_lowercase()))
        })?;
        let timeout = self.op_timeout(timeout);
        let mut q = lock(&self.shared.queue);
        let (seq, coll_seq) = (q.seq, q.coll_seq);
        q.seq += 1;
        q.coll_seq += 1;
        let ids = RecordIds::of(&q);
        let record = |created| self.record(ids, op, None, (inputs, outputs), timeout, created);
        let (work, mut completer) = Work::new(op, seq);
        completer.set_outputs(result);
        if let Some(e) = q.stop.clone() {
            drop(q);
            completer.set_trace(record(None));
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
        let mut coll = CollOp {
            info,
            timeout,
            leases,
            body,
            completer,
        };
        if blocking && q.subs.is_empty() {
            // `try_lock` under the queue's lock: never waits, so the lock order of the engine
            // (engine, then queue) cannot deadlock with it.
            if let Ok(eng) = self.engine.try_lock() {
                if eng.nothing_queued() {
                    // Stamped under the queue's lock, as queued ops are recorded: entries keep
                    // the order of their numbers.
                    let created = self.fr.stamp();
                    drop(q);
                    self.run_at_once(eng, coll, (&record, created), &work);
                    return Ok(work);
                }
            }
        }
        coll.completer.set_trace(record(None));
        q.subs.push_back(Submission::Coll(coll));
        drop(q);
        if blocking {
            // Run it on this thread, after the ops queued before it, when the engine is free.
            if let Ok(mut eng) = self.engine.try_lock() {
                eng.guarded(|e| e.drive_until(|| work.is_completed()));
                self.after_driving(eng);
                return Ok(work);
            }
        }
        self.notify();
        Ok(work)
    }

    /// Runs `coll` (its `Work` is `work`) on the calling thread, which holds the engine and found
    /// nothing queued. The op is recorded in the flight recorder (`record(created)`, `created`
    /// stamped at submission) only at its first wait for a peer (see `Comm::record_pending`),
    /// where writing the entry costs the op nothing. Until then the failure dumps of this
    /// thread are held back ([`hold_failure_dumps`]), so that a failure of the group noticed
    /// before that wait dumps with the op in it. An engine panic before the op was recorded
    /// records it failed.
    fn run_at_once(
        &self,
        mut eng: std::sync::MutexGuard<'_, Engine>,
        coll: CollOp,
        (record, created): (&dyn Fn(Option<Stamp>) -> Option<Trace>, Option<Stamp>),
        work: &Work,
    ) {
        let hold = Cell::new(created.map(|_| hold_failure_dumps()));
        let recorded = Cell::new(false);
        let record_once = || {
            recorded.set(true);
            let trace = record(created);
            // Failures noticed meanwhile may dump now: the op is in the recorder.
            drop(hold.take());
            trace
        };
        let ran = eng.guarded(|e| e.run_now(coll, &record_once));
        if ran.is_none() && !recorded.get() {
            if let (Some(t), Some(e)) = (record(created), work.exception()) {
                t.finished(Err(&e));
            }
        }
        drop(hold.take());
        self.after_driving(eng);
    }

    /// After driving the engine on a caller's thread: wakes the worker when work is left
    /// (queued ops, pending sends or receives, a stop).
    fn after_driving(&self, eng: std::sync::MutexGuard<'_, Engine>) {
        let more = eng.has_pending_io() || eng.is_stopping();
        drop(eng);
        let mut q = lock(&self.shared.queue);
        if more || !q.subs.is_empty() {
            q.kick = true;
            self.shared.cv.notify_one();
        }
    }

    pub(crate) fn submit_p2p(
        &self,
        op: OpType,
        tensors: &[Tensor],
        peer: Option<usize>,
        tag: i64,
    ) -> Result<Work> {
        let checks = self.checks();
        let name = match op {
            OpType::Send => "send",
            OpType::Recv => "recv",
            _ => "recvAnysource",
        };
        // No pair connects a rank to itself: no send or receive to self.
        match (op, peer) {
            (OpType::Send, Some(dst)) => checks.send(tensors, dst, false)?,
            _ => checks.recv(tensors, peer, false)?,
        }
        cpu(name, tensors)?;
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
        let ids = RecordIds::of(&q);
        completer.set_trace(self.record(ids, op, peer, (tensors, tensors), timeout, None));
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

    /// Records a numbered op in the flight recorder, submitted at `created` (`None`: now; see
    /// [`GroupRecorder::record_at`]). In-place ops are recorded with the same
    /// tensors as input and output, as PyTorch does: a side left empty by the lease split takes
    /// the other one.
    pub(crate) fn record(
        &self,
        ids: RecordIds,
        op: OpType,
        peer: Option<usize>,
        (inputs, outputs): (&[Tensor], &[Tensor]),
        timeout: Duration,
        created: Option<Stamp>,
    ) -> Option<Trace> {
        let op = OpRecord {
            op,
            collective_seq_id: ids.collective_seq_id,
            p2p_seq_id: ids.p2p_seq_id,
            op_id: ids.op_id,
            peer,
            inputs: if inputs.is_empty() { outputs } else { inputs },
            outputs: if outputs.is_empty() { inputs } else { outputs },
            timeout,
        };
        self.fr.record_at(&op, created)
    }

    /// Wakes the worker wherever it sleeps: on the condvar (idle) or in epoll (driving).
    pub(crate) fn notify(&self) {
        self.shared.cv.notify_one();
        if let Err(e) = self.shared.waker.wake() {
            log::error!("ProcessGroupGloo: waking the worker failed: {e}");
        }
    }

    pub(crate) fn stop(&self, msg: String, graceful: bool) {
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

    /// Graceful stop (queued ops fail with "was shut down"), then joins the worker.
    pub(crate) fn shut_down(&self) {
        self.stop(
            format!(
                "ProcessGroupGloo (group {}, rank {}) was shut down",
                self.id.group_name, self.id.rank
            ),
            true,
        );
        self.join();
    }

    pub(crate) fn join(&self) {
        let h = lock(&self.worker).take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl ProcessGroupGloo {
    /// The shared argument checks for this rank of this group.
    pub(crate) fn checks(&self) -> c10d_core::checks::Checks<'static> {
        checks(self.id.rank, self.id.size)
    }
}

impl Drop for ProcessGroupGloo {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// PyTorch's numbers of an op in the flight recorder (1-based, per group).
#[derive(Clone, Copy)]
pub(crate) struct RecordIds {
    op_id: u64,
    collective_seq_id: u64,
    p2p_seq_id: u64,
}

impl RecordIds {
    /// The numbers of the op just counted in `q`.
    fn of(q: &Queue) -> RecordIds {
        RecordIds {
            op_id: q.seq,
            collective_seq_id: q.coll_seq,
            p2p_seq_id: q.seq - q.coll_seq,
        }
    }
}
