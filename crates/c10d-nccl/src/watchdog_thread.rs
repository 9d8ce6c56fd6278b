//! The thread that drives a group's [`Watchdog`]: it polls every in-flight op (about every
//! 100 µs while ops are in flight, parked otherwise), completes their `Work`s, and on a timeout
//! or an NCCL error does what `TORCH_NCCL_ASYNC_ERROR_HANDLING` says: abort the communicators
//! (so nothing stays stuck on the device) and/or end the process. Each turn of its loop is a
//! heartbeat for the group's [`crate::heartbeat`] monitor; it queries events in the thread-local
//! capture mode ([`crate::capture`]).
//!
//! **Memory outlives the device work.** A failed op's `Work` fails at once, but its tensors and
//! leases stay with the op until its end event has fired (after an abort, NCCL's kernels leave
//! and the event fires; copies queued on the NCCL stream are not cancelled by an abort, so the
//! event, not the abort, is what says the memory is free). Failed ops wait in a retiring list
//! that every turn of the loop sweeps. An explicit abort ([`WatchdogHandle::abort_everything`])
//! fails the works, aborts the communicators and retires the ops.
//!
//! Dropping the group's handle fails what is still in flight, aborts the communicators of ops
//! still on the device (as PyTorch's destructor aborts a group not shut down), waits up to
//! [`RETIRE_LIMIT`] for their end events and then gives up their memory (leaked, with a
//! warning: never freed under work that may still run), stops the thread and waits (up to
//! [`JOIN_LIMIT`]) until it has left NCCL and CUDA: a process that exits right after dropping
//! its groups must not tear the libraries down under an abort still running here.

use crate::comm::Communicator;
use crate::heartbeat::HeartbeatConfig;
use crate::inflight::InFlight;
use crate::watchdog::{PollReport, Watchdog, WorkRecord};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often in-flight ops are polled.
const POLL: Duration = Duration::from_micros(100);

/// How often failed ops whose kernels may still run are looked at when nothing is in flight.
const RETIRE_POLL: Duration = Duration::from_millis(10);

/// How long dropping a group waits for the end events of aborted ops before leaking their
/// memory.
pub(crate) const RETIRE_LIMIT: Duration = Duration::from_secs(2);

/// How long dropping a group waits for its watchdog thread to finish (an `ncclCommAbort` it
/// runs can take a while).
pub(crate) const JOIN_LIMIT: Duration = Duration::from_secs(10);

struct Shared {
    dog: Mutex<Watchdog<InFlight>>,
    wake: Condvar,
    /// The thread sleeps on `wake` (read and written under `dog`'s lock): only then does an
    /// enqueue pay for the wake-up (a futex system call on every op otherwise).
    parked: AtomicBool,
    /// The communicators to abort on a failure (the group's, its coalesced ones included).
    comms: Mutex<Vec<Weak<Communicator>>>,
    /// Failed ops whose kernels may still run: their memory goes once they are done.
    retiring: Mutex<Vec<InFlight>>,
    /// Failed ops between their waiters hearing of it and their entry into `retiring` (so
    /// that a `shutdown()` right after a failed `wait` sees them).
    failing: AtomicUsize,
    /// Bumped on every turn of the loop (the heartbeat monitor watches it).
    beat: Arc<AtomicU64>,
    /// Set when the group goes away: the thread leaves at its next turn.
    stop: AtomicBool,
}

/// The handle a process group keeps; dropping it stops the thread (see the module docs).
pub(crate) struct WatchdogThread {
    shared: Arc<Shared>,
    /// Disconnected when the thread has returned.
    gone: Mutex<std::sync::mpsc::Receiver<()>>,
}

/// A handle that does not keep the watchdog alive (for `Work::abort`).
#[derive(Clone)]
pub(crate) struct WatchdogHandle(Weak<Shared>);

