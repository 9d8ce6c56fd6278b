//! c10d-rs errors as PyTorch's Python exceptions.
//!
//! [`DistError`]'s kinds map one to one onto `torch.distributed`'s classes: `Backend` →
//! `DistBackendError`, `Network` → `DistNetworkError`, `Store` → `DistStoreError`,
//! `QueueEmpty` → `QueueEmptyError`, `Dist` → `DistError`, and `InvalidArgument` and
//! `Unsupported` → `RuntimeError`: PyTorch raises a backend's argument errors
//! (`ProcessGroupGloo::broadcast: invalid root rank: 4`, `Cannot use ReduceOp.BAND with
//! non-integral dtype`) as `RuntimeError`; its Python layer's own `ValueError`s come before a
//! backend is called. The message is ours (rank, group, op, sequence number, peer).

use c10d_core::{DistError, ErrorKind};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The Python exception for `e` (a `torch.distributed` class where PyTorch has one).
pub fn to_py(e: DistError) -> PyErr {
    let class = match e.kind() {
        ErrorKind::InvalidArgument | ErrorKind::Unsupported => {
            return PyRuntimeError::new_err(e.to_string())
        }
        ErrorKind::Backend => "DistBackendError",
        ErrorKind::Network => "DistNetworkError",
        ErrorKind::Store => "DistStoreError",
        ErrorKind::QueueEmpty => "QueueEmptyError",
        ErrorKind::Dist => "DistError",
    };
    Python::attach(|py| match torch_exception(py, class) {
        Ok(cls) => PyErr::from_type(cls, e.to_string()),
        Err(_) => PyRuntimeError::new_err(e.to_string()),
    })
}

fn torch_exception<'py>(py: Python<'py>, class: &str) -> PyResult<Bound<'py, pyo3::types::PyType>> {
    let cls = py.import("torch.distributed")?.getattr(class)?;
    Ok(cls.cast_into::<pyo3::types::PyType>()?)
}

/// `PyResult` from a c10d-rs `Result`.
pub fn py_result<T>(r: c10d_core::Result<T>) -> PyResult<T> {
    r.map_err(to_py)
}

/// A Python exception raised by a store or callback, as a [`DistError`] of `kind`'s class
/// (a Python `DistStoreError` keeps its kind; its text is kept).
pub fn from_py(py: Python<'_>, e: PyErr, what: &str) -> DistError {
    let text = e.value(py).to_string();
    let class = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    let msg = format!("{what}: {class}: {text}");
    match class.as_str() {
        "DistNetworkError" => DistError::network(msg),
        "QueueEmptyError" => DistError::queue_empty(msg),
        "ValueError" => DistError::invalid(msg),
        _ => DistError::store(msg),
    }
}
