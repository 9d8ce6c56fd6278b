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
        run.map_err(|e| {
            let text = e.to_string();
            *self.error.borrow_mut() = Some(e);
            candle_core::Error::Msg(text)
        })
    }
}

/// Runs `body` on `t`'s elements in place (CPU tensors; `what` names the op in errors).
///
/// # Errors
/// A tensor that is not on the CPU, not contiguous or of an unsupported dtype; the body's
/// error as it returned it.
pub fn on_elements(t: &Tensor, what: &'static str, body: &Body<'_>) -> Result<()> {
    check_cpu(t, what)?;
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

/// Refuses tensors that are not in host memory, naming `what`.
///
/// # Errors
/// [`DistError::Unsupported`] for CUDA and Metal tensors.
pub fn check_cpu(t: &Tensor, what: &str) -> Result<()> {
    if t.device().is_cpu() {
        return Ok(());
    }
    Err(DistError::unsupported(format!(
        "c10d-candle: {what} on a {:?} tensor (shape {:?}): only CPU tensors are supported yet",
        t.device().location(),
        t.dims()
    )))
}

/// A candle error as a c10d-rs error (`DistError::InvalidArgument` with candle's text).
pub fn from_candle(e: candle_core::Error) -> DistError {
    DistError::invalid(format!("candle: {e}"))
}
