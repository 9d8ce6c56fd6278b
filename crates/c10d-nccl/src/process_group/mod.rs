//! `ProcessGroupNCCL` in Rust: one group's communicator on one device, its NCCL stream, its
//! sequence numbers and its watchdog. The collectives themselves are in `collectives.rs`,
//! coalesced blocks in `coalescing.rs`, communicator creation in `bootstrap.rs`; this file owns
//! how any op reaches the device (`ProcessGroupNccl::launch`):
//!
//! 1. check that every tensor is a CUDA tensor of one device, and that no NCCL group this group
//!    does not own is open on the thread;
//! 2. make the communicator if this is the first op (unique id through the store, abortable),
//!    or use the one made eagerly by [`ProcessGroupNccl::bind`] / split / shrink;
//! 3. order the NCCL stream after the caller ([`crate::stream`]'s rule) and take the leases;
//! 4. the op's NCCL calls run between `ncclGroupStart` / `ncclGroupEnd` (inside one group for
//!    the whole of a coalesced block), then an end event is recorded on the NCCL stream;
//! 5. the `Work` completes when the watchdog sees the end event; `Work::wait` only makes the
//!    caller's current stream wait on it (host-blocking with `TORCH_NCCL_BLOCKING_WAIT=1`). A captured op (CUDA graph) joins the caller's stream
//!    at once instead and is not watched.

use crate::comm::Communicator;
use crate::device::{self, driver_error};
use crate::env::NcclEnv;
use crate::events::EventPool;
use crate::inflight::{stream_wait_hook, InFlight, LeaseSlot};
use crate::library::NcclLibrary;
use crate::options::NcclOptions;
use crate::result;
use crate::stream;
use crate::sys;
use crate::watchdog::{GroupLabel, Watchdog, WorkRecord};
use crate::watchdog_thread::WatchdogThread;
pub(crate) use enqueue::destroy_premul;

mod coalescing;
mod enqueue;
use c10d_core::flight_recorder::{GroupRecorder, OpRecord, Trace};
use c10d_core::{
    DType, Device, DistError, FlightRecorder, OpType, Result, Tensor, TensorLeases, Work,
};
use c10d_store::Store;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The communicator of a group on its device, with the NCCL stream its ops run on.
pub(crate) struct DeviceComm {
    pub device: Device,
    pub ctx: Arc<CudaContext>,
    pub comm: Arc<Communicator>,
    pub stream: Arc<CudaStream>,
    /// Recorded on the caller's stream before each op; the NCCL stream waits on it.
    sync_event: Mutex<CudaEvent>,
    /// End events of ops.
    events: Arc<EventPool>,
    /// The byte `barrier` all-reduces, allocated with the communicator (not on the op path).
    pub barrier_byte: Tensor,
}

/// What an op is, for its `Work`, the checks and the watchdog.
pub(crate) struct Submit<'a> {
    pub kind: OpType,
    pub inputs: &'a [Tensor],
    pub outputs: &'a [Tensor],
    pub timeout: Option<Duration>,
    /// `Work::wait` blocks the host (barrier, as PyTorch's barrier synchronizes its stream).
    pub host_blocking: bool,
    /// The other side of a send or receive (flight recorder).
    pub peer: Option<usize>,
}

/// What an op's body enqueues with: the locked communicator, the NCCL stream, and where the
/// device memory it uses beyond its tensors goes.
pub(crate) struct Enqueue<'a> {
    pub lib: &'static NcclLibrary,
    pub comm: sys::ncclComm_t,
    pub stream: sys::cudaStream_t,
    pub device: Device,
    nccl_stream: &'a Arc<CudaStream>,
    /// The caller's stream is capturing a CUDA graph: allocate nothing.
    capturing: bool,
    /// Temporary buffers from the stream-ordered allocator on the NCCL stream, dropped (freed
    /// there, after the op's kernels) once the op's calls are enqueued.
    pub temps: &'a mut Vec<Tensor>,
    /// Device memory the kernels use that must live until the op has finished.
    pub keep: &'a mut Vec<Tensor>,
    /// PREMUL_SUM reductions created for the op, destroyed after its group ends.
    pub premul_ops: &'a mut Vec<sys::ncclRedOp_t>,
    /// Device work (a copy) was queued on the NCCL stream before the group ended.
    pub copied: bool,
}

/// What became of an op's calls ([`ProcessGroupNccl::enqueue_calls`]).
#[derive(Debug)]
pub(crate) enum Enqueued {
    /// Launched whole.
    Done,
    /// Launched, but the body failed after queuing some calls; the communicator is fine: the
    /// op is watched as usual, and the error returned.
    BodyFailed(DistError),
    /// Work of the op may be on the device, but the communicator failed (and was aborted): the
    /// op is retired (its memory goes when its end event fires) and the error returned.
    Broken(DistError),
}

