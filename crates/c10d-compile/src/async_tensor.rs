//! [`AsyncCollectiveTensor`]: the result of a functional collective, handed back at once and
//! usable only after the collective completes (PyTorch's `AsyncCollectiveTensor`).
//!
//! The first access to the data ([`AsyncCollectiveTensor::tensor`], [`AsyncCollectiveTensor::wait`],
//! [`AsyncCollectiveTensor::to_vec`]) runs `wait_tensor` on it: it waits for the work and
//! unregisters it from the work registry. Until then [`AsyncCollectiveTensor::completed`] is
//! false, as in PyTorch. The handle is also a [`Future`] resolving to the tensor, usable from any
//! executor.

use crate::registry;
use c10d_core::{DistError, Element, Result, Tensor, Work};
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

/// A functional collective's output that waits on first access.
pub struct AsyncCollectiveTensor {
    tensor: Tensor,
    work: Option<Work>,
    done: OnceLock<std::result::Result<(), DistError>>,
}

impl std::fmt::Debug for AsyncCollectiveTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCollectiveTensor")
            .field("tensor", &self.tensor)
            .field("completed", &self.completed())
            .finish()
    }
}

impl AsyncCollectiveTensor {
    /// Wraps `tensor`, an output of `work` (`None`: nothing to wait for).
    pub(crate) fn new(tensor: Tensor, work: Option<Work>) -> AsyncCollectiveTensor {
        AsyncCollectiveTensor {
            tensor,
            work,
            done: OnceLock::new(),
        }
    }

    /// True once the data was first used (the wait ran), as PyTorch's `completed`.
    pub fn completed(&self) -> bool {
        self.done.get().is_some()
    }

    /// The underlying work (e.g. to poll [`Work::is_completed`] without waiting).
    pub fn work(&self) -> Option<&Work> {
        self.work.as_ref()
    }

    /// The tensor handle *without* waiting (PyTorch's `.elem`): reading it before the work
    /// finished fails with the tensor's "in use by an in-flight collective" error.
    pub fn inner_unwaited(&self) -> &Tensor {
        &self.tensor
    }

    /// Waits (once) with `wait_tensor` semantics: the work completes and leaves the registry.
    ///
    /// # Errors
    /// The collective's failure (timeout, peer error ...), every time it is asked.
    pub fn trigger_wait(&self) -> Result<()> {
        self.done
            .get_or_init(|| registry::wait_tensor(&self.tensor).map(|_| ()))
            .clone()
    }

    /// The tensor, after waiting for the collective on first access.
    ///
    /// # Errors
    /// As [`AsyncCollectiveTensor::trigger_wait`].
    pub fn tensor(&self) -> Result<&Tensor> {
        self.trigger_wait()?;
        Ok(&self.tensor)
    }

    /// Waits and returns the tensor (`AsyncCollectiveTensor.wait()`).
    ///
    /// # Errors
    /// As [`AsyncCollectiveTensor::trigger_wait`].
    pub fn wait(self) -> Result<Tensor> {
        self.trigger_wait()?;
        Ok(self.tensor)
    }

    /// Waits and copies the elements out.
    ///
    /// # Errors
    /// As [`AsyncCollectiveTensor::trigger_wait`] and [`Tensor::to_vec`].
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.tensor()?.to_vec()
    }

    /// The output shape (known before completion).
    pub fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }
}

impl Future for AsyncCollectiveTensor {
    type Output = Result<Tensor>;

    /// Ready once the work completes; then runs `wait_tensor` (which returns at once unless other
    /// works were registered on the same storage later).
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.done.get().is_none() {
            if let Some(w) = &mut this.work {
                if Pin::new(w).poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(this.trigger_wait().map(|_| this.tensor.clone()))
    }
}
