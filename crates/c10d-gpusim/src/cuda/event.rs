//! Events: a record is an operation of its stream that marks the event's latest record
//! complete; a query or synchronisation looks at the latest record made before it
//! (`cuEventRecord`: "cuEventQuery / cuStreamWaitEvent ... use the most recent call");
//! `cuStreamWaitEvent` makes all later work of the stream wait for that record (an event
//! never recorded is complete). Under `C10D_SIM_DROP_STREAM_WAITS=1` the wait is dropped.

use crate::abi::{self, CuResult};
use crate::config;
use crate::cuda::capture::{self, Capture};
use crate::cuda::launch;
use crate::cuda::stream::Stream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

#[derive(Default)]
struct State {
    recorded: u64,
    completed: u64,
    at: Option<Instant>,
    captured: Option<Arc<Capture>>,
}

/// A simulated event.
#[derive(Default)]
pub struct Event {
    state: Mutex<State>,
    cv: Condvar,
}

impl Event {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `cuEventRecord` on `stream`.
    pub fn record(self: &Arc<Self>, stream: &Arc<Stream>) -> Result<(), CuResult> {
        if let Some(cap) = capture::of(stream) {
            self.lock().captured = Some(cap);
            return Ok(());
        }
        let gen = {
            let mut s = self.lock();
            s.recorded += 1;
            s.captured = None;
            s.recorded
        };
        let ev = self.clone();
        let (eid, sid) = (Arc::as_ptr(self) as usize, Arc::as_ptr(stream) as usize);
        config::trace(|| format!("record event {eid:#x} gen {gen} on stream {sid:#x}"));
        launch::enqueue_on(
            stream,
            launch::node(move || {
                config::trace(|| format!("event {eid:#x} gen {gen} reached"));
                ev.complete(gen)
            }),
        )
    }

    fn complete(&self, gen: u64) {
        let mut s = self.lock();
        if gen > s.completed {
            s.completed = gen;
            s.at = Some(Instant::now());
        }
        self.cv.notify_all();
    }

    /// `cuStreamWaitEvent`: `stream` waits for the latest record (joins its capture if the
    /// record was captured).
    pub fn wait_on(self: &Arc<Self>, stream: &Arc<Stream>) -> Result<(), CuResult> {
        if config::get().drop_stream_waits {
            return Ok(());
        }
        let (gen, cap) = {
            let s = self.lock();
            (s.recorded, s.captured.clone())
        };
        if let Some(cap) = cap {
            capture::join(stream, &cap);
            return Ok(());
        }
        if gen == 0 {
            return Ok(());
        }
        let ev = self.clone();
        let (eid, sid) = (Arc::as_ptr(self) as usize, Arc::as_ptr(stream) as usize);
        config::trace(|| format!("stream {sid:#x} waits event {eid:#x} gen {gen}"));
        launch::enqueue_on(stream, launch::node(move || ev.block_until(gen)))
    }

    fn block_until(&self, gen: u64) {
        let mut s = self.lock();
        while s.completed < gen {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// `cuEventQuery`.
    pub fn query(&self) -> CuResult {
        let s = self.lock();
        if s.captured.is_some() {
            abi::CAPTURED_EVENT
        } else if s.completed >= s.recorded {
            abi::SUCCESS
        } else {
            abi::NOT_READY
        }
    }

    /// `cuEventSynchronize`.
    pub fn synchronize(&self) -> CuResult {
        let gen = {
            let s = self.lock();
            if s.captured.is_some() {
                return abi::CAPTURED_EVENT;
            }
            s.recorded
        };
        self.block_until(gen);
        abi::SUCCESS
    }

    /// Milliseconds from `start`'s completion to this one's (`cuEventElapsedTime`).
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32, CuResult> {
        let (a, b) = (start.lock().at, self.lock().at);
        match (a, b) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3),
            _ => Err(abi::NOT_READY),
        }
    }
}