/// What an enqueued op hands to [`ProcessGroupNccl::finish_launch`].
pub(crate) struct Pending {
    pub leases: Vec<TensorLeases>,
    pub keep: Vec<Tensor>,
    pub outputs: Vec<Tensor>,
    pub host_blocking: bool,
    pub trace: Option<Trace>,
    /// The caller's current stream the op was ordered after (see [`crate::stream`]); `None`
    /// only for a coalesced block that queued no op.
    pub caller: Option<Arc<CudaStream>>,
    /// Issued while the caller's stream was capturing a CUDA graph.
    pub capturing: bool,
}

static NEXT_LOCAL_ID: AtomicUsize = AtomicUsize::new(0);

/// The NCCL backend of one process group (`ProcessGroupNCCL`).
pub struct ProcessGroupNccl {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) options: NcclOptions,
    pub(crate) env: NcclEnv,
    pub(crate) lib: &'static NcclLibrary,
    timeout: Mutex<Duration>,
    seq: AtomicU64,
    coll_seq: AtomicU64,
    p2p_seq: AtomicU64,
    fr: Arc<GroupRecorder>,
    dc: Mutex<Option<Arc<DeviceComm>>>,
    /// The communicator being made, so that `abort()` can interrupt its initialisation.
    pub(crate) creating: Mutex<Option<Arc<Communicator>>>,
    /// Set by `abort()` / `shutdown()`: no communicator is made any more.
    pub(crate) ended: AtomicBool,
    pub(crate) watchdog: WatchdogThread,
    pub(crate) coalescing: Mutex<Option<coalescing::Coalesced>>,
    split_count: AtomicU64,
    pub(crate) uid_count: AtomicU64,
}

impl Drop for ProcessGroupNccl {
    /// A coalesced block left open is ended (see `abandon_block`); the rest goes with the
    /// fields (the watchdog fails what is in flight, aborting communicators whose ops are
    /// still on the device; a live communicator ends in order).
    fn drop(&mut self) {
        self.abandon_open_block("was destroyed");
    }
}

impl std::fmt::Debug for ProcessGroupNccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroupNCCL(rank {} of {}, group {:?})",
            self.rank, self.size, self.options.group_name
        )
    }
}

impl ProcessGroupNccl {
    /// A backend for rank `rank` of `size`, rendezvousing through `store` (the group's prefixed
    /// store). The communicator is made at the first collective, or now with
    /// [`ProcessGroupNccl::bind`] (PyTorch's `device_id`).
    ///
    /// # Errors
    /// No GPU (PyTorch's "ProcessGroupNCCL is only supported with GPUs, no GPUs found!"), no
    /// loadable NCCL (every place tried), a malformed `TORCH_NCCL_*` variable.
    pub fn new(
        store: Arc<dyn Store>,
        rank: usize,
        size: usize,
        options: NcclOptions,
    ) -> Result<ProcessGroupNccl> {
        Self::with_env(store, rank, size, options, NcclEnv::from_process_env()?)
    }

    /// As [`ProcessGroupNccl::new`] with the `TORCH_NCCL_*` settings given instead of read from
    /// the process environment.
    ///
    /// # Errors
    /// As [`ProcessGroupNccl::new`].
    pub fn with_env(
        store: Arc<dyn Store>,
        rank: usize,
        size: usize,
        options: NcclOptions,
        env: NcclEnv,
    ) -> Result<ProcessGroupNccl> {
        crate::availability::check_available()?;
        let mut options = options;
        options.apply_env(&env);
        let label = GroupLabel {
            local_id: NEXT_LOCAL_ID.fetch_add(1, Ordering::Relaxed),
            group_name: options.group_name.clone(),
            group_desc: options.group_desc.clone(),
            rank,
        };
        let dog = Watchdog::new(label, env.async_error_handling);
        let heartbeat = env.heartbeat();
        let fr = FlightRecorder::global()?.register_group(
            "nccl",
            &options.group_name,
            &options.group_desc,
            &options.global_ranks,
            rank,
            size,
        );
        Ok(ProcessGroupNccl {
            rank,
            size,
            store,
            timeout: Mutex::new(options.timeout),
            options,
            env,
            lib: crate::loader::library()?,
            seq: AtomicU64::new(0),
            coll_seq: AtomicU64::new(0),
            p2p_seq: AtomicU64::new(0),
            fr,
            dc: Mutex::new(None),
            creating: Mutex::new(None),
            ended: AtomicBool::new(false),
            watchdog: WatchdogThread::start(dog, heartbeat),
            coalescing: Mutex::new(None),
            split_count: AtomicU64::new(0),
            uid_count: AtomicU64::new(0),
        })
    }

