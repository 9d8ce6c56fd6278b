//! `ProcessGroupNCCL` in Rust: one group's communicator on one device, its NCCL stream, its
//! sequence numbers and its watchdog. The collectives themselves are in [`crate::collectives`];
//! this file owns how any of them reaches the device ([`ProcessGroupNccl::launch`]):
//!
//! 1. check that every tensor is a CUDA tensor of the group's device, take the leases;
//! 2. make the communicator if this is the first op (unique id through the store), or use the
//!    one made eagerly by [`ProcessGroupNccl::bind`] / split;
//! 3. the NCCL stream waits on an event recorded on the caller's current stream;
//! 4. the op's NCCL calls run between `ncclGroupStart` / `ncclGroupEnd` (inside one group for
//!    the whole of a coalesced block), then an end event is recorded on the NCCL stream;
//! 5. the `Work` completes when the watchdog sees the end event; `Work::wait` only makes the
//!    caller's stream wait on it (host-blocking with `TORCH_NCCL_BLOCKING_WAIT=1`).

use crate::comm::Communicator;
use crate::device::{self, driver_error};
use crate::env::NcclEnv;
use crate::events::EventPool;
use crate::inflight::{stream_wait_hook, InFlight, LeaseSlot};
use crate::library::NcclLibrary;
use crate::mapping::{nccl_reduction, nccl_type, NcclReduction, NcclType};
use crate::options::NcclOptions;
use crate::result::{check, get_unique_id};
use crate::stream;
use crate::sys;
use crate::watchdog::{GroupLabel, Watchdog, WorkRecord};
use crate::watchdog_thread::WatchdogThread;
use c10d_core::flight_recorder::{GroupRecorder, OpRecord, Trace};
use c10d_core::{
    DType, Device, DistError, FlightRecorder, OpType, ReduceOp, Result, Tensor, TensorLeases, Work,
};
use c10d_store::Store;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
}

/// What an op is, for its `Work`, the checks and the watchdog.
pub(crate) struct Op<'a> {
    pub kind: OpType,
    pub inputs: &'a [Tensor],
    pub outputs: &'a [Tensor],
    pub timeout: Option<Duration>,
    /// `Work::wait` blocks the host (barrier, as PyTorch's barrier synchronizes its stream).
    pub host_blocking: bool,
    /// The other side of a send or receive (flight recorder).
    pub peer: Option<usize>,
}

/// What an op's body enqueues with: the locked communicator, the NCCL stream, and the
/// temporary device buffers it must keep alive until the op has finished.
pub(crate) struct Enqueue<'a> {
    pub lib: &'static NcclLibrary,
    pub comm: sys::ncclComm_t,
    pub stream: sys::cudaStream_t,
    pub device: Device,
    pub scratch: &'a mut Vec<Tensor>,
    /// Device copies (dst, src) that must follow the NCCL calls: NCCL launches a group's
    /// kernels at `ncclGroupEnd`, so copies of their results are queued after it.
    pub after: &'a mut Vec<(Tensor, Tensor)>,
    premul_ops: &'a mut Vec<sys::ncclRedOp_t>,
}

/// What an enqueued op hands to [`ProcessGroupNccl::finish_launch`].
struct Pending {
    leases: Vec<TensorLeases>,
    keep: Vec<Tensor>,
    outputs: Vec<Tensor>,
    host_blocking: bool,
    trace: Option<Trace>,
}

/// An open coalesced block (`start_coalescing` … `end_coalescing`).
struct Coalesced {
    dc: Option<Arc<DeviceComm>>,
    after: Vec<(Tensor, Tensor)>,
    leases: Vec<TensorLeases>,
    keep: Vec<Tensor>,
    numel_in: i64,
    numel_out: i64,
}

static NEXT_LOCAL_ID: AtomicUsize = AtomicUsize::new(0);

