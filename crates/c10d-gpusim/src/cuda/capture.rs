//! Stream capture (`cuStreamBeginCapture` … `cuStreamEndCapture`) and the capture modes of
//! `cuThreadExchangeStreamCaptureMode`.
//!
//! What the CUDA documentation states, and what the simulator does:
//! - Work queued to a capturing stream is recorded into the graph, not executed
//!   (`cuStreamBeginCapture`: "the stream is placed in capture mode ... work is not enqueued").
//! - A stream that waits on an event recorded in a capturing stream joins that capture
//!   (cross-stream capture); the capture ends on the stream that began it
//!   (`CUDA_ERROR_STREAM_CAPTURE_UNMATCHED` elsewhere), which ends it for every joined stream.
//! - "Potentially unsafe API calls" (synchronisations, synchronous allocation, frees and
//!   copies) fail with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidate the captures that
//!   forbid them, under the rules of `CUstreamCaptureMode`: GLOBAL forbids them while this
//!   thread has a non-relaxed capture or another thread has a GLOBAL capture; THREAD_LOCAL
//!   only for this thread's own non-relaxed captures; RELAXED never. The invalidated capture's
//!   `cuStreamEndCapture` fails with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
//! - Synchronising a capturing stream is always refused (it has nothing it could wait for).
//! - Replaying a graph (`cuGraphLaunch`) runs the captured work again, in capture order (a valid
//!   order of the captured dependencies, since each node depends only on earlier host calls).

use crate::abi::{self, CuResult};
use crate::cuda::stream::{Stream, Work};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::thread::ThreadId;

/// A captured node: called at each launch of the graph (on the launching thread, in capture
/// order) to make the work that then runs on the stream (NCCL ops take their sequence numbers
/// here, so each replay is a new collective).
pub type Node = Arc<dyn Fn() -> Work + Send + Sync>;

/// One capture sequence.
pub struct Capture {
    origin: Weak<Stream>,
    mode: u32,
    thread: ThreadId,
    nodes: Mutex<Vec<Node>>,
    joined: Mutex<Vec<Weak<Stream>>>,
    invalidated: AtomicBool,
}

static ACTIVE: LazyLock<Mutex<Vec<Weak<Capture>>>> = LazyLock::new(Default::default);
/// The capture each capturing stream takes part in, by the stream's address.
static MEMBERS: LazyLock<Mutex<HashMap<usize, Arc<Capture>>>> = LazyLock::new(Default::default);

fn key(stream: &Stream) -> usize {
    stream as *const Stream as usize
}