    /// Binds the group to `device` and makes its communicator now (eager init, PyTorch's
    /// `init_process_group(device_id=...)`). Every rank must call it.
    ///
    /// # Errors
    /// As the first collective's communicator creation; a group already bound elsewhere.
    pub fn bind(&self, device: Device) -> Result<()> {
        self.device_comm(device).map(|_| ())
    }

    /// The device the group is bound to, once it has a communicator.
    pub fn bound_device(&self) -> Option<Device> {
        self.current().map(|d| d.device)
    }

    /// This group's handle on the process's flight recorder (`nccl:` profiling names).
    pub fn flight_recorder(&self) -> &Arc<GroupRecorder> {
        &self.fr
    }

    /// How many communicators were made from this one by `ncclCommSplit`
    /// (`_get_backend(...).comm_split_count()`).
    pub fn comm_split_count(&self) -> u64 {
        self.split_count.load(Ordering::Relaxed)
    }

    /// The loaded NCCL's version (`torch.cuda.nccl.version()`).
    pub fn nccl_version(&self) -> crate::Version {
        self.lib.version()
    }

    pub(crate) fn current(&self) -> Option<Arc<DeviceComm>> {
        self.dc.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn default_timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_default_timeout(&self, t: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = t;
    }

    pub(crate) fn sequence(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    pub(crate) fn set_sequence(&self, s: u64) {
        self.seq.store(s, Ordering::Relaxed);
    }

    /// The group's communicator on `device`, made now if it has none (a collective over the
    /// group: rank 0's unique id goes through the store; see [`crate::bootstrap`]).
    pub(crate) fn device_comm(&self, device: Device) -> Result<Arc<DeviceComm>> {
        let mut slot = self.dc.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dc) = slot.as_ref() {
            if dc.device != device {
                return Err(DistError::invalid(format!(
                    "ProcessGroupNCCL: the group is bound to {} but got a tensor on {device}; one device per process is supported",
                    dc.device
                )));
            }
            return Ok(dc.clone());
        }
        let ctx = device::context(device)?;
        ctx.bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        let comm = self.make_communicator(device)?;
        let dc = Arc::new(self.wrap_comm(ctx, comm)?);
        *slot = Some(dc.clone());
        drop(slot);
        self.warm_up(&dc)?;
        Ok(dc)
    }

    /// A [`DeviceComm`] around a new communicator: its NCCL stream (high priority on request),
    /// its sync event and barrier byte.
    pub(crate) fn wrap_comm(
        &self,
        ctx: Arc<CudaContext>,
        comm: Arc<Communicator>,
    ) -> Result<DeviceComm> {
        let stream = if self.options.is_high_priority_stream {
            let (_, greatest) = cudarc::driver::result::stream::get_priority_range()
                .map_err(|e| driver_error("cuCtxGetStreamPriorityRange", e))?;
            ctx.new_stream_with_priority(greatest)
        } else {
            ctx.new_stream()
        }
        .map_err(|e| driver_error("cuStreamCreate", e))?;
        let sync_event = ctx
            .new_event(None)
            .map_err(|e| driver_error("cuEventCreate", e))?;
        let device = comm.device();
        Ok(DeviceComm {
            device,
            ctx: ctx.clone(),
            comm,
            stream,
            sync_event: Mutex::new(sync_event),
            events: Arc::new(EventPool::new(ctx.clone())),
            barrier_byte: crate::memory::zeros(DType::U8, &[1], device)?,
        })
    }

    /// The one device of every tensor of an op.
    ///
    /// # Errors
    /// "Tensors must be CUDA and dense" (PyTorch's text) for a CPU tensor; tensors on two
    /// devices.
    fn device_of(&self, op: &Submit<'_>) -> Result<Device> {
        let mut found = None;
        for t in op.inputs.iter().chain(op.outputs) {
            let d = t.device();
            if !matches!(d, Device::Cuda(_)) {
                return Err(DistError::invalid(format!(
                    "ProcessGroupNCCL::{}: Tensors must be CUDA and dense (got a tensor on {d})",
                    op.kind
                )));
            }
            match found {
                None => found = Some(d),
                Some(f) if f != d => {
                    return Err(DistError::invalid(format!(
                    "ProcessGroupNCCL::{}: Tensors must be on the same device (got {f} and {d})",
                    op.kind
                )))
                }
                _ => {}
            }
        }
        match found {
            Some(d) => Ok(d),
            None => self.default_device(),
        }
    }

    /// The device of a group that has seen no tensor: the bound one, else `cuda:LOCAL_RANK`
    /// (set by `c10drun` / torchrun), else the process's global rank modulo the device count
    /// (PyTorch's guess). The global rank, not the group rank: a subgroup of ranks 2 and 3 on
    /// one node must not guess devices 0 and 1.
    ///
    /// # Errors
    /// None today (kept fallible for callers that bind the result).
    pub fn default_device(&self) -> Result<Device> {
        if let Some(d) = self.bound_device() {
            return Ok(d);
        }
        let n = crate::cuda::cuda_device_count().max(1);
        let local = std::env::var("LOCAL_RANK")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&l| l < n);
        let global = self.options.global_ranks.get(self.rank).copied();
        let guess = local.unwrap_or_else(|| global.unwrap_or(self.rank) % n);
        Ok(Device::Cuda(guess as u32))
    }

