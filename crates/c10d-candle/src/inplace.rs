//! Running a c10d-rs collective on a candle tensor's own storage: candle's `InplaceOp1` hands
//! the op the tensor's `CpuStorage` and layout under its write lock; the collective's error is
//! carried out past candle's error type unchanged.

use crate::slices::{slice_mut, SliceMut};
use c10d_core::{DistError, Result};
use candle_core::{CpuStorage, Layout, Tensor};
use std::cell::RefCell;

/// The body of one in-place collective: gets the tensor's elements.
type Body<'f> = dyn Fn(SliceMut<'_>) -> Result<()> + 'f;

struct InPlace<'f> {
    what: &'static str,
    body: &'f Body<'f>,
    /// The body's own error (candle's error type would flatten it to text).
    error: RefCell<Option<DistError>>,
}

impl candle_core::InplaceOp1 for InPlace<'_> {
    fn name(&self) -> &'static str {
        self.what
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let run = slice_mut(storage, layout, self.what).and_then(|s| (self.body)(s));
        self.carry(run)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &mut candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<()> {
        let run = crate::cuda_slices::cuda_slice_mut(storage, layout, self.what)
            .and_then(|s| (self.body)(crate::slices::SliceMut::Cuda(s)));
        self.carry(run)
    }
}

impl InPlace<'_> {
    /// The body's error through candle's error type (as text), kept whole for the caller.
    fn carry(&self, run: Result<()>) -> candle_core::Result<()> {
        run.map_err(|e| {
            let text = e.to_string();
            *self.error.borrow_mut() = Some(e);
            candle_core::Error::Msg(text)
        })
    }
}

/// Runs `body` on `t`'s elements in place (`what` names the op in errors).
///
/// # Errors
/// A tensor on a device this build does not take, not contiguous or of an unsupported dtype;
/// the body's error as it returned it.
pub fn on_elements(t: &Tensor, what: &'static str, body: &Body<'_>) -> Result<()> {
    check_device(t, what)?;
    let op = InPlace {
        what,
        body,
        error: RefCell::new(None),
    };
    match t.inplace_op1(&op) {
        Ok(()) => Ok(()),
        Err(e) => Err(op.error.take().unwrap_or_else(|| from_candle(e))),
    }
}

/// Refuses tensors on devices this build does not take, naming `what`: CPU tensors always,
/// CUDA tensors with the `cuda` feature.
///
/// # Errors
/// As [`device_refused`].
pub fn check_device(t: &Tensor, what: &str) -> Result<()> {
    let taken = t.device().is_cpu() || (cfg!(feature = "cuda") && t.device().is_cuda());
    if taken {
        return Ok(());
    }
    Err(device_refused(t, what))
}

/// [`DistError::Unsupported`] naming the op, the tensor's device and shape, and what would take
/// it (Metal tensors; CUDA tensors without the `cuda` feature).
pub fn device_refused(t: &Tensor, what: &str) -> DistError {
    let hint = if t.device().is_cuda() {
        "build c10d-candle with its `cuda` feature"
    } else {
        "only CPU and CUDA tensors are supported"
    };
    DistError::unsupported(format!(
        "c10d-candle: {what} on a {:?} tensor (shape {:?}): {hint}",
        t.device().location(),
        t.dims()
    ))
}

/// A candle error as a c10d-rs error (`DistError::InvalidArgument` with candle's text).
pub fn from_candle(e: candle_core::Error) -> DistError {
    DistError::invalid(format!("candle: {e}"))
}