thread_local! {
    static MODE: Cell<u32> = const { Cell::new(abi::CAPTURE_MODE_GLOBAL) };
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's mode, returns the previous one.
pub fn exchange_mode(mode: u32) -> Result<u32, CuResult> {
    if mode > abi::CAPTURE_MODE_RELAXED {
        return Err(abi::INVALID_VALUE);
    }
    Ok(MODE.with(|m| m.replace(mode)))
}

/// The capture `stream` takes part in.
pub fn of(stream: &Stream) -> Option<Arc<Capture>> {
    lock(&MEMBERS).get(&key(stream)).cloned()
}

/// `cuStreamBeginCapture` on `stream` in `mode`.
pub fn begin(stream: &Arc<Stream>, mode: u32) -> Result<(), CuResult> {
    if mode > abi::CAPTURE_MODE_RELAXED {
        return Err(abi::INVALID_VALUE);
    }
    let mut members = lock(&MEMBERS);
    if members.contains_key(&key(stream)) || crate::cuda::device::is_legacy(stream) {
        return Err(abi::CAPTURE_UNSUPPORTED);
    }
    let cap = Arc::new(Capture {
        origin: Arc::downgrade(stream),
        mode,
        thread: std::thread::current().id(),
        nodes: Mutex::new(Vec::new()),
        joined: Mutex::new(vec![Arc::downgrade(stream)]),
        invalidated: AtomicBool::new(false),
    });
    lock(&ACTIVE).push(Arc::downgrade(&cap));
    members.insert(key(stream), cap);
    Ok(())
}

/// `stream` joins `cap` (it waited on an event recorded in the capture).
pub fn join(stream: &Arc<Stream>, cap: &Arc<Capture>) {
    if let std::collections::hash_map::Entry::Vacant(e) = lock(&MEMBERS).entry(key(stream)) {
        e.insert(cap.clone());
        lock(&cap.joined).push(Arc::downgrade(stream));
    }
}

/// Records `node` into `cap`.
pub fn record(cap: &Capture, node: Node) {
    lock(&cap.nodes).push(node);
}

/// Marks `cap` invalidated: its end fails.
pub fn invalidate(cap: &Capture) {
    cap.invalidated.store(true, Ordering::Release);
}

/// `cuStreamEndCapture`: the captured nodes, ending the capture on every joined stream.
pub fn end(stream: &Arc<Stream>) -> Result<Vec<Node>, CuResult> {
    let cap = of(stream).ok_or(abi::CAPTURE_UNMATCHED)?;
    if !cap
        .origin
        .upgrade()
        .is_some_and(|o| Arc::ptr_eq(&o, stream))
    {
        invalidate(&cap);
        return Err(abi::CAPTURE_UNMATCHED);
    }
    for s in lock(&cap.joined).iter().filter_map(Weak::upgrade) {
        lock(&MEMBERS).remove(&key(&s));
    }
    lock(&ACTIVE).retain(|w| w.upgrade().is_some_and(|c| !Arc::ptr_eq(&c, &cap)));
    if cap.invalidated.load(Ordering::Acquire) {
        return Err(abi::CAPTURE_INVALIDATED);
    }
    let nodes = std::mem::take(&mut *lock(&cap.nodes));
    Ok(nodes)
}

/// The status `cuStreamIsCapturing` reports.
pub fn status(stream: &Stream) -> u32 {
    match of(stream) {
        None => abi::CAPTURE_STATUS_NONE,
        Some(c) if c.invalidated.load(Ordering::Acquire) => abi::CAPTURE_STATUS_INVALIDATED,
        Some(_) => abi::CAPTURE_STATUS_ACTIVE,
    }
}

/// Checks a "potentially unsafe" call (a synchronisation, a synchronous allocation, free or
/// copy) against the live captures and this thread's mode; refuses it and invalidates the
/// captures that forbid it.
pub fn check_unsafe_call() -> Result<(), CuResult> {
    let me = std::thread::current().id();
    let mode = MODE.with(Cell::get);
    let live: Vec<Arc<Capture>> = lock(&ACTIVE).iter().filter_map(Weak::upgrade).collect();
    let forbidding: Vec<&Arc<Capture>> = live
        .iter()
        .filter(|c| match mode {
            abi::CAPTURE_MODE_RELAXED => false,
            abi::CAPTURE_MODE_THREAD_LOCAL => c.thread == me && c.mode != abi::CAPTURE_MODE_RELAXED,
            _ => {
                (c.thread == me && c.mode != abi::CAPTURE_MODE_RELAXED)
                    || (c.thread != me && c.mode == abi::CAPTURE_MODE_GLOBAL)
            }
        })
        .collect();
    if forbidding.is_empty() {
        return Ok(());
    }
    forbidding.iter().for_each(|c| invalidate(c));
    Err(abi::CAPTURE_UNSUPPORTED)
}

/// Whether any blocking stream of device `d` is capturing (the legacy stream may not be used
/// then: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`); invalidates those captures.
pub fn blocking_capture_on(d: usize) -> bool {
    let mut found = false;
    for s in crate::cuda::device::streams_of(d) {
        if let Some(c) = of(&s).filter(|_| !s.non_blocking) {
            invalidate(&c);
            found = true;
        }
    }
    found
}
