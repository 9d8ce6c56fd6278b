//! [`PyWork`]: a c10d-rs [`Work`] seen from Python, and completion callbacks that never run
//! Python code on an engine thread.
//!
//! `wait` releases the GIL while it blocks, so other Python threads run during a collective.
//! `add_done_callback` registers a waker on the work (the `Future` side of [`Work`]); when the
//! engine completes the work, the waker only queues the callback, and one dispatcher thread per
//! process takes the GIL and runs it (that is how `Work.get_future()` gets its value).

use crate::errors::{py_result, to_py};
use c10d_core::Work;
use pyo3::prelude::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

/// The handle of one operation launched on the engine (wrapped by `c10d_rs.Work` in Python).
#[pyclass(frozen, module = "c10d_rs._engine")]
pub struct PyWork {
    work: Work,
}

impl PyWork {
    /// Wraps a launched work.
    pub fn new(work: Work) -> PyWork {
        PyWork { work }
    }
}

#[pymethods]
impl PyWork {
    /// Blocks (GIL released) until the operation completed; `timeout` in seconds (None: the
    /// op's own deadline). Returns True; raises the operation's error (a `DistBackendError` …)
    /// or, when `timeout` passes first, a `DistBackendError` saying so.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let w = self.work.clone();
        let r = py.detach(move || match timeout {
            Some(s) if s > 0.0 => w.wait_timeout(Duration::from_secs_f64(s)),
            _ => w.wait(),
        });
        py_result(r).map(|()| true)
    }
    /// True once the operation finished, successfully or not.
    fn is_completed(&self) -> bool {
        self.work.is_completed()
    }
    /// True when the operation finished without error.
    fn is_success(&self) -> bool {
        self.work.is_success()
    }
    /// The error of a failed operation as a Python exception object, else None.
    fn exception(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.work
            .exception()
            .map(|e| to_py(e).into_value(py).into_any())
    }
    /// The sender's rank of a finished recv-from-any-source, else None.
    fn source_rank(&self) -> Option<usize> {
        self.work.source_rank()
    }
    /// The operation's sequence number in its group.
    fn sequence_number(&self) -> u64 {
        self.work.sequence_number()
    }
    /// The operation's name (PyTorch's `OpType`, e.g. "ALLREDUCE").
    fn op_type(&self) -> String {
        self.work.op_type().to_string()
    }
    /// Calls `callback()` (no arguments) once the operation finished: on the process's
    /// dispatcher thread with the GIL held, or at once on this thread when it already has
    /// finished and `defer` is false.
    #[pyo3(signature = (callback, defer=false))]
    fn add_done_callback(&self, py: Python<'_>, callback: Py<PyAny>, defer: bool) -> PyResult<()> {
        let slot = Arc::new(Callback(Mutex::new(Some(callback))));
        let waker = Waker::from(slot.clone());
        let mut cx = Context::from_waker(&waker);
        let mut w = self.work.clone();
        if Pin::new(&mut w).poll(&mut cx).is_ready() {
            if defer {
                slot.wake();
            } else if let Some(cb) = slot.take() {
                cb.call0(py)?;
            }
        }
        Ok(())
    }
}

/// A callback waiting for its work; taken exactly once.
struct Callback(Mutex<Option<Py<PyAny>>>);

impl Callback {
    fn take(&self) -> Option<Py<PyAny>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl Wake for Callback {
    fn wake(self: Arc<Self>) {
        if let Some(cb) = self.take() {
            // Sending never blocks; the engine thread goes straight back to its work.
            match dispatcher() {
                Some(tx) => {
                    let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(cb);
                }
                None => log::error!("c10drs: no callback thread; a Work's future stays pending"),
            }
        }
    }
}

/// The sender of the process's callback dispatcher thread (started on first use; None when the
/// thread could not be started).
fn dispatcher() -> Option<&'static Mutex<Sender<Py<PyAny>>>> {
    static TX: OnceLock<Option<Mutex<Sender<Py<PyAny>>>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = channel::<Py<PyAny>>();
        std::thread::Builder::new()
            .name("c10drs-callbacks".into())
            .spawn(move || {
                for cb in rx {
                    Python::attach(|py| {
                        if let Err(e) = cb.call0(py) {
                            e.write_unraisable(py, None);
                        }
                    });
                }
            })
            .ok()?;
        Some(Mutex::new(tx))
    })
    .as_ref()
}