impl WatchdogThread {
    /// Starts the thread for `dog`, and its heartbeat monitor.
    pub fn start(dog: Watchdog<InFlight>, heartbeat: HeartbeatConfig) -> WatchdogThread {
        let group = dog.label().group_name.clone();
        let shared = Arc::new(Shared {
            dog: Mutex::new(dog),
            wake: Condvar::new(),
            parked: AtomicBool::new(false),
            comms: Mutex::new(Vec::new()),
            retiring: Mutex::new(Vec::new()),
            failing: AtomicUsize::new(0),
            beat: Arc::new(AtomicU64::new(0)),
            stop: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&shared);
        let (alive, gone) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name(format!("c10d-nccl-watchdog-{group}"))
            .spawn(move || {
                run(weak);
                drop(alive);
            })
            .expect("spawning the NCCL watchdog thread");
        crate::heartbeat::spawn_monitor(heartbeat, Arc::downgrade(&shared.beat), group);
        WatchdogThread {
            shared,
            gone: Mutex::new(gone),
        }
    }

    /// Hands an enqueued op to the watchdog.
    pub fn enqueue(&self, record: WorkRecord, op: InFlight) {
        let comm = Arc::downgrade(&op.comm);
        {
            let mut comms = lock(&self.shared.comms);
            if !comms.iter().any(|c| c.ptr_eq(&comm)) {
                comms.retain(|c| c.strong_count() > 0);
                comms.push(comm);
            }
        }
        let parked = {
            let mut dog = self.shared.lock();
            dog.enqueue(record, op);
            self.shared.parked.load(Ordering::Relaxed)
        };
        if parked {
            self.shared.wake.notify_one();
        }
    }

    /// Takes an op whose work already failed: its memory goes when its end event fires.
    pub fn retire(&self, op: InFlight) {
        lock(&self.shared.retiring).push(op);
    }

    /// Whether a failed op of the group may still have kernels running (see `shutdown_all`).
    pub fn has_running_failures(&self) -> bool {
        self.shared.has_running_failures()
    }

    /// A handle for `Work::abort`.
    pub fn handle(&self) -> WatchdogHandle {
        WatchdogHandle(Arc::downgrade(&self.shared))
    }

    /// Fails every in-flight op with `error`, aborts the communicators, and retires the ops
    /// (their memory goes when their end events fire) (`abort()`).
    pub fn abort_everything(&self, error: &str) {
        self.shared.abort_everything(error);
    }

    /// After a shutdown: ops whose communicator was ended in order and whose end event fired
    /// complete normally (their results are whole); the others fail with `error` and retire.
    pub fn finish_everything(&self, error: &str) {
        let whole = |op: &InFlight| op.comm.was_shut_down() && op.kernels_done();
        let (done, mut failed): (Vec<InFlight>, Vec<InFlight>) =
            self.shared.drain().into_iter().partition(whole);
        done.into_iter().for_each(InFlight::finish);
        fail(&mut failed, error);
        lock(&self.shared.retiring).extend(failed);
    }

    /// The group is ending on purpose: failures from now on call for no response (see
    /// [`Watchdog::set_ending`]).
    pub fn set_ending(&self) {
        self.shared.lock().set_ending();
    }
}

impl WatchdogHandle {
    /// As [`WatchdogThread::abort_everything`]; nothing once the group is gone.
    pub fn abort_everything(&self, error: &str) {
        if let Some(s) = self.0.upgrade() {
            s.abort_everything(error);
        }
    }
}

impl Drop for WatchdogThread {
    fn drop(&mut self) {
        self.shared
            .fail_and_release("the process group was destroyed while the op was in flight");
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        let gone = lock(&self.gone);
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = gone.recv_timeout(JOIN_LIMIT) {
            log::warn!("c10d-nccl: a watchdog thread was still busy {JOIN_LIMIT:?} after its group was dropped");
        }
    }
}

impl Drop for Shared {
    /// Whatever the thread still held when the group went (a poll report's failed ops, ops of
    /// a thread that outlived [`JOIN_LIMIT`]): released if done, else leaked, never freed under
    /// work that may still run.
    fn drop(&mut self) {
        let mut ops = self.drain();
        ops.append(&mut lock(&self.retiring));
        release_or_leak(ops, Duration::ZERO, "when their group's watchdog ended");
    }
}

/// Fails the works of `ops` with `error` (their memory stays with them).
fn fail(ops: &mut [InFlight], error: &str) {
    for op in ops {
        op.complete(Err(c10d_core::DistError::backend(error.to_string())));
    }
}

/// Releases the ops whose end event has fired, waiting up to `wait` for the others; those still
/// on the device then are leaked, with a warning, never freed under work that may still run.
fn release_or_leak(mut ops: Vec<InFlight>, wait: Duration, what: &str) {
    let deadline = Instant::now() + wait;
    loop {
        ops.retain(|op| !op.kernels_done());
        if ops.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if !ops.is_empty() {
        log::warn!(
            "c10d-nccl: {} op(s) {what} were still on the device after {wait:?}; their device memory is leaked rather than freed under them",
            ops.len()
        );
        ops.into_iter().for_each(std::mem::forget);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Watchdog<InFlight>> {
        lock(&self.dog)
    }

    /// Every in-flight op, its work failed with `error`; the retiring ones too.
    /// Every in-flight op, taken from the watchdog.
    fn drain(&self) -> Vec<InFlight> {
        let mut out = Vec::new();
        self.lock().drain(|_, op| out.push(op));
        out
    }

    fn abort_everything(&self, error: &str) {
        self.lock().set_ending();
        let mut ops = self.drain();
        fail(&mut ops, error);
        self.abort_comms();
        lock(&self.retiring).extend(ops);
    }

    /// Fails what is in flight; ops still on the device have their communicator aborted, get
    /// [`RETIRE_LIMIT`] to leave it, and are leaked if they have not.
    fn fail_and_release(&self, error: &str) {
        self.lock().set_ending();
        let mut ops = self.drain();
        fail(&mut ops, error);
        ops.append(&mut lock(&self.retiring));
        for op in ops.iter().filter(|op| !op.kernels_done()) {
            op.comm.abort();
        }
        release_or_leak(ops, RETIRE_LIMIT, "of a dropped group, after the abort");
    }

    /// Runs `f` on every live communicator of the group (outside the list's lock).
    fn each_comm(&self, f: impl Fn(&Communicator)) {
        let comms = lock(&self.comms).clone();
        comms.iter().filter_map(Weak::upgrade).for_each(|c| f(&c));
    }

    fn abort_comms(&self) {
        self.each_comm(Communicator::abort);
    }

    /// Whether a failed op's kernels may still run (its end event has not fired): an orderly
    /// `ncclCommFinalize` would wait for them, for ever if a peer is stuck or gone.
    fn has_running_failures(&self) -> bool {
        self.failing.load(Ordering::Acquire) > 0
            || lock(&self.retiring).iter().any(|op| !op.kernels_done())
    }

    /// Releases the retiring ops whose kernels are done; true while some remain.
    fn sweep_retiring(&self) -> bool {
        let mut r = lock(&self.retiring);
        let done: Vec<InFlight> = {
            let (done, running) = r.drain(..).partition(|op| op.kernels_done());
            *r = running;
            done
        };
        let remaining = !r.is_empty();
        drop(r);
        drop(done);
        remaining
    }
}

fn run(weak: Weak<Shared>) {
    let mut relaxed = false;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        shared.beat.fetch_add(1, Ordering::Relaxed);
        let busy = shared.lock().in_flight() > 0 || !lock(&shared.retiring).is_empty();
        if busy && !relaxed {
            // Ops exist: CUDA is there. This thread's event queries must not disturb another
            // thread's CUDA graph capture.
            relaxed = true;
            if let Err(e) = crate::capture::relax_capture_mode_for_this_thread() {
                log::warn!("c10d-nccl: {e}");
            }
        }
        let retiring = shared.sweep_retiring();
        let report = {
            let mut dog = shared.lock();
            if dog.in_flight() == 0 {
                // Parked until an op arrives; the timeout lets the thread see its group go.
                let park = if retiring {
                    RETIRE_POLL
                } else {
                    Duration::from_millis(50)
                };
                shared.parked.store(true, Ordering::Relaxed);
                let (d, _) = shared
                    .wake
                    .wait_timeout(dog, park)
                    .unwrap_or_else(|e| e.into_inner());
                shared.parked.store(false, Ordering::Relaxed);
                drop(d);
                continue;
            }
            dog.poll(Instant::now())
        };
        handle(&shared, report);
        drop(shared);
        std::thread::sleep(POLL);
    }
}

fn handle(shared: &Shared, report: PollReport<InFlight>) {
    for f in report.completed {
        f.probe.finish();
    }
    // Waiters hear of the failure before the abort, which may wait for the device; the ops'
    // memory stays until their kernels are done. When the process is to be torn down they
    // never hear of it: a waiter woken first could go on past the failure (with the data
    // inconsistency the tear-down exists to prevent) while the communicators are aborted.
    let (abort, tear_down) = report.response.as_ref().map_or((false, false), |r| {
        (r.abort_communicators, r.tear_down_process)
    });
    let failures: Vec<_> = report.timed_out.into_iter().chain(report.failed).collect();
    if abort {
        // A waiter that wakes must find the communicators refusing new ops already; the
        // aborts themselves come after.
        shared.each_comm(Communicator::begin_abort);
        failures.iter().for_each(|f| f.probe.comm.begin_abort());
    }
    let counted = failures.len();
    shared.failing.fetch_add(counted, Ordering::AcqRel);
    let mut failed = Vec::new();
    for mut f in failures {
        let e = f
            .error
            .unwrap_or_else(|| c10d_core::DistError::backend("failed"));
        if !tear_down {
            f.probe.complete(Err(e));
        }
        failed.push(f.probe);
    }
    if let Some(response) = report.response {
        let reason = report.first_error.clone().unwrap_or_default();
        log::error!("{reason}");
        if response.abort_communicators {
            shared.abort_comms();
            failed.iter().for_each(|op| op.comm.abort());
        }
        if response.tear_down_process {
            // One write, so that the last words are not interleaved with what another part of
            // the process (a CUDA or NCCL library with its own stderr lock) prints meanwhile.
            let last_words = format!(
                "{reason}\nTo avoid data inconsistency, we are taking the entire process down (TORCH_NCCL_ASYNC_ERROR_HANDLING={}).\n",
                shared.lock().mode().code()
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), last_words.as_bytes());
            std::process::abort();
        }
    }
    lock(&shared.retiring).extend(failed);
    shared.failing.fetch_sub(counted, Ordering::AcqRel);
}
