//! The NCCL communicator: one `ncclComm_t` of one group on one device, made from a unique id
//! shared through the store, by `ncclCommSplit` of a parent, or by `ncclCommShrink`. It ends in
//! one of two ways, as PyTorch's `NCCLComm` does: [`Communicator::shutdown`] (an orderly end:
//! `ncclCommFinalize`, wait until it has flushed, `ncclCommDestroy`; also what dropping it does)
//! or [`Communicator::abort`] (`ncclCommAbort`, from any thread: for `abort()`, errors and
//! timeouts, and the fallback when an orderly end fails or runs past its deadline).
//!
//! Communicators are made non-blocking (`config.blocking = 0`) unless the options ask
//! otherwise, so that every NCCL call, the initialisation included, returns at once and
//! [`Communicator::wait_ready`] polls it against a deadline: a peer that never arrives becomes a
//! timeout error instead of a hang, and [`Communicator::abort`] can stop it from another thread.
//! A mutex guards the handle: an abort never frees it under a concurrent call.

use crate::library::NcclLibrary;
use crate::options::NcclConfig;
use crate::result::{self, error_string, last_error, result_name, NcclError, Progress};
use crate::sys;
use c10d_core::{Device, DistError, Result};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

struct Handle {
    comm: sys::ncclComm_t,
    /// The handle was freed (aborted or destroyed): `comm` is null.
    aborted: bool,
    /// Freed in order by [`Communicator::shutdown`] (its ops had finished).
    destroyed: bool,
    /// Coalesced blocks whose NCCL group holds this communicator ([`Communicator::open_block`]).
    open_blocks: usize,
    /// An abort asked for while a block was open: done when the last block closes.
    abort_pending: bool,
}

/// How long dropping a live communicator waits for `ncclCommFinalize` before aborting it.
pub const DROP_FINALIZE_LIMIT: Duration = Duration::from_secs(10);