    /// Enqueues one op: see the module docs. `body` makes the NCCL calls. Inside a coalesced
    /// block, a failure is also remembered for `end_coalescing`.
    pub(crate) fn launch(
        &self,
        op: Submit<'_>,
        body: impl FnOnce(&mut Enqueue<'_>) -> Result<()>,
    ) -> Result<Work> {
        let r = self.launch_op(op, body);
        if let Err(e) = &r {
            let mut co = self.coalescing.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(block) = co.as_mut() {
                block.failed.get_or_insert_with(|| e.clone());
            }
        }
        r
    }

    fn launch_op(
        &self,
        op: Submit<'_>,
        body: impl FnOnce(&mut Enqueue<'_>) -> Result<()>,
    ) -> Result<Work> {
        let device = self.device_of(&op)?;
        let in_block = self.check_thread_groups(&op)?;
        let declared = stream::declared_stream(device)?;
        let capturing = match &declared {
            Some(s) => crate::capture::is_capturing(s)?,
            None => false,
        };
        crate::caller_memory::check_uses(
            op.kind,
            (op.inputs, op.outputs),
            in_block,
            declared.as_deref(),
            capturing,
        )?;
        if capturing && self.current().is_none() {
            return Err(DistError::invalid(format!(
                "ProcessGroupNCCL::{}: the group has no communicator yet, and one cannot be made during CUDA graph capture; run an op (or bind the group) before capturing, as PyTorch requires a warm-up",
                op.kind
            )));
        }
        let dc = self.device_comm(device)?;
        dc.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        if in_block {
            // Ordered before the block's lock is taken (a device synchronisation must not hold
            // up other threads' use of the group).
            let caller = Some(self.order_after_caller(&dc, declared)?);
            let mut co = self.coalescing.lock().unwrap_or_else(|e| e.into_inner());
            let block = co.as_mut().ok_or_else(|| {
                DistError::invalid("ProcessGroupNCCL: the coalescing block ended while an op of it was being issued")
            })?;
            return self.launch_in_block(block, &dc, &op, (caller, capturing), body);
        }
        // Host-side refusals first: a refused op never waits for the device.
        let leases = TensorLeases::acquire(op.inputs, op.outputs)?;
        let caller = Some(self.order_after_caller(&dc, declared)?);
        let mut keep: Vec<Tensor> = op.inputs.iter().chain(op.outputs).cloned().collect();
        let mut temps = Vec::new();
        let mut premul = Vec::new();
        let calls = Calls {
            grouped: true,
            capturing,
            keep: &mut keep,
            temps: &mut temps,
            premul: &mut premul,
        };
        let enqueued = self.enqueue_calls(&dc, calls, body)?;
        // Freed on the NCCL stream, after the kernels just queued there.
        drop(temps);
        let timeout = op.timeout.unwrap_or_else(|| self.default_timeout());
        let (seq, trace) = self.number(op.kind, op.peer, op.inputs, op.outputs, timeout);
        let record = WorkRecord {
            seq,
            op: op.kind,
            numel_in: op.inputs.iter().map(Tensor::numel).sum::<usize>() as i64,
            numel_out: op.outputs.iter().map(Tensor::numel).sum::<usize>() as i64,
            timeout,
            start: Instant::now(),
        };
        let pending = Pending {
            leases: vec![leases],
            keep,
            outputs: op.outputs.to_vec(),
            host_blocking: op.host_blocking,
            trace,
            caller,
            capturing,
        };
        match enqueued {
            Enqueued::Done => self.finish_launch(&dc, record, pending),
            Enqueued::BodyFailed(e) => self.finish_launch(&dc, record, pending).and(Err(e)),
            Enqueued::Broken(e) => Err(self.retire(&dc, record, pending, e)),
        }
    }

    /// An op whose work may be on the device but whose communicator failed: its `Work` fails
    /// now (the flight recorder says why), and its memory is retired with an end event, to be
    /// released once that fires. Nothing is polled, so this is no new failure for the watchdog
    /// to answer. Returns `error`.
    pub(crate) fn retire(
        &self,
        dc: &DeviceComm,
        record: WorkRecord,
        p: Pending,
        error: DistError,
    ) -> DistError {
        let (work, mut completer) = Work::new(record.op, record.seq);
        completer.set_trace(p.trace);
        completer.complete(Err(error.clone()));
        drop(work);
        match self.end_event(dc) {
            Ok(end) => self.watchdog.retire(InFlight {
                end: {
                    crate::caller_memory::note_end(&p.keep, &end);
                    end
                },
                pool: dc.events.clone(),
                comm: dc.comm.clone(),
                completer: None,
                leases: Arc::new(Mutex::new(Some(p.leases))),
                keep: p.keep,
            }),
            // Nothing can say when the work is done: never given back.
            Err(_) => std::mem::forget((p.keep, p.leases)),
        }
        error
    }

    /// Refuses an op issued while an NCCL group this group does not own is open on the thread
    /// (another group's coalesced block, or a user's `ncclGroupStart`): its calls would only
    /// launch when that group ends, after this op's `Work` had been recorded as enqueued.
    /// Returns whether this group has a coalesced block open (one look at the block).
    fn check_thread_groups(&self, op: &Submit<'_>) -> Result<bool> {
        let (in_block, own) = match self
            .coalescing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(c) => (true, c.group_open()),
            None => (false, false),
        };
        let open = result::open_groups();
        if open > usize::from(own) {
            return Err(DistError::invalid(format!(
                "ProcessGroupNCCL::{} on group {:?}: an NCCL group that this group did not open is open on this thread (another group's coalescing block?); end it first",
                op.kind, self.options.group_name
            )));
        }
        Ok(in_block)
    }

    /// Orders the NCCL stream after the caller's work, by the rule of [`crate::stream`]: after
    /// the thread's current stream (its `declared` one, else the legacy default stream),
    /// which is returned. The host never waits.
    fn order_after_caller(
        &self,
        dc: &DeviceComm,
        declared: Option<Arc<CudaStream>>,
    ) -> Result<Arc<CudaStream>> {
        let caller = match declared {
            Some(s) => s,
            None => stream::current_stream(dc.device)?,
        };
        let ev = dc.sync_event.lock().unwrap_or_else(|e| e.into_inner());
        ev.record(&caller)
            .map_err(|e| driver_error("cuEventRecord", e))?;
        dc.stream
            .wait(&ev)
            .map_err(|e| driver_error("cuStreamWaitEvent", e))?;
        Ok(caller)
    }

    /// Runs `body` under the communicator's lock, inside its own NCCL group when
    /// `calls.grouped` (else inside the open coalesced block's group, which then owns the
    /// PREMUL_SUM reductions). Grouped: once the group ended and the communicator is ready, the
    /// reductions are destroyed, and a body that failed after queuing calls gives its error as
    /// `Ok(Some(e))` (the queued calls were launched; the caller must watch them).
    ///
    /// # Errors
    /// Nothing was launched: the communicator is unusable, NCCL refused the group, or (not
    /// grouped) the body failed.
    pub(crate) fn enqueue_calls(
        &self,
        dc: &DeviceComm,
        calls: Calls<'_>,
        body: impl FnOnce(&mut Enqueue<'_>) -> Result<()>,
    ) -> Result<Enqueued> {
        let deadline = Instant::now() + self.default_timeout();
        let (ended, body_result, copied) = {
            let locked = dc.comm.lock()?;
            let mut e = Enqueue {
                lib: self.lib,
                comm: locked.raw(),
                stream: dc.stream.cu_stream() as sys::cudaStream_t,
                device: dc.device,
                nccl_stream: &dc.stream,
                capturing: calls.capturing,
                temps: calls.temps,
                keep: calls.keep,
                premul_ops: calls.premul,
                copied: false,
            };
            if !calls.grouped {
                // The open block holds the op's memory and ends (or retires) it.
                return body(&mut e).map(|()| Enqueued::Done);
            }
            result::group_start(self.lib)?;
            let r = body(&mut e);
            // Also after a failed body: a failed NCCL call makes NCCL discard the group (the
            // end reports that error); a failure of ours launches what was queued.
            let copied = e.copied;
            (result::group_end(self.lib), r, copied)
        };
        // NCCL refused the group: none of its calls were launched.
        let refused = ended.is_err();
        let ready = dc.comm.finish_call("ncclGroupEnd", ended, deadline);
        if let Ok(l) = dc.comm.lock() {
            destroy_premul(self.lib, l.raw(), calls.premul);
        }
        enqueue_outcome(refused, copied, ready, body_result)
    }

    /// Numbers an op and records it in the flight recorder ("scheduled"): PyTorch's
    /// `op_id`, `collective_seq_id` and `p2p_seq_id`.
    pub(crate) fn number(
        &self,
        op: OpType,
        peer: Option<usize>,
        ins: &[Tensor],
        outs: &[Tensor],
        timeout: Duration,
    ) -> (u64, Option<Trace>) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let p2p = matches!(op, OpType::Send | OpType::Recv);
        let (coll, p2p_seq) = if p2p {
            (
                self.coll_seq.load(Ordering::Relaxed),
                self.p2p_seq.fetch_add(1, Ordering::Relaxed) + 1,
            )
        } else {
            (
                self.coll_seq.fetch_add(1, Ordering::Relaxed) + 1,
                self.p2p_seq.load(Ordering::Relaxed),
            )
        };
        let trace = self.fr.record(&OpRecord {
            op,
            collective_seq_id: coll,
            p2p_seq_id: p2p_seq,
            op_id: seq,
            peer,
            inputs: if ins.is_empty() { outs } else { ins },
            outputs: if outs.is_empty() { ins } else { outs },
            timeout,
        });
        (seq, trace)
    }

    /// Records the end event and hands the op to the watchdog; returns its `Work`. A captured
    /// op instead joins the caller's stream to the NCCL stream at once and completes (see
    /// [`crate::capture`]).
    pub(crate) fn finish_launch(
        &self,
        dc: &Arc<DeviceComm>,
        record: WorkRecord,
        p: Pending,
    ) -> Result<Work> {
        let end = match self.end_event(dc) {
            Ok(end) => end,
            Err(e) => {
                // The op's kernels are queued but cannot be watched: stop them, and never give
                // their memory back (some of their work may still sit on the NCCL stream).
                dc.comm.abort();
                std::mem::forget((p.keep, p.leases));
                return Err(e);
            }
        };
        if p.capturing {
            return self.finish_captured(dc, record, p, end);
        }
        crate::caller_memory::note_end(&p.keep, &end);
        let (work, mut completer) = Work::new(record.op, record.seq);
        completer.set_trace(p.trace);
        completer.mark_started();
        completer.set_outputs(p.outputs);
        let slot: LeaseSlot = Arc::new(Mutex::new(Some(p.leases)));
        let blocking = p.host_blocking || self.env.blocking_wait;
        completer.set_wait_hook(stream_wait_hook(
            dc.device,
            end.clone(),
            slot.clone(),
            blocking,
        ));
        let ended = self.ended_hook();
        completer.set_abort_hook(Box::new(ended));
        self.watchdog.enqueue(
            record,
            InFlight {
                end,
                pool: dc.events.clone(),
                comm: dc.comm.clone(),
                completer: Some(completer),
                leases: slot,
                keep: p.keep,
            },
        );
        Ok(work)
    }

    /// An end event recorded on the NCCL stream after the op's work. Tried twice: cudarc
    /// reports (and clears) an error an earlier drop on the context stored at the next call
    /// that binds the context, which would otherwise cost the op its end event.
    fn end_event(&self, dc: &DeviceComm) -> Result<Arc<CudaEvent>> {
        let record = || -> Result<Arc<CudaEvent>> {
            let end = dc.events.take()?;
            end.record(&dc.stream)
                .map_err(|e| driver_error("cuEventRecord", e))?;
            Ok(Arc::new(end))
        };
        record().or_else(|_| record()).inspect_err(|e| {
            log::error!(
                "ProcessGroupNCCL (group {:?}): no end event for an op ({e}); its memory is never given back, and a caller_memory scope viewing it cannot end",
                self.options.group_name
            )
        })
    }

    /// A captured op: the caller's stream waits for the NCCL stream (the capture needs the
    /// join before it ends), and the `Work` is complete at once; nothing goes to the watchdog.
    fn finish_captured(
        &self,
        dc: &Arc<DeviceComm>,
        record: WorkRecord,
        p: Pending,
        end: Arc<CudaEvent>,
    ) -> Result<Work> {
        let caller = p.caller.ok_or_else(|| {
            DistError::backend("ProcessGroupNCCL: a captured op without the capturing stream")
        })?;
        caller
            .wait(&end)
            .map_err(|e| driver_error("cuStreamWaitEvent", e))?;
        if let Ok(end) = Arc::try_unwrap(end) {
            dc.events.give(end);
        }
        let (work, mut completer) = Work::new(record.op, record.seq);
        completer.set_trace(p.trace);
        completer.mark_started();
        completer.set_outputs(p.outputs);
        // Recorded into the graph: as far as this process can tell, done (the flight recorder
        // marks it completed).
        completer.complete(Ok(()));
        Ok(work)
    }

    /// What `Work::abort` does: abort this group's communicator (from any thread), as
    /// `abort()` does.
    fn ended_hook(&self) -> impl Fn() + Send + 'static {
        let watchdog = self.watchdog.handle();
        let msg = format!(
            "NCCL communicator was aborted on rank {} (group {:?}): Work::abort() was called",
            self.rank, self.options.group_name
        );
        move || watchdog.abort_everything(&msg)
    }

