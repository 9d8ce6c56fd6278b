//! The NCCL communicator: one `ncclComm_t` of one group on one device, made from a unique id
//! shared through the store, by `ncclCommSplit` of a parent, or by `ncclCommShrink`; aborted
//! with `ncclCommAbort` (from any thread) and freed the same way when dropped.
//!
//! Communicators are made non-blocking (`config.blocking = 0`) unless the options ask
//! otherwise, so that every NCCL call, the initialisation included, returns at once and
//! [`Communicator::wait_ready`] polls it against a deadline: a peer that never arrives becomes a
//! timeout error instead of a hang, and [`Communicator::abort`] can stop it from another thread.
//! A mutex guards the handle: an abort never frees it under a concurrent call.

use crate::library::NcclLibrary;
use crate::options::NcclConfig;
use crate::result::{check, error_string, last_error, result_name};
use crate::sys;
use c10d_core::{Device, DistError, Result};
use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

struct Handle {
    comm: sys::ncclComm_t,
    aborted: bool,
}

/// An NCCL communicator (`NCCLComm` in PyTorch).
pub struct Communicator {
    lib: &'static NcclLibrary,
    handle: Mutex<Handle>,
    rank: usize,
    size: usize,
    device: Device,
    nonblocking: bool,
}

// SAFETY: the raw handle is only used under `handle`'s mutex; NCCL allows a communicator to be
// used from any thread as long as calls on it do not overlap, which the mutex guarantees.
unsafe impl Send for Communicator {}
// SAFETY: as above.
unsafe impl Sync for Communicator {}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {} on {})",
            self.rank, self.size, self.device
        )
    }
}

/// A communicator's raw handle, held for the duration of NCCL calls.
pub struct Locked<'a> {
    guard: MutexGuard<'a, Handle>,
}

impl Locked<'_> {
    /// The raw handle (never null: [`Communicator::lock`] refuses aborted communicators).
    pub fn raw(&self) -> sys::ncclComm_t {
        self.guard.comm
    }
}

impl Communicator {
    /// `ncclCommInitRankConfig` (or `ncclCommInitRank` before NCCL 2.14) of rank `rank` of
    /// `size`, on `device` (whose context must be bound to this thread), waiting for every rank
    /// until `deadline`.
    ///
    /// # Errors
    /// NCCL's error; "NCCL communicator initialisation ... timed out" after `deadline` (the
    /// half-made communicator is aborted).
    pub fn init(
        lib: &'static NcclLibrary,
        id: sys::ncclUniqueId,
        size: usize,
        rank: usize,
        device: Device,
        config: &NcclConfig,
        deadline: Instant,
    ) -> Result<Communicator> {
        let mut raw_config = effective(config).to_raw();
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        let rc = match lib.comm_init_rank_config() {
            // SAFETY: `comm` is writable; `raw_config` lives across the call; `id` came from
            // ncclGetUniqueId of rank 0 (through the store).
            Ok(f) => unsafe {
                f(
                    &mut comm,
                    size as c_int,
                    id,
                    rank as c_int,
                    raw_config.as_mut_ptr(),
                )
            },
            // SAFETY: as above, without a config (NCCL < 2.14, which is always blocking).
            Err(_) => unsafe { (lib.comm_init_rank)(&mut comm, size as c_int, id, rank as c_int) },
        };
        let c = Communicator::wrap(lib, comm, rank, size, device, config);
        c.after_call("ncclCommInitRankConfig", rc, deadline)?;
        Ok(c)
    }

    fn wrap(
        lib: &'static NcclLibrary,
        comm: sys::ncclComm_t,
        rank: usize,
        size: usize,
        device: Device,
        config: &NcclConfig,
    ) -> Communicator {
        Communicator {
            lib,
            handle: Mutex::new(Handle {
                comm,
                aborted: comm.is_null(),
            }),
            rank,
            size,
            device,
            nonblocking: effective(config).blocking == 0 && lib.comm_init_rank_config().is_ok(),
        }
    }

    /// The checks after an NCCL call on this communicator: its return code, then (non-blocking)
    /// polling until it is ready. A failure or timeout aborts the communicator.
    fn after_call(
        &self,
        call: &'static str,
        rc: sys::ncclResult_t,
        deadline: Instant,
    ) -> Result<()> {
        if rc != sys::ncclSuccess && rc != sys::ncclInProgress {
            let e = self.call_error(call, rc);
            self.abort();
            return Err(e);
        }
        if let Err(e) = self.wait_ready(call, deadline) {
            self.abort();
            return Err(e);
        }
        Ok(())
    }

