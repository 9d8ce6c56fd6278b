//! [`PyStore`]: any `torch.distributed.Store` (the prefixed store PyTorch hands a backend
//! creator: TCPStore, FileStore, HashStore, a Python subclass …) as a c10d-rs [`Store`].
//!
//! Every call takes the GIL for the duration of one Python method call; PyTorch's own stores
//! release it again while they block on the network, so an engine thread waiting for a key
//! never stalls the Python program.

use crate::errors::from_py;
use c10d_core::Result;
use c10d_store::Store;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use std::sync::Arc;
use std::time::Duration;

/// A Python store object seen as a c10d-rs store.
pub struct PyStore {
    obj: Py<PyAny>,
}

impl PyStore {
    /// Wraps the Python store `obj`.
    pub fn new(obj: Py<PyAny>) -> PyStore {
        PyStore { obj }
    }

    fn call<T>(
        &self,
        what: &str,
        f: impl for<'py> FnOnce(Python<'py>, &Bound<'py, PyAny>) -> PyResult<T>,
    ) -> Result<T> {
        Python::attach(|py| f(py, self.obj.bind(py)).map_err(|e| from_py(py, e, what)))
    }
}

fn bytes_of(v: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    Ok(v.cast::<PyBytes>()?.as_bytes().to_vec())
}

/// `datetime.timedelta(seconds=d)`.
pub fn timedelta<'py>(py: Python<'py>, d: Duration) -> PyResult<Bound<'py, PyAny>> {
    py.import("datetime")?
        .getattr("timedelta")?
        .call1((0, d.as_secs_f64().min(86_400.0 * 365.0)))
}

/// Seconds of a `datetime.timedelta`.
pub fn seconds_of(td: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let s: f64 = td.call_method0("total_seconds")?.extract()?;
    Ok(Duration::from_secs_f64(s.max(0.0)))
}

impl Store for PyStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call("store.set", |py, s| {
            s.call_method1("set", (key, PyBytes::new(py, value)))
                .map(drop)
        })
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.call("store.get", |_, s| {
            bytes_of(&s.call_method1("get", (key,))?)
        })
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.call("store.add", |_, s| {
            s.call_method1("add", (key, delta))?.extract()
        })
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.call("store.compare_set", |py, s| {
            let args = (key, PyBytes::new(py, expected), PyBytes::new(py, desired));
            bytes_of(&s.call_method1("compare_set", args)?)
        })
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.call("store.check", |py, s| {
            s.call_method1("check", (PyList::new(py, keys)?,))?
                .extract()
        })
    }
    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.call("store.wait", |py, s| {
            let args = (PyList::new(py, keys)?, timedelta(py, timeout)?);
            s.call_method1("wait", args).map(drop)
        })
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        self.call("store.delete_key", |_, s| {
            s.call_method1("delete_key", (key,))?.extract()
        })
    }
    fn num_keys(&self) -> Result<i64> {
        self.call("store.num_keys", |_, s| {
            s.call_method0("num_keys")?.extract()
        })
    }
    fn timeout(&self) -> Duration {
        self.call("store.timeout", |_, s| seconds_of(&s.getattr("timeout")?))
            .unwrap_or(c10d_core::DEFAULT_TIMEOUT)
    }
    fn set_timeout(&self, timeout: Duration) {
        let r = self.call("store.set_timeout", |py, s| {
            s.call_method1("set_timeout", (timedelta(py, timeout)?,))
                .map(drop)
        });
        if let Err(e) = r {
            log::warn!("{e}");
        }
    }
    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(PyStore {
            obj: Python::attach(|py| self.obj.clone_ref(py)),
        }))
    }
}

impl std::fmt::Debug for PyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PyStore")
    }
}
