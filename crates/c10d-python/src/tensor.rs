//! `torch.Tensor` → c10d-rs [`Tensor`] without copying.
//!
//! The Python side describes each (contiguous, CPU) tensor as a tuple
//! `(data_ptr, shape, dtype_name, tensor)`. The engine wraps the bytes in place and keeps a
//! reference to the `torch.Tensor` itself as the storage's owner, so the memory stays alive
//! until the collective that uses it has finished, even if Python drops its last reference.

use c10d_core::{DType, Tensor};
use pyo3::prelude::*;

/// One tensor as the Python side passes it: `(data_ptr, shape, dtype_name, tensor)`.
#[derive(FromPyObject)]
pub struct TensorArg(usize, Vec<usize>, String, Py<PyAny>);

impl TensorArg {
    /// The c10d-rs view of this tensor's memory.
    ///
    /// # Errors
    /// `ValueError` for a dtype the engine does not have (uint16/32/64, float8 …).
    pub fn into_tensor(self) -> PyResult<Tensor> {
        let TensorArg(ptr, shape, dtype, owner) = self;
        let dtype = DType::parse(&dtype).map_err(|_| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "c10drs does not support tensors of dtype torch.{dtype}"
            ))
        })?;
        // SAFETY: `ptr` is `tensor.data_ptr()` of the contiguous CPU tensor `owner` with this
        // shape and dtype (checked by the Python side), so it addresses numel × itemsize bytes.
        // `owner` keeps that tensor, hence its storage, alive as long as the c10d tensor lives.
        // torch.distributed's contract (as with every backend) is that the caller does not
        // touch a tensor while a collective on it is in flight.
        let t = unsafe { Tensor::from_raw_host(ptr as *mut u8, dtype, &shape, Box::new(owner)) };
        crate::errors::py_result(t)
    }
}

/// Converts a list of descriptors.
pub fn tensors(args: Vec<TensorArg>) -> PyResult<Vec<Tensor>> {
    args.into_iter().map(TensorArg::into_tensor).collect()
}

/// Converts a list of lists of descriptors.
pub fn tensor_lists(args: Vec<Vec<TensorArg>>) -> PyResult<Vec<Vec<Tensor>>> {
    args.into_iter().map(tensors).collect()
}
