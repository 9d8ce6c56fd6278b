//! How a group's first communicator is made: rank 0's `ncclUniqueId` goes through the group's
//! store, then every rank calls `ncclCommInitRankConfig`. Every step is bounded by the group's
//! timeout and interrupted by `abort()` / `shutdown()` from another thread: the store is polled
//! (not waited on) for the id, and the communicator being made is published so that an abort
//! can abort it while it is still joining its peers. A communicator is never made inside an
//! open NCCL group (a coalesced block whose first op needs one): the groups are closed around
//! its creation and reopened, as PyTorch does.

use crate::comm::Communicator;
use crate::process_group::ProcessGroupNccl;
use crate::result;
use crate::sys;
use c10d_core::{Device, DistError, Result};
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
        let id = self.exchange_unique_id(deadline)?;
        result::with_groups_closed(self.lib, || self.init_abortable(id, device, deadline))
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
        id: sys::ncclUniqueId,
        device: Device,
        deadline: Instant,
    ) -> Result<Arc<Communicator>> {
        let comm = Arc::new(Communicator::start_init(
            self.lib,
            id,
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
        let ready = comm.wait_ready("ncclCommInitRankConfig", deadline);
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

    /// Rank 0 makes an `ncclUniqueId` and publishes it under a key that counts the group's
    /// communicators; the others poll the store for it until `deadline`.
    fn exchange_unique_id(&self, deadline: Instant) -> Result<sys::ncclUniqueId> {
        let n = self.uid_count.fetch_add(1, Ordering::Relaxed);
        let key = format!("nccl_unique_id_{n}");
        if self.rank == 0 {
            let id = result::get_unique_id(self.lib)?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            self.store.set(&key, &bytes)?;
            return Ok(id);
        }
        self.await_key(&key, deadline)?;
        let bytes = self.store.get(&key)?;
        if bytes.len() != sys::NCCL_UNIQUE_ID_BYTES {
            return Err(self.ended_error(&format!(
                "the unique id under store key {key:?} has {} bytes, expected {}",
                bytes.len(),
                sys::NCCL_UNIQUE_ID_BYTES
            )));
        }
        let mut id = sys::ncclUniqueId::default();
        for (d, s) in id.internal.iter_mut().zip(bytes) {
            *d = s as std::ffi::c_char;
        }
        Ok(id)
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
                    "abort() while waiting for rank 0's ncclUniqueId under store key {key:?}"
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.ended_error(&format!(
                    "waited {:.1} s for rank 0's ncclUniqueId under store key {key:?} (the group's timeout): rank 0 has not made the communicator",
                    (now - start).as_secs_f64()
                )));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(MAX_POLL);
        }
    }
}