    /// What ending the group on purpose starts with: its failures are no reason for a
    /// flight-recorder dump nor for the watchdog's response, no communicator is made any more,
    /// and the one being made is aborted.
    fn begin_ending(&self) {
        self.fr.set_shutting_down();
        self.watchdog.set_ending();
        self.ended.store(true, Ordering::Release);
        let creating = self
            .creating
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(c) = creating {
            c.abort();
        }
        self.abandon_open_block("ended");
    }

    /// Ends a coalesced block left open when the group `what` (see `abandon_block`). A block
    /// whose NCCL group another thread holds open stays with that thread: it is marked failed
    /// and its communicator's abort waits for the block's `end_coalescing`, which closes the
    /// NCCL group (that thread's), does the abort and returns the error.
    fn abandon_open_block(&self, what: &str) {
        let why = format!(
            "ProcessGroupNCCL (group {:?}, rank {}): the group {what} during a coalesced block",
            self.options.group_name, self.rank
        );
        let mut co = self.coalescing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = co
            .as_mut()
            .filter(|b| b.group_open() && result::open_groups() == 0)
        {
            b.abort_from_another_thread(&why);
            return;
        }
        let block = co.take();
        drop(co);
        if let Some(block) = block {
            self.abandon_block(block, &why);
        }
    }

