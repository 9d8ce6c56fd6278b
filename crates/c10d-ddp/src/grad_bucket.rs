//! `GradBucket` (what a comm hook receives) and `BucketFuture` (what it returns).

use c10d_core::{DistError, Result, Tensor, Work};
use std::time::Duration;

/// One bucket of gradients handed to a comm hook: mirrors `torch.distributed.GradBucket`.
///
/// The buffer is a flat 1-D tensor of one dtype; parameter `parameter_indices()[k]` occupies the
/// elements `offsets()[k] .. offsets()[k] + lengths()[k]`, with shape `shapes()[k]`.
#[derive(Debug, Clone)]
pub struct GradBucket {
    pub(crate) index: usize,
    pub(crate) buffer: Tensor,
    pub(crate) offsets: Vec<usize>,
    pub(crate) lengths: Vec<usize>,
    pub(crate) shapes: Vec<Vec<usize>>,
    pub(crate) parameter_indices: Vec<usize>,
    pub(crate) is_last: bool,
}

impl GradBucket {
    /// Position of the bucket in the reduction order (`GradBucket.index()`); bucket 0 is reduced
    /// first.
    pub fn index(&self) -> usize {
        self.index
    }
    /// The flat gradient buffer (`GradBucket.buffer()`); a hook may reduce it in place.
    pub fn buffer(&self) -> &Tensor {
        &self.buffer
    }
    /// Element offset of each parameter's gradient in the buffer.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }
    /// Element count of each parameter's gradient.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }
    /// Shape of each parameter.
    pub fn shapes(&self) -> &[Vec<usize>] {
        &self.shapes
    }
    /// Registration index of each parameter in the bucket (`GradBucket.parameters()` gives the
    /// tensors in PyTorch; here the caller owns them).
    pub fn parameter_indices(&self) -> &[usize] {
        &self.parameter_indices
    }
    /// True for the last bucket reduced in the iteration (`GradBucket.is_last()`).
    pub fn is_last(&self) -> bool {
        self.is_last
    }
    /// Per-parameter views of the buffer (`GradBucket.gradients()`).
    ///
    /// # Errors
    /// Only if the bucket's layout were inconsistent (never for buckets built by the Reducer).
    pub fn gradients(&self) -> Result<Vec<Tensor>> {
        (0..self.offsets.len())
            .map(|k| {
                self.buffer
                    .narrow(self.offsets[k], self.lengths[k])?
                    .reshape(&self.shapes[k])
            })
            .collect()
    }
}

type Continuation = Box<dyn FnOnce() -> Result<Tensor> + Send>;

/// The future a comm hook returns: the reduced bucket once its collective completes (PyTorch's
/// `torch.futures.Future[Tensor]`, with `then` for post-processing).
///
/// The value must be a flat tensor of the bucket's dtype and element count; when it is not the
/// bucket's buffer itself, the Reducer copies it into the buffer.
pub struct BucketFuture {
    work: Option<Work>,
    value: Continuation,
}

impl std::fmt::Debug for BucketFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BucketFuture(work={:?})", self.work)
    }
}

impl BucketFuture {
    /// A future that holds `result` once `work` has completed (e.g. an in-place all_reduce of
    /// `result`).
    pub fn from_work(work: Work, result: Tensor) -> BucketFuture {
        BucketFuture {
            work: Some(work),
            value: Box::new(move || Ok(result)),
        }
    }

    /// A future that is already complete (`torch.futures.Future` with `set_result`).
    pub fn ready(result: Tensor) -> BucketFuture {
        BucketFuture {
            work: None,
            value: Box::new(move || Ok(result)),
        }
    }

    /// Chains `f`, run on the waiting thread after the collective completed (`Future.then`).
    pub fn then(self, f: impl FnOnce(Tensor) -> Result<Tensor> + Send + 'static) -> BucketFuture {
        let prev = self.value;
        BucketFuture {
            work: self.work,
            value: Box::new(move || f(prev()?)),
        }
    }

    /// The collective behind the future, if any (the Reducer times its completion).
    pub fn work(&self) -> Option<&Work> {
        self.work.as_ref()
    }

    /// Waits at most `timeout` for the collective, then runs the continuations.
    ///
    /// # Errors
    /// The collective's error, a timeout ("Work ... timed out after ...ms in wait()"), or the
    /// error of a continuation.
    pub fn wait(self, timeout: Duration) -> Result<Tensor> {
        if let Some(w) = &self.work {
            w.wait_timeout(timeout)?;
        }
        (self.value)()
    }
}

/// Checks that a hook's result can stand for `bucket`'s buffer.
pub(crate) fn check_hook_result(bucket: &GradBucket, result: &Tensor) -> Result<()> {
    if result.numel() != bucket.buffer.numel() || result.dtype() != bucket.buffer.dtype() {
        return Err(DistError::invalid(format!(
            "comm hook result {result:?} does not match bucket {} ({:?})",
            bucket.index, bucket.buffer
        )));
    }
    Ok(())
}
