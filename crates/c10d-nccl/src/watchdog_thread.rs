//! The thread that drives a group's [`Watchdog`]: it polls every in-flight op (about every
//! 100 µs while ops are in flight, parked otherwise), completes their `Work`s, and on a timeout
//! or an NCCL error does what `TORCH_NCCL_ASYNC_ERROR_HANDLING` says: abort the communicators
//! (so nothing stays stuck on the device) and/or end the process.
//!
//! Dropping the group's handle fails what is still in flight, stops the thread and waits (up to
//! [`JOIN_LIMIT`]) until it has left NCCL and CUDA: a process that exits right after dropping its
//! groups must not tear the libraries down under an abort still running here.

use crate::comm::Communicator;
use crate::inflight::InFlight;
use crate::watchdog::{PollReport, Watchdog, WorkRecord};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often in-flight ops are polled.
const POLL: Duration = Duration::from_micros(100);

/// How long dropping a group waits for its watchdog thread to finish (an `ncclCommAbort` it
/// runs can take a while).
pub(crate) const JOIN_LIMIT: Duration = Duration::from_secs(10);

struct Shared {
    dog: Mutex<Watchdog<InFlight>>,
    wake: Condvar,
    /// The communicators to abort on a failure (the group's, its coalesced ones included).
    comms: Mutex<Vec<Weak<Communicator>>>,
    /// Set when the group goes away: the thread leaves at its next turn.
    stop: std::sync::atomic::AtomicBool,
}

/// The handle a process group keeps; dropping it stops the thread (see the module docs).
pub(crate) struct WatchdogThread {
    shared: Arc<Shared>,
    /// Disconnected when the thread has returned.
    gone: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl WatchdogThread {
    /// Starts the thread for `dog`.
    pub fn start(dog: Watchdog<InFlight>) -> WatchdogThread {
        let shared = Arc::new(Shared {
            dog: Mutex::new(dog),
            wake: Condvar::new(),
            comms: Mutex::new(Vec::new()),
            stop: std::sync::atomic::AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&shared);
        let name = format!("c10d-nccl-watchdog-{}", shared.lock().label().group_name);
        let (alive, gone) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                run(weak);
                drop(alive);
            })
            .expect("spawning the NCCL watchdog thread");
        WatchdogThread {
            shared,
            gone: Mutex::new(gone),
        }
    }

    /// Hands an enqueued op to the watchdog.
    pub fn enqueue(&self, record: WorkRecord, op: InFlight) {
        let comm = Arc::downgrade(&op.comm);
        {
            let mut comms = self.shared.comms.lock().unwrap_or_else(|e| e.into_inner());
            if !comms.iter().any(|c| c.ptr_eq(&comm)) {
                comms.retain(|c| c.strong_count() > 0);
                comms.push(comm);
            }
        }
        self.shared.lock().enqueue(record, op);
        self.shared.wake.notify_one();
    }

    /// Fails every in-flight op now with `error` (after an explicit abort).
    pub fn fail_all(&self, error: &str) {
        let drained: Vec<_> = {
            let mut dog = self.shared.lock();
            let mut out = Vec::new();
            dog.drain(|r, op| out.push((r, op)));
            out
        };
        for (_, op) in drained {
            op.finish(Err(c10d_core::DistError::backend(error.to_string())));
        }
    }
}

impl Drop for WatchdogThread {
    fn drop(&mut self) {
        self.fail_all("the process group was destroyed while the op was in flight");
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::Release);
        self.shared.wake.notify_all();
        let gone = self.gone.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = gone.recv_timeout(JOIN_LIMIT) {
            log::warn!("c10d-nccl: a watchdog thread was still busy {JOIN_LIMIT:?} after its group was dropped");
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Watchdog<InFlight>> {
        self.dog.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn run(weak: Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else { return };
        if shared.stop.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let report = {
            let mut dog = shared.lock();
            if dog.in_flight() == 0 {
                // Parked until an op arrives; the timeout lets the thread see its group go.
                let (d, _) = shared
                    .wake
                    .wait_timeout(dog, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner());
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
        f.probe.finish(Ok(()));
    }
    // Waiters hear of the failure before the abort, which may wait for the device.
    let mut failed_comms = Vec::new();
    for f in report.timed_out.into_iter().chain(report.failed) {
        let e = f
            .error
            .unwrap_or_else(|| c10d_core::DistError::backend("failed"));
        failed_comms.push(f.probe.comm.clone());
        f.probe.finish(Err(e));
    }
    let Some(response) = report.response else {
        return;
    };
    let reason = report.first_error.clone().unwrap_or_default();
    log::error!("{reason}");
    if response.abort_communicators {
        let comms = shared
            .comms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        comms
            .iter()
            .filter_map(Weak::upgrade)
            .for_each(|c| c.abort());
        failed_comms.iter().for_each(|c| c.abort());
    }
    if response.tear_down_process {
        eprintln!(
            "{reason}\nTo avoid data inconsistency, we are taking the entire process down (TORCH_NCCL_ASYNC_ERROR_HANDLING={}).",
            shared.lock().mode().code()
        );
        std::process::abort();
    }
}
