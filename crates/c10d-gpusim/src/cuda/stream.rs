//! Streams: each executes its queue in order on a worker thread of its own, never inside the
//! call that queued the work (CUDA: "operations in a stream are executed in issue order"; the
//! host call returns before the work runs). Before each operation the worker sleeps the seeded
//! random delay of `C10D_SIM_DELAY_US`, so that a missing wait between streams shows as wrong
//! data rather than passing by luck.
//!
//! A blocking stream (created without `CU_STREAM_NON_BLOCKING`) and the legacy default stream
//! synchronise implicitly (CUDA Driver API, "Stream synchronization behavior": work on the
//! legacy stream waits for all prior work on blocking streams of its context, and work on a
//! blocking stream waits for prior legacy-stream work); non-blocking streams never do.

use crate::config;
use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};

/// One queued operation: run by the worker (again at each replay when captured in a graph).
pub type Work = Arc<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct Queue {
    items: VecDeque<Work>,
    submitted: u64,
    completed: u64,
    closed: bool,
}

/// A simulated stream.
pub struct Stream {
    /// The device it belongs to.
    pub device: usize,
    /// Created with `CU_STREAM_NON_BLOCKING`.
    pub non_blocking: bool,
    /// The priority given at creation.
    pub priority: i32,
    queue: Mutex<Queue>,
    cv: Condvar,
    rng: AtomicU64,
}

impl Stream {
    /// A new stream with its worker thread.
    pub fn new(device: usize, non_blocking: bool, priority: i32, salt: u64) -> Arc<Stream> {
        let s = Arc::new(Stream {
            device,
            non_blocking,
            priority,
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            rng: config::rng_state(salt),
        });
        let w = s.clone();
        std::thread::Builder::new()
            .name(format!("gpusim-stream-{device}-{salt}"))
            .spawn(move || worker(w))
            .expect("spawn a stream worker thread");
        s
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `work`; returns its position (1-based count of operations submitted).
    pub fn push(&self, work: Work) -> u64 {
        let mut q = self.lock();
        q.items.push_back(work);
        q.submitted += 1;
        self.cv.notify_all();
        q.submitted
    }

    /// Operations submitted so far.
    pub fn submitted(&self) -> u64 {
        self.lock().submitted
    }

    /// Whether the first `upto` operations have completed.
    pub fn reached(&self, upto: u64) -> bool {
        self.lock().completed >= upto
    }

    /// Blocks until the first `upto` operations have completed.
    pub fn wait_for(&self, upto: u64) {
        let mut q = self.lock();
        while q.completed < upto {
            q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks until everything submitted before the call has completed.
    pub fn synchronize(&self) {
        let upto = self.submitted();
        self.wait_for(upto);
    }

    /// Whether everything submitted has completed (`cuStreamQuery`).
    pub fn idle(&self) -> bool {
        let q = self.lock();
        q.completed == q.submitted
    }

    /// No more work: the worker ends once the queue is empty (`cuStreamDestroy` returns at
    /// once and the stream's resources go after its work completes).
    pub fn close(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
    }
}

fn next(stream: &Stream) -> Option<Work> {
    let mut q = stream.lock();
    loop {
        if let Some(w) = q.items.pop_front() {
            return Some(w);
        }
        if q.closed {
            return None;
        }
        q = stream.cv.wait(q).unwrap_or_else(|e| e.into_inner());
    }
}

fn worker(stream: Arc<Stream>) {
    while let Some(work) = next(&stream) {
        config::random_delay(&stream.rng);
        work();
        let mut q = stream.lock();
        q.completed += 1;
        stream.cv.notify_all();
    }
}
