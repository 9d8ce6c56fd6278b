//! How a group's first communicator is made: rank 0's `ncclUniqueId` goes through the group's
//! store, then every rank calls `ncclCommInitRankConfig`. Every step is bounded by the group's
//! timeout and interrupted by `abort()` / `shutdown()` from another thread: the store is polled
//! (not waited on) for the id, and the communicator being made is published so that an abort
//! can abort it while it is still joining its peers. A communicator is never made inside an
//! open NCCL group (a coalesced block whose first op needs one): the groups are closed around
//! its creation and reopened, as PyTorch does.

use crate::comm::Communicator;
use crate::device::driver_error;
use crate::process_group::{Calls, DeviceComm, Enqueued, ProcessGroupNccl};
use crate::result;
use crate::sys;
use crate::unique_id::IdBytes;
use c10d_core::{DType, Device, DistError, ReduceOp, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest pause between two looks at the store for the unique id.
const MAX_POLL: Duration = Duration::from_millis(20);

impl ProcessGroupNccl {
    /// The group's communicator on `device` (whose context is bound to this thread), made now.
    ///
    /// # Errors
    /// A group already aborted or shut down; a timeout naming the step and store key; NCCL's
    /// error; "... was aborted" when `abort()` interrupted it.
    pub(crate) fn make_communicator(&self, device: Device) -> Result<Arc<Communicator>> {
        if self.ended.load(Ordering::Acquire) {
            return Err(self.ended_error("no communicator is made after abort() or shutdown()"));
        }
        let deadline = Instant::now() + self.default_timeout();
        let ids = self.exchange_unique_ids(deadline)?;
        result::with_groups_closed(self.lib, || self.init_abortable(&ids, device, deadline))
    }

    fn ended_error(&self, what: &str) -> DistError {
        DistError::backend(format!(
            "ProcessGroupNCCL (group {:?}, rank {} of {}): {what}",
            self.options.group_name, self.rank, self.size
        ))
    }

    /// Starts the communicator, publishes it for `abort()`, and waits until every rank joined.
    fn init_abortable(
        &self,
        ids: &[sys::ncclUniqueId],
        device: Device,
        deadline: Instant,
    ) -> Result<Arc<Communicator>> {
        let comm = Arc::new(Communicator::start_init(
            self.lib,
            ids,
            self.size,
            self.rank,
            device,
            &self.options.config,
        )?);
        *self.creating.lock().unwrap_or_else(|e| e.into_inner()) = Some(comm.clone());
        if self.ended.load(Ordering::Acquire) {
            // An abort() that came before the communicator was published.
            comm.abort();
        }
        let call = match ids.len() {
            1 => "ncclCommInitRankConfig",
            _ => "ncclCommInitRankScalable",
        };
        let ready = comm.wait_ready(call, deadline);
        self.creating
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Err(e) = ready {
            comm.abort();
            if self.ended.load(Ordering::Acquire) {
                return Err(self.ended_error("communicator initialisation was aborted"));
            }
            return Err(e);
        }
        Ok(comm)
    }

    /// The root ranks (rank 0; for nccl2 above its ranks per root, the first of each block)
    /// make an `ncclUniqueId` each and publish it under its key of the group's scheme
    /// ([`crate::unique_id`]); every rank polls the store for the others' until `deadline`.
    fn exchange_unique_ids(&self, deadline: Instant) -> Result<Vec<sys::ncclUniqueId>> {
        let scheme = self.options.unique_id_exchange;
        let n = self.uid_count.fetch_add(1, Ordering::Relaxed);
        let keys = scheme.keys(n, &self.options.group_name, self.size);
        let mut ids = vec![None; keys.len()];
        if let Some(i) = scheme.root_index(self.rank, self.size) {
            let id = result::get_unique_id(self.lib)?;
            let bytes: IdBytes = std::array::from_fn(|k| id.internal[k] as u8);
            self.store.set(&keys[i], &scheme.encode(&bytes))?;
            ids[i] = Some(id);
        }
        ids.into_iter()
            .zip(&keys)
            .map(|(id, key)| match id {
                Some(id) => Ok(id),
                None => self.read_unique_id(scheme, key, deadline),
            })
            .collect()
    }

    /// The id a root published under `key`, waited for until `deadline`.
    fn read_unique_id(
        &self,
        scheme: crate::unique_id::UniqueIdExchange,
        key: &str,
        deadline: Instant,
    ) -> Result<sys::ncclUniqueId> {
        self.await_key(key, deadline)?;
        let bytes = scheme.decode(key, &self.store.get(key)?)?;
        let mut id = sys::ncclUniqueId::default();
        for (d, s) in id.internal.iter_mut().zip(bytes) {
            *d = s as std::ffi::c_char;
        }
        Ok(id)
    }

    /// The warm-up a scheme asks for after the communicator is made (vLLM's: an all_reduce of
    /// one float32 zero that every member joins), waited for until the group's timeout.
    ///
    /// # Errors
    /// The all_reduce's error; a member that did not join in time (the communicator is then
    /// aborted).
    pub(crate) fn warm_up(&self, dc: &DeviceComm) -> Result<()> {
        if !self.options.unique_id_exchange.warm_up() {
            return Ok(());
        }
        let deadline = Instant::now() + self.default_timeout();
        let t = crate::memory::zeros(DType::F32, &[1], dc.device)?;
        let (mut keep, mut temps, mut premul) = (vec![t.clone()], Vec::new(), Vec::new());
        let calls = Calls {
            grouped: true,
            capturing: false,
            keep: &mut keep,
            temps: &mut temps,
            premul: &mut premul,
        };
        match self.enqueue_calls(dc, calls, |e| e.all_reduce(&t, ReduceOp::Sum))? {
            Enqueued::Done => {}
            Enqueued::BodyFailed(e) | Enqueued::Broken(e) => {
                std::mem::forget(keep);
                return Err(e);
            }
        }
        let end = dc
            .ctx
            .new_event(None)
            .map_err(|e| driver_error("cuEventCreate", e))?;
        end.record(&dc.stream)
            .map_err(|e| driver_error("cuEventRecord", e))?;
        while !end
            .try_is_complete()
            .map_err(|e| driver_error("cuEventQuery", e))?
        {
            if Instant::now() >= deadline {
                dc.comm.abort();
                // Whatever still runs of it may touch the buffer: never given back.
                std::mem::forget(keep);
                return Err(self.ended_error(&format!(
                    "the warm-up all_reduce after making the communicator ({:?}) did not finish within {:?}: a member did not join it",
                    self.options.unique_id_exchange,
                    self.default_timeout()
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// Polls the store until `key` exists, failing at `deadline` or as soon as the group is
    /// aborted.
    fn await_key(&self, key: &str, deadline: Instant) -> Result<()> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            if self.store.check(&[key])? {
                return Ok(());
            }
            if self.ended.load(Ordering::Acquire) {
                return Err(self.ended_error(&format!(
                    "abort() while waiting for a root's ncclUniqueId under store key {key:?}"
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.ended_error(&format!(
                    "waited {:.1} s for a root's ncclUniqueId under store key {key:?} (the group's timeout): that root (rank 0 unless nccl2 spreads roots) has not made the communicator",
                    (now - start).as_secs_f64()
                )));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(MAX_POLL);
        }
    }
}
