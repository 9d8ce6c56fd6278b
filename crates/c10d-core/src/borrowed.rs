//! Tensors over memory the caller owns (`&mut [T]`, `&[T]`), with no copy, whose borrow the
//! compiler checks — also while an asynchronous collective uses them.
//!
//! [`scope`] works like [`std::thread::scope`]: inside it, [`BorrowScope::view_mut`] and
//! [`BorrowScope::view`] turn slices into [`TensorView`]s (usable wherever a [`Tensor`] is,
//! through `Deref`), and the slices stay borrowed until the scope ends. When it ends — by
//! returning or by a panic — the scope waits until no collective holds any of its views (an
//! op still in flight finishes, or fails at its timeout) and then cuts every view off from
//! the memory: a handle cloned out of the scope (a [`Tensor`], a `Work`'s result) afterwards
//! fails with "tensor viewed borrowed memory that has been given back to its owner" instead of
//! touching memory it no longer may. Nothing a caller can do in safe code (leaking a view with
//! `std::mem::forget` included) lets the engine touch the memory after the scope.
//!
//! A view over `&[T]` is read-only: a collective that would write it (as an output or in
//! place) fails with "tensor views memory borrowed as `&[T]` (read-only) ...". A `bool` view's
//! bytes are made 0 or 1 before the memory is given back (a peer may send any byte).
//!
//! The buffer cannot be touched while the scope borrows it:
//!
//! ```compile_fail
//! let mut grads = vec![1.0f32; 4];
//! c10d_core::borrowed::scope(|s| {
//!     let view = s.view_mut(&mut grads);
//!     grads[0] = 2.0; // error[E0499]: `grads` is still borrowed by the scope
//!     drop(view);
//! });
//! ```

use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::Tensor;
use std::marker::PhantomData;
use std::sync::Mutex;

/// The borrow scope given to the closure of [`scope`]; `'scope` is how long its views (and
/// the slices they borrow) live, `'env` what they may borrow from.
pub struct BorrowScope<'scope, 'env: 'scope> {
    /// Every view made in this scope, cut off from its memory when the scope ends.
    views: Mutex<Vec<Tensor>>,
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

/// A tensor over a borrowed slice, valid for the [`BorrowScope`] that made it. Derefs to
/// [`Tensor`] (shape, dtype, reads, collectives). Cloning the inner [`Tensor`] is allowed: the
/// clone stops working when the scope ends.
#[derive(Debug, Clone)]
pub struct TensorView<'scope> {
    tensor: Tensor,
    borrow: PhantomData<&'scope ()>,
}

impl std::ops::Deref for TensorView<'_> {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.tensor
    }
}

impl<'scope> TensorView<'scope> {
    /// A view over a tensor whose memory is borrowed for `'scope` by a scope this crate does
    /// not know: device memory lent by another crate's scope (`c10d_nccl::caller_memory`
    /// lends cudarc's `CudaSlice` / `CudaView` this way). That scope must end as [`scope`]
    /// does: [`Tensor::revoke`] on the tensor before `'scope` ends.
    ///
    /// # Safety
    /// The tensor's memory must stay valid, and unused by anything other than the tensor's
    /// handles, until [`Tensor::revoke`] has returned on it, and that must happen before
    /// `'scope` ends.
    pub unsafe fn new_unchecked(tensor: Tensor) -> TensorView<'scope> {
        TensorView {
            tensor,
            borrow: PhantomData,
        }
    }
}

impl AsRef<Tensor> for TensorView<'_> {
    fn as_ref(&self) -> &Tensor {
        &self.tensor
    }
}