    /// Aborts the communicator (the one being made included) and fails every in-flight op
    /// (`ProcessGroupNCCL::abort`). The ops' memory is released after the abort, when no
    /// kernel can use it any more.
    pub(crate) fn abort_all(&self, why: &str) {
        self.begin_ending();
        let msg = format!(
            "NCCL communicator was aborted on rank {} (group {:?}): {why}",
            self.rank, self.options.group_name
        );
        self.watchdog.abort_everything(&msg);
        if let Some(dc) = self.current() {
            dc.comm.abort();
        }
    }

    /// The orderly end of the group (PyTorch's `shutdown()`): the communicator flushes its
    /// queued operations (`ncclCommFinalize`, waited for up to the group's timeout) and is
    /// destroyed; what cannot finish by then is aborted. Ops still in flight after that fail.
    pub(crate) fn shutdown_all(&self) {
        self.begin_ending();
        if let Some(dc) = self.current() {
            let deadline = Instant::now() + self.default_timeout();
            // A failed op whose kernels still run (a stuck or dead peer, the work failed with
            // TORCH_NCCL_ASYNC_ERROR_HANDLING=0) would hold an orderly finalize until the
            // group's timeout (10 minutes by default): abort at once instead.
            if self.watchdog.has_running_failures() {
                dc.comm.abort();
            } else if let Err(e) = dc.comm.shutdown(deadline) {
                log::warn!(
                    "c10d-nccl: shutdown of rank {} fell back to abort: {e}",
                    self.rank
                );
            }
        }
        self.watchdog
            .finish_everything("the group was shut down while the op was in flight");
    }

