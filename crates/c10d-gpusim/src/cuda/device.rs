//! Devices, their primary contexts and the calling thread's current context; the special
//! streams (legacy default, per-thread default) and every stream's registration; the sticky
//! error of a context.

use crate::abi::{self, CuResult};
use crate::config;
use crate::cuda::stream::Stream;
use crate::registry::Registry;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

static INITIALIZED: AtomicBool = AtomicBool::new(false);
static STREAM_SALT: AtomicU64 = AtomicU64::new(1);

/// Every user-created stream, by handle.
pub static STREAMS: LazyLock<Registry<Stream>> = LazyLock::new(|| Registry::new(0x5000_0000));

struct DeviceState {
    legacy: Arc<Stream>,
    streams: Mutex<Vec<Weak<Stream>>>,
    sticky: AtomicU32,
}

static DEVICES: LazyLock<Vec<DeviceState>> = LazyLock::new(|| {
    (0..config::get().gpus)
        .map(|d| DeviceState {
            legacy: Stream::new(d, false, 0, next_salt()),
            streams: Mutex::new(Vec::new()),
            sticky: AtomicU32::new(0),
        })
        .collect()
});

thread_local! {
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
    static PER_THREAD: RefCell<HashMap<usize, Arc<Stream>>> = RefCell::new(HashMap::new());
}

fn next_salt() -> u64 {
    STREAM_SALT.fetch_add(1, Ordering::Relaxed)
}

/// `cuInit`.
pub fn init() {
    INITIALIZED.store(true, Ordering::Release);
}

/// `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`.
pub fn check_init() -> Result<(), CuResult> {
    if INITIALIZED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(abi::NOT_INITIALIZED)
    }
}

/// Number of simulated devices.
pub fn count() -> usize {
    config::get().gpus
}

/// The handle of device `d`'s primary context.
pub fn context_handle(d: usize) -> usize {
    0x2000_0000 + 0x100 * d
}

/// The device of a context handle.
pub fn device_of_context(ctx: usize) -> Option<usize> {
    let d = ctx.checked_sub(0x2000_0000)? / 0x100;
    (ctx == context_handle(d) && d < count()).then_some(d)
}

/// Makes device `d`'s context current on this thread (`None`: no context).
pub fn set_current(d: Option<usize>) {
    CURRENT.with(|c| c.set(d));
}

/// The device of this thread's current context.
pub fn current() -> Result<usize, CuResult> {
    check_init()?;
    CURRENT.with(|c| c.get()).ok_or(abi::INVALID_CONTEXT)
}

/// The current context's sticky error, if one happened (every later call returns it).
pub fn sticky(d: usize) -> Result<(), CuResult> {
    match DEVICES[d].sticky.load(Ordering::Acquire) {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Records a sticky error on device `d` (an illegal address in a queued operation), with a
/// line on stderr saying what happened.
pub fn fail(d: usize, code: CuResult, what: &str) {
    eprintln!("{what}");
    let _ = DEVICES[d]
        .sticky
        .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
}

/// A new user stream on the current device.
pub fn new_stream(flags: u32, priority: i32) -> Result<usize, CuResult> {
    let d = current()?;
    let s = Stream::new(
        d,
        flags & abi::STREAM_NON_BLOCKING != 0,
        priority,
        next_salt(),
    );
    lock(&DEVICES[d].streams).push(Arc::downgrade(&s));
    Ok(STREAMS.insert(s))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The stream behind a handle: 0 and `CU_STREAM_LEGACY` are the current device's legacy
/// default stream, `CU_STREAM_PER_THREAD` this thread's default stream of the device.
pub fn stream(handle: usize) -> Result<Arc<Stream>, CuResult> {
    match handle {
        0 | abi::STREAM_LEGACY => Ok(DEVICES[current()?].legacy.clone()),
        abi::STREAM_PER_THREAD => {
            let d = current()?;
            Ok(PER_THREAD.with(|m| {
                m.borrow_mut()
                    .entry(d)
                    .or_insert_with(|| {
                        let s = Stream::new(d, false, 0, next_salt());
                        lock(&DEVICES[d].streams).push(Arc::downgrade(&s));
                        s
                    })
                    .clone()
            }))
        }
        h => STREAMS.get(h).ok_or(abi::INVALID_HANDLE),
    }
}

/// Whether `s` is its device's legacy default stream.
pub fn is_legacy(s: &Arc<Stream>) -> bool {
    Arc::ptr_eq(&DEVICES[s.device].legacy, s)
}

/// The legacy default stream of device `d`.
pub fn legacy(d: usize) -> Arc<Stream> {
    DEVICES[d].legacy.clone()
}

/// Every live stream of device `d`, the legacy one included.
pub fn streams_of(d: usize) -> Vec<Arc<Stream>> {
    let mut v: Vec<Arc<Stream>> = lock(&DEVICES[d].streams)
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    v.push(DEVICES[d].legacy.clone());
    v
}

/// `cuCtxSynchronize`: waits for everything submitted to any stream of device `d`.
pub fn synchronize(d: usize) {
    for s in streams_of(d) {
        s.synchronize();
    }
}