/// An NCCL communicator (`NCCLComm` in PyTorch).
pub struct Communicator {
    lib: &'static NcclLibrary,
    handle: Mutex<Handle>,
    /// Set before an abort takes the lock (`ncclCommAbort` holds it for its whole run), so
    /// that a watchdog that cannot take the lock still learns that an abort is under way.
    aborting: AtomicBool,
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
        let c = Communicator::start_init(lib, &[id], size, rank, device, config)?;
        c.after_call("ncclCommInitRankConfig", Ok(Progress::InProgress), deadline)?;
        Ok(c)
    }

    /// Starts `ncclCommInitRankConfig` (one unique id) or `ncclCommInitRankScalable` (several
    /// roots' ids, NCCL ≥ 2.23) and returns at once: a non-blocking communicator may
    /// still be joining its peers, which [`Communicator::wait_ready`] waits for, and which
    /// [`Communicator::abort`] from another thread interrupts (PyTorch's `abort()` during
    /// initialisation).
    ///
    /// # Errors
    /// NCCL's error (nothing is left to free).
    pub fn start_init(
        lib: &'static NcclLibrary,
        ids: &[sys::ncclUniqueId],
        size: usize,
        rank: usize,
        device: Device,
        config: &NcclConfig,
    ) -> Result<Communicator> {
        let mut raw_config = effective(config).to_raw();
        let (call, (comm, started)) = match ids {
            // SAFETY: `raw_config` lives across the call; the caller bound the device's context.
            [id] => ("ncclCommInitRankConfig", unsafe {
                result::comm_init_rank(lib, size, *id, rank, raw_config.as_mut_ptr())
            }),
            _ => {
                let mut ids = ids.to_vec();
                // SAFETY: as above; `ids` lives across the call.
                let r = unsafe {
                    result::comm_init_rank_scalable(
                        lib,
                        size,
                        &mut ids,
                        rank,
                        raw_config.as_mut_ptr(),
                    )
                };
                ("ncclCommInitRankScalable", r?)
            }
        };
        let c = Communicator::wrap(lib, comm, rank, size, device, config);
        if let Err(e) = started {
            let e = c.call_error(call, e.code);
            c.abort();
            return Err(e);
        }
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
            aborting: AtomicBool::new(false),
            handle: Mutex::new(Handle {
                comm,
                aborted: comm.is_null(),
                destroyed: false,
                open_blocks: 0,
                abort_pending: false,
            }),
            rank,
            size,
            device,
            nonblocking: effective(config).blocking == 0 && lib.comm_init_rank_config().is_ok(),
        }
    }

    /// The checks after an NCCL call on this communicator: its result, then (non-blocking)
    /// polling until it is ready. A failure or timeout aborts the communicator.
    fn after_call(
        &self,
        call: &'static str,
        started: std::result::Result<Progress, NcclError>,
        deadline: Instant,
    ) -> Result<()> {
        let ready = match started {
            Err(e) => Err(self.call_error(call, e.code)),
            Ok(_) => self.wait_ready(call, deadline),
        };
        if ready.is_err() {
            self.abort();
        }
        ready
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
        self.describe(call, code, &h)
    }

    /// The error of `call` returning `code`, with NCCL's last error of the (locked) handle.
    fn describe(&self, call: &'static str, code: sys::ncclResult_t, h: &Handle) -> DistError {
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
        // SAFETY: the handle is live and locked.
        Ok(unsafe { result::comm_get_async_error(self.lib, l.raw()) }?)
    }

    /// The asynchronous error NCCL reports for this communicator, if any (the watchdog's
    /// question); an aborted communicator reports that it was aborted, one shut down in order
    /// reports nothing. Never waits: while another thread holds the communicator, an abort
    /// under way is reported as the abort; anything else (a blocking communicator inside a
    /// long call) is `None` for now, and [`Communicator::state_known`] says that it is not
    /// known, so no op completes on it meanwhile.
    pub fn async_error(&self) -> Option<String> {
        let h = match self.handle.try_lock() {
            Ok(h) => h,
            Err(std::sync::TryLockError::WouldBlock) => {
                return self
                    .aborting
                    .load(Ordering::Acquire)
                    .then(|| self.aborted_error().message().to_string());
            }
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        if h.destroyed {
            return None;
        }
        if h.aborted || h.abort_pending {
            return Some(self.aborted_error().message().to_string());
        }
        // SAFETY: the handle is live and locked.
        let state = unsafe { result::comm_get_async_error(self.lib, h.comm) };
        match state {
            Ok(sys::ncclSuccess) | Ok(sys::ncclInProgress) => None,
            // Described under the lock already held: never wait for it twice.
            Ok(code) => Some(
                self.describe("ncclCommGetAsyncError", code, &h)
                    .message()
                    .to_string(),
            ),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Whether this communicator's state can be vouched for now: no abort was asked for and
    /// no other thread holds it. An op must not be completed as a success otherwise: an
    /// aborted kernel also ends and fires its end event, with results not to be trusted (a
    /// busy lock means "unknown", never "fine").
    pub fn state_known(&self) -> bool {
        if self.aborting.load(Ordering::Acquire) {
            return false;
        }
        !matches!(
            self.handle.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    /// The handle, locked for a sequence of NCCL calls.
    ///
    /// # Errors
    /// "NCCL communicator was aborted on rank R" once [`Communicator::abort`] ran.
    pub fn lock(&self) -> Result<Locked<'_>> {
        let guard = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        if guard.aborted || guard.abort_pending || self.aborting.load(Ordering::Acquire) {
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

    /// Checks an NCCL call made under [`Communicator::lock`] (its checked result from
    /// [`crate::result`]) and waits until it is done.
    ///
    /// # Errors
    /// As [`Communicator::wait_ready`]; the call's own error.
    pub fn finish_call(
        &self,
        call: &'static str,
        started: std::result::Result<Progress, NcclError>,
        deadline: Instant,
    ) -> Result<()> {
        self.after_call(call, started, deadline)
    }

    /// Marks the communicator as being aborted: every later use fails at once, as after
    /// [`Communicator::abort`], which must follow (it does the abort).
    pub fn begin_abort(&self) {
        self.aborting.store(true, Ordering::Release);
    }

    /// `ncclCommAbort`: stops every NCCL kernel of this communicator and frees it. Safe from any
    /// thread, idempotent; later uses fail with [`Communicator::aborted_error`].
    ///
    /// While a coalesced block's NCCL group holds the communicator ([`Communicator::open_block`])
    /// the abort is only marked (every later use fails at once) and done when the block closes:
    /// freeing a communicator an open group still holds would make the group's end use freed
    /// memory.
    pub fn abort(&self) {
        self.begin_abort();
        let mut h = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        if h.open_blocks > 0 {
            h.abort_pending = true;
            return;
        }
        self.abort_locked(&mut h);
    }

    fn abort_locked(&self, h: &mut Handle) {
        if h.aborted {
            return;
        }
        h.aborted = true;
        // SAFETY: the handle is live, locked, and never used again (aborted is set).
        let r = unsafe { result::comm_abort(self.lib, h.comm) };
        h.comm = std::ptr::null_mut();
        if let Err(e) = r {
            log::warn!("c10d-nccl: ncclCommAbort returned {}", result_name(e.code));
        }
    }

    /// Opens the calling thread's NCCL group for a coalesced block on this communicator (see
    /// [`Communicator::abort`]); [`Communicator::close_block`] closes it.
    ///
    /// # Errors
    /// An aborted communicator; NCCL's error.
    pub fn open_block(&self) -> Result<()> {
        let mut h = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        if h.aborted || h.abort_pending {
            return Err(self.aborted_error());
        }
        result::group_start(self.lib)?;
        h.open_blocks += 1;
        Ok(())
    }

    /// Closes the NCCL group [`Communicator::open_block`] opened (launching its operations),
    /// then does an abort asked for meanwhile.
    ///
    /// # Errors
    /// NCCL's error at the group's end.
    pub fn close_block(&self) -> std::result::Result<Progress, NcclError> {
        let mut h = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        let ended = result::group_end(self.lib);
        h.open_blocks = h.open_blocks.saturating_sub(1);
        if h.abort_pending && h.open_blocks == 0 {
            self.abort_locked(&mut h);
        }
        ended
    }

    /// The orderly end of a communicator (PyTorch's `shutdown()`): `ncclCommFinalize` flushes
    /// its queued operations, this waits until that is done (or `deadline`), then
    /// `ncclCommDestroy` frees it. Where that cannot be bounded (a blocking communicator, an
    /// NCCL without `ncclCommFinalize`) or fails or runs past `deadline`, the communicator is
    /// aborted instead. Idempotent; later uses fail with [`Communicator::aborted_error`].
    ///
    /// # Errors
    /// Why the orderly end failed (the communicator is aborted all the same).
    pub fn shutdown(&self, deadline: Instant) -> Result<()> {
        if !self.nonblocking || self.lib.comm_finalize().is_err() {
            self.abort();
            return Ok(());
        }
        let started = {
            let mut h = self.handle.lock().unwrap_or_else(|e| e.into_inner());
            if h.aborted || h.abort_pending || self.defer_to_open_block(&mut h) {
                return Ok(());
            }
            // SAFETY: the handle is live and locked.
            unsafe { result::comm_finalize(self.lib, h.comm) }?
        };
        self.after_call("ncclCommFinalize", started, deadline)?;
        let mut h = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        if h.aborted || self.defer_to_open_block(&mut h) {
            return Ok(());
        }
        h.aborted = true;
        h.destroyed = true;
        // SAFETY: the handle is live, finalized, locked, and never used again.
        let r = unsafe { result::comm_destroy(self.lib, h.comm) };
        h.comm = std::ptr::null_mut();
        r.map_err(DistError::from)
    }

    /// A coalesced block's NCCL group holds the communicator: it cannot be freed now; it is
    /// aborted when the block closes ([`Communicator::close_block`]). True when so deferred.
    fn defer_to_open_block(&self, h: &mut Handle) -> bool {
        if h.open_blocks == 0 {
            return false;
        }
        h.abort_pending = true;
        true
    }

    /// True once [`Communicator::shutdown`] ended it in order (every op it had queued was
    /// flushed), false while live or once aborted.
    pub fn was_shut_down(&self) -> bool {
        self.handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .destroyed
    }

    /// True once aborted (or shut down, or an abort is pending).
    pub fn is_aborted(&self) -> bool {
        let h = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        h.aborted || h.abort_pending
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
        let mut raw_config = effective(config).to_raw();
        let color = color.map_or(sys::NCCL_SPLIT_NOCOLOR, |c| c as c_int);
        let (child, started) = {
            let l = self.lock()?;
            // SAFETY: parent live and locked; the config is valid across the call.
            unsafe {
                result::comm_split(
                    self.lib,
                    l.raw(),
                    color,
                    key as c_int,
                    raw_config.as_mut_ptr(),
                )
            }?
        };
        self.finish_call("ncclCommSplit", started, deadline)?;
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
        let mut raw_config = effective(config).to_raw();
        let mut excl: Vec<c_int> = exclude.iter().map(|&r| r as c_int).collect();
        let flags = if abort_first {
            sys::NCCL_SHRINK_ABORT
        } else {
            sys::NCCL_SHRINK_DEFAULT
        };
        let (child, started) = {
            let l = self.lock()?;
            // SAFETY: parent live and locked; the exclusion list and config outlive the call.
            unsafe {
                result::comm_shrink(self.lib, l.raw(), &mut excl, raw_config.as_mut_ptr(), flags)
            }?
        };
        self.finish_call("ncclCommShrink", started, deadline)?;
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
        if let Err(e) = c.wait_ready(call, deadline) {
            // Half made: abort it (dropping it would try an orderly end).
            c.abort();
            return Err(e);
        }
        (c.rank, c.size) = c.rank_and_size()?;
        let (rank, size) = (c.rank, c.size);
        Ok(Some((c, rank, size)))
    }

    fn rank_and_size(&self) -> Result<(usize, usize)> {
        let l = self.lock()?;
        // SAFETY: live, locked handle.
        Ok(unsafe { result::comm_rank_and_size(self.lib, l.raw()) }?)
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
    /// Ends a communicator still live in order ([`Communicator::shutdown`], waiting at most
    /// [`DROP_FINALIZE_LIMIT`], then aborting). It is dropped once no op holds it any more: every
    /// op it ran has finished or been failed, and an op whose kernels may still run keeps it.
    fn drop(&mut self) {
        if let Err(e) = self.shutdown(Instant::now() + DROP_FINALIZE_LIMIT) {
            log::warn!("c10d-nccl: the orderly end of {self:?} failed, aborted instead: {e}");
        }
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
