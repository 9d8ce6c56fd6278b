//! The memory a collective works on: a [`Tensor`] handle, a [`TensorView`] over borrowed
//! memory, or memory the caller owns and lends for one blocking call — `&mut [T]` /
//! `&mut Vec<T>` (read and written in place), `&[T]` (read only), and with the `ndarray`
//! feature `ArrayViewMut` / `ArrayView` — for every element type ([`Element`]: f32, f64,
//! f16, bf16, i8, u8, i16, i32, i64, bool, complex).
//!
//! ```no_run
//! # use c10d_world as dist;
//! # use dist::ReduceOp;
//! # fn main() -> c10d_core::Result<()> {
//! let mut grads = vec![0.5f32; 1024];
//! dist::all_reduce(&mut grads).op(ReduceOp::Avg).run()?; // no copy, in place
//! let mine = [1i64, 2];
//! let mut all = vec![0i64; 2 * dist::get_world_size(None)? as usize];
//! dist::all_gather_into_tensor(&mut all, &mine[..]).run()?; // &[T] → &mut [T]
//! # Ok(()) }
//! ```
//!
//! Plain slices give a blocking call only: `.start()` does not exist for them, as the slice is
//! borrowed just for the call. For asynchronous use, make [`TensorView`]s in a
//! [`c10d_core::borrowed::scope`]; the compiler then keeps the memory borrowed until the scope
//! has waited for every op on it:
//!
//! ```no_run
//! # use c10d_world as dist;
//! # fn main() -> c10d_core::Result<()> {
//! let mut grads = vec![0.5f32; 1024];
//! c10d_core::borrowed::scope(|s| {
//!     let g = s.view_mut(&mut grads);
//!     let work = dist::all_reduce(&g).start()?;
//!     // ... compute while the all_reduce runs ...
//!     work.wait()
//! })?;
//! # Ok(()) }
//! ```
//!
//! ```compile_fail
//! # use c10d_world as dist;
//! # fn main() -> c10d_core::Result<()> {
//! let mut grads = vec![0.5f32; 1024];
//! c10d_core::borrowed::scope(|s| {
//!     let g = s.view_mut(&mut grads);
//!     let work = dist::all_reduce(&g).start()?;
//!     grads[0] = 1.0; // error: `grads` is borrowed by the scope while the op may write it
//!     work.wait()
//! })?;
//! # Ok(()) }
//! ```
//!
//! And a plain slice has no `.start()`:
//!
//! ```compile_fail
//! # use c10d_world as dist;
//! # fn main() -> c10d_core::Result<()> {
//! let mut grads = vec![0.5f32; 1024];
//! let work = dist::all_reduce(&mut grads).start()?; // error: the trait `SharedBuffer` is not implemented
//! # Ok(()) }
//! ```
//!
//! A collective on borrowed memory is refused inside a [`crate::World::coalescing_manager`]
//! block, which would launch it after the borrow ended.
//!
//! With the `nccl` feature, cudarc's device buffers join the same way: `&mut CudaSlice<T>` /
//! `CudaViewMut<T>` in place and `&CudaSlice<T>` / `CudaView<T>` read only, for one blocking
//! call ordered after the thread's declared stream, else the buffer's own stream (see
//! `c10d_nccl::caller_memory`; a blocking call on the GPU returns once that stream waits for
//! the collective, not the host):
//!
//! ```no_run
//! # use c10d_world as dist;
//! # fn f(stream: std::sync::Arc<c10d_nccl::cudarc::driver::CudaStream>) -> c10d_core::Result<()> {
//! let mut grads = stream.clone_htod(&vec![0.5f32; 1024]).unwrap(); // a CudaSlice<f32>
//! dist::all_reduce(&mut grads).op(dist::ReduceOp::Avg).run()?;
//! # Ok(()) }
//! ```
//!
//! Another framework's buffers can join by implementing [`Buffer`] (and [`BufferMut`]).

use c10d_core::borrowed::scope;
use c10d_core::{Element, Result, Tensor, TensorView};

/// Memory a collective reads (an input).
pub trait Buffer: Sized {
    /// True for memory lent for one call (a slice, an array view): the call must not outlive it.
    const BORROWED: bool;
    /// Runs `f` with a tensor over this memory. For borrowed memory the tensor is cut off from
    /// the memory before this returns (see [`c10d_core::borrowed`]).
    ///
    /// # Errors
    /// `f`'s error; a shape the memory cannot be viewed as (a non-contiguous array).
    fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R>;
}

/// Memory a collective may also write (an output, or in place).
pub trait BufferMut: Buffer {}

/// A tensor handle that outlives the call, so the op can run asynchronously.
pub trait SharedBuffer: BufferMut {
    /// The tensor.
    fn tensor(&self) -> &Tensor;
}

impl Buffer for &Tensor {
    const BORROWED: bool = false;
    fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
        f(self)
    }
}
impl BufferMut for &Tensor {}
impl SharedBuffer for &Tensor {
    fn tensor(&self) -> &Tensor {
        self
    }
}