    /// A new group made from this one's communicator by `ncclCommSplit`.
    pub(crate) fn split_child(
        &self,
        ranks: &[usize],
        options: NcclOptions,
    ) -> Result<Option<ProcessGroupNccl>> {
        let dc = self.device_comm(self.default_device()?)?;
        dc.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        let member = ranks.iter().position(|&r| r == self.rank);
        // Every rank of one child uses the child's lowest parent rank as its colour.
        let color = member.map(|_| ranks.iter().copied().min().unwrap_or(0) as u32);
        let deadline = Instant::now() + self.default_timeout();
        let made = dc
            .comm
            .split(color, member.unwrap_or(0), &options.config, deadline)?;
        self.split_count.fetch_add(1, Ordering::Relaxed);
        let Some((comm, rank, size)) = made else {
            return Ok(None);
        };
        self.child_group(&dc, comm, rank, size, options).map(Some)
    }

    /// A new group of the ranks not in `exclude` (group ranks), made by `ncclCommShrink`
    /// (NCCL ≥ 2.27) from this group's communicator; with `abort_first` the pending work of
    /// this one is aborted first (after a failure). `None` on an excluded rank.
    ///
    /// # Errors
    /// No communicator yet; NCCL older than 2.27 (naming `ncclCommShrink`); NCCL's error.
    pub fn shrink(
        &self,
        exclude: &[usize],
        abort_first: bool,
        options: NcclOptions,
    ) -> Result<Option<ProcessGroupNccl>> {
        if exclude.contains(&self.rank) {
            // Excluded ranks do not take part (NCCL refuses them).
            return Ok(None);
        }
        let dc = self.current().ok_or_else(|| {
            DistError::invalid("ProcessGroupNCCL: shrink needs a communicator (bind the group to its device first)")
        })?;
        dc.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        let deadline = Instant::now() + self.default_timeout();
        let made = dc
            .comm
            .shrink(exclude, abort_first, &options.config, deadline)?;
        let Some((comm, rank, size)) = made else {
            return Ok(None);
        };
        self.child_group(&dc, comm, rank, size, options).map(Some)
    }