    /// Polls a non-blocking communicator until its last call finished (`ncclCommGetAsyncError`
    /// no longer `ncclInProgress`), failing at `deadline` or on an abort. Immediate for blocking
    /// communicators.
    ///
    /// # Errors
    /// The asynchronous NCCL error; a timeout naming `call`; an aborted communicator.
    pub fn wait_ready(&self, call: &'static str, deadline: Instant) -> Result<()> {
        if !self.nonblocking {
            return Ok(());
        }
        let mut pause = Duration::from_micros(1);
        loop {
            match self.async_state()? {
                sys::ncclSuccess => return Ok(()),
                sys::ncclInProgress => {}
                code => return Err(self.call_error(call, code)),
            }
            if Instant::now() >= deadline {
                return Err(DistError::backend(format!(
                    "{call} on rank {} of {} ({}) did not finish before its deadline: a peer may not have joined",
                    self.rank, self.size, self.device
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn call_error(&self, call: &'static str, code: sys::ncclResult_t) -> DistError {
        let h = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        let last = if h.aborted {
            None
        } else {
            // SAFETY: the handle is live (not aborted) and locked.
            unsafe { last_error(self.lib, h.comm) }
        };
        DistError::backend(format!(
            "NCCL error in: {call}, {} ({}), NCCL version {} on rank {} ({}){}",
            error_string(self.lib, code),
            result_name(code),
            self.lib.version(),
            self.rank,
            self.device,
            last.map(|l| format!("\nLast error:\n{l}"))
                .unwrap_or_default()
        ))
    }

    /// `ncclCommGetAsyncError`'s code.
    ///
    /// # Errors
    /// An aborted communicator; the query's own failure.
    fn async_state(&self) -> Result<sys::ncclResult_t> {
        let l = self.lock()?;
        let mut state: sys::ncclResult_t = sys::ncclSuccess;
        // SAFETY: the handle is live and locked; `state` is writable.
        let rc = unsafe { (self.lib.comm_get_async_error)(l.raw(), &mut state) };
        check(self.lib, "ncclCommGetAsyncError", rc)?;
        Ok(state)
    }

    /// The asynchronous error NCCL reports for this communicator, if any (the watchdog's
    /// question); an aborted communicator reports that it was aborted.
    pub fn async_error(&self) -> Option<String> {
        match self.async_state() {
            Ok(sys::ncclSuccess) | Ok(sys::ncclInProgress) => None,
            Ok(code) => Some(
                self.call_error("ncclCommGetAsyncError", code)
                    .message()
                    .to_string(),
            ),
            Err(e) => Some(e.message().to_string()),
        }
    }

    /// The handle, locked for a sequence of NCCL calls.
    ///
    /// # Errors
    /// "NCCL communicator was aborted on rank R" once [`Communicator::abort`] ran.
    pub fn lock(&self) -> Result<Locked<'_>> {
        let guard = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        if guard.aborted {
            return Err(self.aborted_error());
        }
        Ok(Locked { guard })
    }

    /// The error every use of an aborted communicator returns.
    pub fn aborted_error(&self) -> DistError {
        DistError::backend(format!(
            "NCCL communicator was aborted on rank {} ({}); create a new group to go on",
            self.rank, self.device
        ))
    }

    /// Checks an NCCL call made under [`Communicator::lock`] and waits until it is done.
    ///
    /// # Errors
    /// As [`Communicator::wait_ready`]; the call's own error.
    pub fn finish_call(
        &self,
        call: &'static str,
        rc: sys::ncclResult_t,
        deadline: Instant,
    ) -> Result<()> {
        self.after_call(call, rc, deadline)
    }

    /// `ncclCommAbort`: stops every NCCL kernel of this communicator and frees it. Safe from any
    /// thread, idempotent; later uses fail with [`Communicator::aborted_error`].
    pub fn abort(&self) {
        let mut h = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        if h.aborted {
            return;
        }
        h.aborted = true;
        // SAFETY: the handle is live, locked, and never used again (aborted is set).
        let rc = unsafe { (self.lib.comm_abort)(h.comm) };
        h.comm = std::ptr::null_mut();
        if rc != sys::ncclSuccess {
            log::warn!("c10d-nccl: ncclCommAbort returned {}", result_name(rc));
        }
    }

    /// True once aborted.
    pub fn is_aborted(&self) -> bool {
        self.handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .aborted
    }

    /// `ncclCommSplit`: this rank joins the child of ranks with the same `color`, ordered by
    /// `key`; `color = None` takes part without joining (`NCCL_SPLIT_NOCOLOR`) and returns
    /// `None`. Every rank of this communicator must call it.
    ///
    /// # Errors
    /// NCCL older than 2.18 (naming `ncclCommSplit` and the version); NCCL's error; a timeout.
    pub fn split(
        &self,
        color: Option<u32>,
        key: usize,
        config: &NcclConfig,
        deadline: Instant,
    ) -> Result<Option<(Communicator, usize, usize)>> {
        let f = self.lib.comm_split()?;
        let mut raw_config = effective(config).to_raw();
        let mut child: sys::ncclComm_t = std::ptr::null_mut();
        let color = color.map_or(sys::NCCL_SPLIT_NOCOLOR, |c| c as c_int);
        let rc = {
            let l = self.lock()?;
            // SAFETY: parent live and locked; out-pointer and config valid across the call.
            unsafe {
                f(
                    l.raw(),
                    color,
                    key as c_int,
                    &mut child,
                    raw_config.as_mut_ptr(),
                )
            }
        };
        self.finish_call("ncclCommSplit", rc, deadline)?;
        self.child(child, config, "ncclCommSplit", deadline)
    }

    /// `ncclCommShrink` (NCCL ≥ 2.27): the communicator of the ranks not in `exclude`; with
    /// `abort_first` (`NCCL_SHRINK_ABORT`) pending work on this one is aborted first, for use
    /// after a failure.
    ///
    /// # Errors
    /// NCCL older than 2.27 (naming `ncclCommShrink`); NCCL's error; a timeout.
    pub fn shrink(
        &self,
        exclude: &[usize],
        abort_first: bool,
        config: &NcclConfig,
        deadline: Instant,
    ) -> Result<Option<(Communicator, usize, usize)>> {
        let f = self.lib.comm_shrink()?;
        let mut raw_config = effective(config).to_raw();
        let mut excl: Vec<c_int> = exclude.iter().map(|&r| r as c_int).collect();
        let mut child: sys::ncclComm_t = std::ptr::null_mut();
        let flags = if abort_first {
            sys::NCCL_SHRINK_ABORT
        } else {
            sys::NCCL_SHRINK_DEFAULT
        };
        let rc = {
            let l = self.lock()?;
            // SAFETY: parent live and locked; the exclusion list and config outlive the call.
            unsafe {
                f(
                    l.raw(),
                    excl.as_mut_ptr(),
                    excl.len() as c_int,
                    &mut child,
                    raw_config.as_mut_ptr(),
                    flags,
                )
            }
        };
        self.finish_call("ncclCommShrink", rc, deadline)?;
        self.child(child, config, "ncclCommShrink", deadline)
    }

    /// Wraps a child handle made by split or shrink, reading its rank and size from NCCL.
    fn child(
        &self,
        child: sys::ncclComm_t,
        config: &NcclConfig,
        call: &'static str,
        deadline: Instant,
    ) -> Result<Option<(Communicator, usize, usize)>> {
        if child.is_null() {
            return Ok(None);
        }
        let mut c = Communicator::wrap(self.lib, child, 0, 0, self.device, config);
        c.wait_ready(call, deadline)?;
        (c.rank, c.size) = c.rank_and_size()?;
        let (rank, size) = (c.rank, c.size);
        Ok(Some((c, rank, size)))
    }

    fn rank_and_size(&self) -> Result<(usize, usize)> {
        let l = self.lock()?;
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: live, locked handle; writable ints.
        check(self.lib, "ncclCommUserRank", unsafe {
            (self.lib.comm_user_rank)(l.raw(), &mut rank)
        })?;
        // SAFETY: as above.
        check(self.lib, "ncclCommCount", unsafe {
            (self.lib.comm_count)(l.raw(), &mut size)
        })?;
        Ok((rank as usize, size as usize))
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }
    /// The device it runs on.
    pub fn device(&self) -> Device {
        self.device
    }
    /// The library it was made with.
    pub fn library(&self) -> &'static NcclLibrary {
        self.lib
    }
}

impl Drop for Communicator {
    /// Frees the communicator with `ncclCommAbort`, which never waits for peers (PyTorch's
    /// shutdown does the same).
    fn drop(&mut self) {
        self.abort();
    }
}

/// The configuration actually passed: non-blocking unless the user set `blocking`.
fn effective(config: &NcclConfig) -> NcclConfig {
    let mut c = config.clone();
    if c.blocking == sys::NCCL_CONFIG_UNDEF_INT {
        c.blocking = 0;
    }
    c
}