impl Buffer for &TensorView<'_> {
    const BORROWED: bool = false;
    fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
        f(self)
    }
}
impl BufferMut for &TensorView<'_> {}
impl SharedBuffer for &TensorView<'_> {
    fn tensor(&self) -> &Tensor {
        self
    }
}

impl<T: Element> Buffer for &mut [T] {
    const BORROWED: bool = true;
    fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
        scope(|s| f(&s.view_mut(self)))
    }
}
impl<T: Element> BufferMut for &mut [T] {}

impl<T: Element> Buffer for &mut Vec<T> {
    const BORROWED: bool = true;
    fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
        self.as_mut_slice().with_tensor(f)
    }
}
impl<T: Element> BufferMut for &mut Vec<T> {}

impl<T: Element> Buffer for &[T] {
    const BORROWED: bool = true;
    fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
        scope(|s| f(&s.view(self)))
    }
}

/// Collectives on `ndarray` arrays (feature `ndarray`): views in standard (row-major,
/// contiguous) order keep their shape; any other layout is refused with an error.
#[cfg(feature = "ndarray")]
mod arrays {
    use super::{Buffer, BufferMut};
    use c10d_core::borrowed::scope;
    use c10d_core::{DistError, Element, Result, Tensor};
    use ndarray::{ArrayView, ArrayViewMut, Dimension};

    fn not_standard(shape: &[usize], strides: &[isize]) -> DistError {
        DistError::invalid(format!(
            "ndarray view of shape {shape:?} with strides {strides:?} is not contiguous in standard (row-major) order; \
             pass a standard-layout array (e.g. `.as_standard_layout()`)"
        ))
    }

    impl<T: Element, D: Dimension> Buffer for ArrayViewMut<'_, T, D> {
        const BORROWED: bool = true;
        fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
            let (shape, strides) = (self.shape().to_vec(), self.strides().to_vec());
            let data = self
                .into_slice()
                .ok_or_else(|| not_standard(&shape, &strides))?;
            scope(|s| f(&*s.view_mut_shaped(data, &shape)?))
        }
    }
    impl<T: Element, D: Dimension> BufferMut for ArrayViewMut<'_, T, D> {}

    impl<T: Element, D: Dimension> Buffer for ArrayView<'_, T, D> {
        const BORROWED: bool = true;
        fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
            let (shape, strides) = (self.shape().to_vec(), self.strides().to_vec());
            let data = self
                .to_slice()
                .ok_or_else(|| not_standard(&shape, &strides))?;
            scope(|s| f(&*s.view_shaped(data, &shape)?))
        }
    }
}

/// Collectives on cudarc device buffers (feature `nccl`): `&mut CudaSlice<T>` and
/// `CudaViewMut<T>` (in place), `&CudaSlice<T>` and `CudaView<T>` (read only), for one
/// blocking call on the thread's declared stream of the buffer's device, else the buffer's own
/// stream (`c10d_nccl::caller_memory`'s rules; asynchronous use goes through its `scope`).
#[cfg(feature = "nccl")]
mod cuda {
    use super::{Buffer, BufferMut};
    use c10d_core::{Result, Tensor};
    use c10d_nccl::caller_memory::{blocking_call_stream as stream_for, scope, NcclElement};
    use c10d_nccl::cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DeviceSlice};

    impl<T: NcclElement> Buffer for &mut CudaSlice<T> {
        const BORROWED: bool = true;
        fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
            let stream = stream_for(self.stream())?;
            scope(&stream, |s| f(&*s.view_mut(self)?))
        }
    }
    impl<T: NcclElement> BufferMut for &mut CudaSlice<T> {}

    impl<T: NcclElement> Buffer for CudaViewMut<'_, T> {
        const BORROWED: bool = true;
        fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
            let mut view = self;
            let stream = stream_for(view.stream())?;
            scope(&stream, |s| f(&*s.view_mut(&mut view)?))
        }
    }
    impl<T: NcclElement> BufferMut for CudaViewMut<'_, T> {}

    impl<T: NcclElement> Buffer for &CudaSlice<T> {
        const BORROWED: bool = true;
        fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
            let stream = stream_for(self.stream())?;
            scope(&stream, |s| f(&*s.view(self)?))
        }
    }

    impl<T: NcclElement> Buffer for CudaView<'_, T> {
        const BORROWED: bool = true;
        fn with_tensor<R>(self, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
            let view = self;
            let stream = stream_for(view.stream())?;
            scope(&stream, |s| f(&*s.view(&view)?))
        }
    }
}

/// Runs `f` over the tensors of an output and an input buffer.
///
/// # Errors
/// As [`Buffer::with_tensor`].
pub(crate) fn with_tensors<O: Buffer, I: Buffer, R>(
    output: O,
    input: I,
    f: impl FnOnce(&Tensor, &Tensor) -> Result<R>,
) -> Result<R> {
    output.with_tensor(|o| input.with_tensor(|i| f(o, i)))
}