    fn child_group(
        &self,
        dc: &DeviceComm,
        comm: Communicator,
        rank: usize,
        size: usize,
        options: NcclOptions,
    ) -> Result<ProcessGroupNccl> {
        let child =
            ProcessGroupNccl::with_env(self.store.clone(), rank, size, options, self.env.clone())?;
        let wrapped = child.wrap_comm(dc.ctx.clone(), Arc::new(comm))?;
        *child.dc.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(wrapped));
        Ok(child)
    }
}

/// What became of a grouped op, from whether NCCL refused its group (`refused`: nothing of it
/// launched), whether device work was queued before the group ended anyway (`copied`), the
/// communicator's readiness after the group (`ready`) and the body's own result: the rule that
/// decides whether the op's memory may go now (`Err`), must be watched (`Done`, `BodyFailed`)
/// or retired until its end event fires (`Broken`). An NCCL error of the body is preferred to
/// the group's (it names the call).
fn enqueue_outcome(
    refused: bool,
    copied: bool,
    ready: Result<()>,
    body: Result<()>,
) -> Result<Enqueued> {
    Ok(match (ready, body) {
        (Ok(()), Ok(())) => Enqueued::Done,
        (Ok(()), Err(first)) => Enqueued::BodyFailed(first),
        (Err(e), body) => {
            let nccl_first = body.err().filter(|f| f.message().contains("NCCL error"));
            let e = nccl_first.unwrap_or(e);
            if refused && !copied {
                return Err(e);
            }
            Enqueued::Broken(e)
        }
    })
}

/// Where one op's calls put what outlives them (see [`Enqueue`]).
pub(crate) struct Calls<'a> {
    /// In a group of their own (else inside the open coalesced block's group).
    pub grouped: bool,
    pub capturing: bool,
    pub keep: &'a mut Vec<Tensor>,
    pub temps: &'a mut Vec<Tensor>,
    pub premul: &'a mut Vec<sys::ncclRedOp_t>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(m: &str) -> Result<()> {
        Err(DistError::backend(m))
    }

    #[test]
    fn what_happens_to_an_ops_memory_after_its_group() {
        // Launched and ready: watched.
        assert!(matches!(
            enqueue_outcome(false, false, Ok(()), Ok(())),
            Ok(Enqueued::Done)
        ));
        // Our check failed after some calls were queued; the group launched them: watched,
        // then the error.
        let r = enqueue_outcome(false, false, Ok(()), err("dtype"));
        assert!(matches!(r, Ok(Enqueued::BodyFailed(e)) if e.message() == "dtype"));
        // NCCL refused the group and nothing else was queued: the memory may go now.
        let r = enqueue_outcome(true, false, err("group"), err("NCCL error in: ncclSend"));
        assert!(matches!(r, Err(e) if e.message().starts_with("NCCL error in: ncclSend")));
        // Refused, but a copy was already queued on the NCCL stream: retired.
        let r = enqueue_outcome(true, true, err("group"), Ok(()));
        assert!(matches!(r, Ok(Enqueued::Broken(e)) if e.message() == "group"));
        // Launched, then the communicator failed (a timeout, an abort): retired, never freed
        // under the kernels.
        let r = enqueue_outcome(false, false, err("deadline"), Ok(()));
        assert!(matches!(r, Ok(Enqueued::Broken(e)) if e.message() == "deadline"));
    }
}