/// Runs `f` with a [`BorrowScope`]; when `f` returns or panics, waits until no collective
/// holds a view made in the scope and gives the borrowed memory back (see the module docs),
/// then returns `f`'s result (or resumes its panic).
///
/// The wait is bounded by the timeouts of the collectives still in flight: a backend releases
/// its leases when an op completes, fails or times out. It has no timeout of its own, as
/// giving the memory back while a lease is held would let the engine touch it afterwards: a
/// lease that is never released (a [`crate::TensorLeases`] leaked with `std::mem::forget`)
/// makes the scope wait for ever — a hang, never a use of the memory after the borrow.
pub fn scope<'env, F, R>(f: F) -> R
where
    F: for<'scope> FnOnce(&'scope BorrowScope<'scope, 'env>) -> R,
{
    let s = BorrowScope {
        views: Mutex::new(Vec::new()),
        scope: PhantomData,
        env: PhantomData,
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&s)));
    let views = std::mem::take(&mut *s.views.lock().unwrap_or_else(|e| e.into_inner()));
    views.iter().for_each(Tensor::revoke);
    match result {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

impl<'scope> BorrowScope<'scope, '_> {
    fn register(&'scope self, tensor: Tensor) -> TensorView<'scope> {
        let mut views = self.views.lock().unwrap_or_else(|e| e.into_inner());
        views.push(tensor.clone());
        TensorView {
            tensor,
            borrow: PhantomData,
        }
    }

    /// A 1-D tensor over `data`, read and written in place by collectives.
    pub fn view_mut<T: Element>(&'scope self, data: &'scope mut [T]) -> TensorView<'scope> {
        let n = data.len();
        self.view_mut_shaped(data, &[n])
            .expect("a 1-D shape holds every slice")
    }

    /// A tensor of the given shape over `data` (row-major).
    ///
    /// # Errors
    /// [`crate::DistError::InvalidArgument`] when `shape` does not hold `data.len()` elements.
    pub fn view_mut_shaped<T: Element>(
        &'scope self,
        data: &'scope mut [T],
        shape: &[usize],
    ) -> Result<TensorView<'scope>> {
        // SAFETY: `data` is borrowed mutably for 'scope, so nobody else touches it before the
        // scope ends; `scope` revokes the tensor (waiting for every lease) before returning,
        // i.e. before that borrow ends.
        let t = unsafe { Tensor::over_slice(data.as_mut_ptr(), data.len(), shape, true) }?;
        Ok(self.register(t))
    }

    /// A read-only 1-D tensor over `data` (inputs of collectives).
    pub fn view<T: Element>(&'scope self, data: &'scope [T]) -> TensorView<'scope> {
        self.view_shaped(data, &[data.len()])
            .expect("a 1-D shape holds every slice")
    }

    /// A read-only tensor of the given shape over `data` (row-major).
    ///
    /// # Errors
    /// [`crate::DistError::InvalidArgument`] when `shape` does not hold `data.len()` elements.
    pub fn view_shaped<T: Element>(
        &'scope self,
        data: &'scope [T],
        shape: &[usize],
    ) -> Result<TensorView<'scope>> {
        let ptr = data.as_ptr().cast_mut();
        // SAFETY: `data` is borrowed for 'scope and revoked before the scope returns, as in
        // `view_mut_shaped`; the storage is not writable, so the engine only reads it (a
        // shared borrow allows concurrent reads only, and `Element` types have no interior
        // mutability).
        let t = unsafe { Tensor::over_slice(ptr, data.len(), shape, false) }?;
        Ok(self.register(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorLeases;

    #[test]
    fn views_write_in_place_and_are_cut_off_when_the_scope_ends() {
        let mut data = vec![1i32, 2, 3, 4];
        let escaped = scope(|s| {
            let v = s.view_mut_shaped(&mut data, &[2, 2]).unwrap();
            assert_eq!(v.shape(), &[2, 2]);
            v.write(|x: &mut [i32]| x[3] = 40).unwrap();
            (*v).clone()
        });
        assert_eq!(data, [1, 2, 3, 40], "writes landed in the caller's memory");
        let e = escaped.to_vec::<i32>().unwrap_err().to_string();
        assert!(e.contains("given back to its owner"), "{e}");
    }

    #[test]
    fn shared_borrows_are_read_only() {
        let data = [1.5f64, 2.5];
        scope(|s| {
            let v = s.view(&data);
            assert_eq!(v.to_vec::<f64>().unwrap(), [1.5, 2.5]);
            let e = v.write(|x: &mut [f64]| x[0] = 0.0).unwrap_err().to_string();
            assert!(e.contains("read-only"), "{e}");
            assert!(TensorLeases::acquire(&[], &[(*v).clone()]).is_err());
            assert!(TensorLeases::acquire(&[(*v).clone()], &[]).is_ok());
        });
    }

    #[test]
    fn the_scope_waits_for_a_lease_held_on_another_thread() {
        let mut data = vec![0u8; 3];
        scope(|s| {
            let v = s.view_mut(&mut data);
            let lease = TensorLeases::acquire(&[], &[(*v).clone()]).unwrap();
            std::thread::spawn(move || {
                let mut lease = lease;
                std::thread::sleep(std::time::Duration::from_millis(20));
                lease.host_slices().unwrap().1[0].fill(7);
            });
        });
        assert_eq!(
            data,
            [7, 7, 7],
            "the scope ended only after the lease was released"
        );
    }

    #[test]
    fn bool_bytes_are_normalised_before_the_memory_is_given_back() {
        let mut data = vec![false, true, false];
        scope(|s| {
            let v = s.view_mut(&mut data);
            v.write_bytes(|b| b[2] = 5).unwrap();
        });
        assert_eq!(data, [false, true, true]);
    }

    #[test]
    fn wrong_shapes_are_refused_and_a_panic_still_gives_memory_back() {
        let mut data = vec![0f32; 4];
        scope(|s| {
            let e = s.view_mut_shaped(&mut data, &[3]).unwrap_err().to_string();
            assert!(e.contains("does not hold"), "{e}");
        });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            scope(|s| {
                let _v = s.view_mut(&mut data);
                panic!("inside the scope");
            })
        }));
        assert!(r.is_err());
        data[0] = 1.0;
    }
}
