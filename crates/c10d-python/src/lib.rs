//! # c10d-python
//!
//! The native half of the Python package `c10d_rs`: the c10d-rs CPU engine
//! ([`c10d_gloo::ProcessGroupGloo`]) behind a small Python API that the package's pure-Python
//! half (`python/c10d_rs/`) turns into a `torch.distributed` backend named `"c10drs"`, the
//! way PyTorch/XLA plugs in `ProcessGroupXla`.
//!
//! Nothing here links libtorch or includes its headers: tensors cross as
//! `(data_ptr, shape, dtype, tensor)` descriptors and are used in place (see [`tensor`]), the
//! store PyTorch hands the backend is called back through Python (see [`store`]), and errors
//! become `torch.distributed`'s exception classes by name (see [`errors`]).
//!
//! Layout: [`engine`] (one process group and its ops), [`work`] (works and completion
//! callbacks), [`store`], [`tensor`], [`errors`].

pub mod call;
pub mod engine;
pub mod errors;
pub mod store;
pub mod tensor;
pub mod work;

use pyo3::prelude::*;

/// The extension module `c10d_rs._engine`.
#[pymodule]
fn _engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::Engine>()?;
    m.add_class::<work::PyWork>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