/// The NCCL backend of one process group (`ProcessGroupNCCL`).
pub struct ProcessGroupNccl {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    store: Arc<dyn Store>,
    pub(crate) options: NcclOptions,
    pub(crate) env: NcclEnv,
    pub(crate) lib: &'static NcclLibrary,
    timeout: Mutex<Duration>,
    seq: AtomicU64,
    coll_seq: AtomicU64,
    p2p_seq: AtomicU64,
    fr: Arc<GroupRecorder>,
    dc: Mutex<Option<Arc<DeviceComm>>>,
    watchdog: WatchdogThread,
    coalescing: Mutex<Option<Coalesced>>,
    split_count: AtomicU64,
    uid_count: AtomicU64,
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
            watchdog: WatchdogThread::start(dog),
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
    /// group: rank 0's unique id goes through the store).
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
        let id = self.exchange_unique_id()?;
        let deadline = Instant::now() + self.default_timeout();
        let comm = Communicator::init(
            self.lib,
            id,
            self.size,
            self.rank,
            device,
            &self.options.config,
            deadline,
        )?;
        let dc = Arc::new(self.wrap_comm(ctx, comm)?);
        *slot = Some(dc.clone());
        Ok(dc)
    }

    /// A [`DeviceComm`] around a new communicator: its NCCL stream (high priority on request)
    /// and its sync event.
    pub(crate) fn wrap_comm(
        &self,
        ctx: Arc<CudaContext>,
        comm: Communicator,
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
        Ok(DeviceComm {
            device: comm.device(),
            ctx: ctx.clone(),
            comm: Arc::new(comm),
            stream,
            sync_event: Mutex::new(sync_event),
            events: Arc::new(EventPool::new(ctx.clone())),
        })
    }

    /// Rank 0 makes an `ncclUniqueId` and publishes it under a key that counts the group's
    /// communicators; the others read it (bounded by the store's timeout).
    fn exchange_unique_id(&self) -> Result<sys::ncclUniqueId> {
        let n = self.uid_count.fetch_add(1, Ordering::Relaxed);
        let key = format!("nccl_unique_id_{n}");
        let mut id = sys::ncclUniqueId::default();
        if self.rank == 0 {
            id = get_unique_id(self.lib)?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            self.store.set(&key, &bytes)?;
        } else {
            let bytes = self.store.get(&key)?;
            if bytes.len() != sys::NCCL_UNIQUE_ID_BYTES {
                return Err(DistError::backend(format!(
                    "ProcessGroupNCCL: the unique id under store key {key:?} has {} bytes, expected {}",
                    bytes.len(),
                    sys::NCCL_UNIQUE_ID_BYTES
                )));
            }
            for (d, s) in id.internal.iter_mut().zip(bytes) {
                *d = s as std::ffi::c_char;
            }
        }
        Ok(id)
    }

    /// The one device of every tensor of an op.
    ///
    /// # Errors
    /// "Tensors must be CUDA and dense" (PyTorch's text) for a CPU tensor; tensors on two
    /// devices.
    fn device_of(&self, op: &Op<'_>) -> Result<Device> {
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

    /// The device of a group that has seen no tensor: the bound one, else `rank % devices`
    /// (PyTorch's guess for barrier).
    pub(crate) fn default_device(&self) -> Result<Device> {
        if let Some(d) = self.bound_device() {
            return Ok(d);
        }
        let n = crate::cuda::cuda_device_count().max(1);
        Ok(Device::Cuda((self.rank % n) as u32))
    }

    /// Enqueues one op: see the module docs. `body` makes the NCCL calls.
    pub(crate) fn launch(
        &self,
        op: Op<'_>,
        body: impl FnOnce(&mut Enqueue<'_>) -> Result<()>,
    ) -> Result<Work> {
        let device = self.device_of(&op)?;
        let leases = TensorLeases::acquire(op.inputs, op.outputs)?;
        let dc = self.device_comm(device)?;
        dc.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        self.order_after_caller(&dc)?;
        let mut scratch = Vec::new();
        let numel_in: usize = op.inputs.iter().map(Tensor::numel).sum();
        let numel_out: usize = op.outputs.iter().map(Tensor::numel).sum();
        let mut co = self.coalescing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = co.as_mut() {
            self.enqueue_calls(&dc, false, &mut scratch, &mut c.after, body)?;
            c.dc.get_or_insert_with(|| dc.clone());
            c.leases.push(leases);
            c.keep
                .extend(op.inputs.iter().chain(op.outputs).cloned().chain(scratch));
            c.numel_in += numel_in as i64;
            c.numel_out += numel_out as i64;
            // The coalesced block's own Work comes from `end_coalescing`.
            return Ok(Work::completed(
                op.kind,
                self.sequence(),
                Ok(()),
                Vec::new(),
            ));
        }
        drop(co);
        let mut after = Vec::new();
        self.enqueue_calls(&dc, true, &mut scratch, &mut after, body)?;
        copy_after(&dc, &after)?;
        let timeout = op.timeout.unwrap_or_else(|| self.default_timeout());
        let (seq, trace) = self.number(op.kind, op.peer, op.inputs, op.outputs, timeout);
        let keep = op
            .inputs
            .iter()
            .chain(op.outputs)
            .cloned()
            .chain(scratch)
            .collect();
        let record = WorkRecord {
            seq,
            op: op.kind,
            numel_in: numel_in as i64,
            numel_out: numel_out as i64,
            timeout,
            start: Instant::now(),
        };
        let pending = Pending {
            leases: vec![leases],
            keep,
            outputs: op.outputs.to_vec(),
            host_blocking: op.host_blocking,
            trace,
        };
        self.finish_launch(&dc, record, pending)
    }

    /// The NCCL stream waits for what the caller queued on its current stream.
    fn order_after_caller(&self, dc: &DeviceComm) -> Result<()> {
        let caller = stream::current_stream(dc.device)?;
        let ev = dc.sync_event.lock().unwrap_or_else(|e| e.into_inner());
        ev.record(&caller)
            .map_err(|e| driver_error("cuEventRecord", e))?;
        dc.stream
            .wait(&ev)
            .map_err(|e| driver_error("cuStreamWaitEvent", e))
    }

    /// Runs `body` under the communicator's lock, inside its own NCCL group when `grouped`.
    fn enqueue_calls(
        &self,
        dc: &DeviceComm,
        grouped: bool,
        scratch: &mut Vec<Tensor>,
        after: &mut Vec<(Tensor, Tensor)>,
        body: impl FnOnce(&mut Enqueue<'_>) -> Result<()>,
    ) -> Result<()> {
        let deadline = Instant::now() + self.default_timeout();
        let mut premul_ops = Vec::new();
        let rc = {
            let locked = dc.comm.lock()?;
            let mut e = Enqueue {
                lib: self.lib,
                comm: locked.raw(),
                stream: dc.stream.cu_stream() as sys::cudaStream_t,
                device: dc.device,
                scratch,
                after,
                premul_ops: &mut premul_ops,
            };
            if grouped {
                // SAFETY: ncclGroupStart only touches NCCL's thread-local group state.
                check(self.lib, "ncclGroupStart", unsafe {
                    (self.lib.group_start)()
                })?;
            }
            let r = body(&mut e);
            let end = if grouped {
                // SAFETY: closes the group opened above (also after a failed body, which
                // NCCL then discards with the error of the failed call).
                unsafe { (self.lib.group_end)() }
            } else {
                sys::ncclSuccess
            };
            for op in premul_ops.drain(..) {
                // SAFETY: `op` was created on this live, locked communicator.
                unsafe { (self.lib.red_op_destroy)(op, locked.raw()) };
            }
            r?;
            end
        };
        dc.comm.finish_call("ncclGroupEnd", rc, deadline)
    }

    /// Numbers an op and records it in the flight recorder ("scheduled"): PyTorch's
    /// `op_id`, `collective_seq_id` and `p2p_seq_id`.
    fn number(
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

    /// Records the end event and hands the op to the watchdog; returns its `Work`.
    fn finish_launch(&self, dc: &Arc<DeviceComm>, record: WorkRecord, p: Pending) -> Result<Work> {
        let Pending {
            leases,
            keep,
            outputs,
            host_blocking,
            trace,
        } = p;
        let end = Arc::new(dc.events.take()?);
        end.record(&dc.stream)
            .map_err(|e| driver_error("cuEventRecord", e))?;
        let (work, mut completer) = Work::new(record.op, record.seq);
        completer.set_trace(trace);
        completer.mark_started();
        completer.set_outputs(outputs);
        let slot: LeaseSlot = Arc::new(Mutex::new(Some(leases)));
        let blocking = host_blocking || self.env.blocking_wait;
        completer.set_wait_hook(stream_wait_hook(
            dc.device,
            end.clone(),
            slot.clone(),
            blocking,
        ));
        let comm = dc.comm.clone();
        completer.set_abort_hook(Box::new(move || comm.abort()));
        self.watchdog.enqueue(
            record,
            InFlight {
                end,
                pool: dc.events.clone(),
                comm: dc.comm.clone(),
                completer: Some(completer),
                leases: slot,
                keep,
            },
        );
        Ok(work)
    }

    /// `start_coalescing`: later ops join one NCCL group until [`Self::end_block`].
    pub(crate) fn start_block(&self) -> Result<()> {
        let mut co = self.coalescing.lock().unwrap_or_else(|e| e.into_inner());
        if co.is_some() {
            return Err(DistError::invalid(
                "ProcessGroupNCCL: start_coalescing called while already coalescing",
            ));
        }
        // SAFETY: opens NCCL's thread-local group; closed by `end_block`.
        check(self.lib, "ncclGroupStart", unsafe {
            (self.lib.group_start)()
        })?;
        *co = Some(Coalesced {
            dc: None,
            after: Vec::new(),
            leases: Vec::new(),
            keep: Vec::new(),
            numel_in: 0,
            numel_out: 0,
        });
        Ok(())
    }

    /// `end_coalescing`: closes the group; one `Work` for every op of the block.
    pub(crate) fn end_block(&self) -> Result<Work> {
        let c = self
            .coalescing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| {
                DistError::invalid("ProcessGroupNCCL: end_coalescing without start_coalescing")
            })?;
        // SAFETY: closes the group `start_block` opened on this thread.
        let rc = unsafe { (self.lib.group_end)() };
        let timeout = self.default_timeout();
        let (seq, trace) = self.number(OpType::Coalesced, None, &[], &[], timeout);
        let Some(dc) = c.dc else {
            check(self.lib, "ncclGroupEnd", rc)?;
            return Ok(Work::completed(OpType::Coalesced, seq, Ok(()), Vec::new()));
        };
        dc.comm
            .finish_call("ncclGroupEnd", rc, Instant::now() + self.default_timeout())?;
        copy_after(&dc, &c.after)?;
        let record = WorkRecord {
            seq,
            op: OpType::Coalesced,
            numel_in: c.numel_in,
            numel_out: c.numel_out,
            timeout,
            start: Instant::now(),
        };
        let pending = Pending {
            leases: c.leases,
            keep: c.keep,
            outputs: Vec::new(),
            host_blocking: false,
            trace,
        };
        self.finish_launch(&dc, record, pending)
    }

    /// Aborts the communicator and fails every in-flight op (`ProcessGroupNCCL::abort`).
    pub(crate) fn abort_all(&self, why: &str) {
        // Ops failed on purpose are no reason for a flight-recorder dump.
        self.fr.set_shutting_down();
        if let Some(dc) = self.current() {
            // Waiters hear first: the abort itself may wait for the device.
            let msg = format!("{}: {why}", dc.comm.aborted_error().message());
            self.watchdog.fail_all(&msg);
            dc.comm.abort();
        }
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
        let wrapped = child.wrap_comm(dc.ctx.clone(), comm)?;
        *child.dc.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(wrapped));
        Ok(child)
    }
}

/// The copies an op queued to follow its NCCL calls, on the NCCL stream.
fn copy_after(dc: &DeviceComm, after: &[(Tensor, Tensor)]) -> Result<()> {
    for (dst, src) in after {
        // SAFETY: live CUDA tensors of equal byte size (checked when queued), kept alive by the
        // op until its end event; the NCCL stream belongs to their device.
        unsafe { crate::memory::copy_async(dst, src, dc.stream.cu_stream())? };
    }
    Ok(())
}

impl Enqueue<'_> {
    /// Checks one NCCL call's result.
    ///
    /// # Errors
    /// NCCL's error naming `call`.
    pub fn call(&self, call: &'static str, rc: sys::ncclResult_t) -> Result<()> {
        check(self.lib, call, rc).map_err(DistError::from)
    }

    /// NCCL's type for `dtype`.
    ///
    /// # Errors
    /// A dtype the loaded NCCL lacks, with PyTorch's text.
    pub fn nccl_type(&self, dtype: DType) -> Result<NcclType> {
        nccl_type(dtype, self.lib.version())
    }

    /// NCCL's reduction for `op` on `dtype`; a PREMUL_SUM op is created on the communicator
    /// and destroyed after the group ends.
    ///
    /// # Errors
    /// PyTorch's refusals ("Cannot use ReduceOp.BAND with NCCL" …); NCCL's error.
    pub fn reduction(&mut self, op: ReduceOp, dtype: DType) -> Result<sys::ncclRedOp_t> {
        let complex = matches!(dtype, DType::Complex64 | DType::Complex128);
        if complex && !matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
            // Complex numbers go through as pairs of reals: only sums are the same there.
            return Err(DistError::invalid(format!(
                "ProcessGroupNCCL: ReduceOp.{} is not supported for complex tensors ({dtype})",
                op.name()
            )));
        }
        match nccl_reduction(op, dtype, self.lib.version())? {
            NcclReduction::Builtin(r) => Ok(r),
            NcclReduction::PreMulSum(factor) => self.premul_sum(factor, dtype),
        }
    }

    fn premul_sum(&mut self, factor: f64, dtype: DType) -> Result<sys::ncclRedOp_t> {
        let mut scalar = scalar_bytes(factor, dtype)?;
        let ty = self.nccl_type(dtype)?;
        let mut op: sys::ncclRedOp_t = 0;
        // SAFETY: live, locked communicator; `scalar` holds one element of `dtype`, read before
        // the call returns (host-immediate residence).
        let rc = unsafe {
            (self.lib.red_op_create_pre_mul_sum)(
                &mut op,
                scalar.as_mut_ptr().cast::<c_void>(),
                ty.dtype,
                sys::ncclScalarHostImmediate,
                self.comm,
            )
        };
        self.call("ncclRedOpCreatePreMulSum", rc)?;
        self.premul_ops.push(op);
        Ok(op)
    }

    /// A scratch CUDA tensor on the group's device, kept alive until the op finished.
    ///
    /// # Errors
    /// Out of device memory.
    pub fn scratch(&mut self, dtype: DType, numel: usize) -> Result<Tensor> {
        let t = crate::memory::empty(dtype, &[numel], self.device)?;
        self.scratch.push(t.clone());
        Ok(t)
    }
}

/// One element of `dtype` holding `factor` (PREMUL_SUM's scalar).
fn scalar_bytes(factor: f64, dtype: DType) -> Result<Vec<u8>> {
    Ok(match dtype {
        DType::F32 => (factor as f32).to_ne_bytes().to_vec(),
        DType::F64 => factor.to_ne_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(factor).to_ne_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(factor).to_ne_bytes().to_vec(),
        other => {
            return Err(DistError::invalid(format!(
                "ProcessGroupNCCL: PREMUL_SUM needs a floating-point tensor, got {other}"
            )))
        }
    })
}
