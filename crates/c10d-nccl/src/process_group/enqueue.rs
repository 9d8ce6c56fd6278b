//! What an op's NCCL calls need while they are enqueued ([`Enqueue`]: NCCL's type and reduction
//! for a dtype, PREMUL_SUM's reduction, launch arguments, scratch tensors) and the destruction
//! of PREMUL_SUM reductions once their group has ended.

use super::Enqueue;
use crate::library::NcclLibrary;
use crate::mapping::{nccl_reduction, nccl_type, NcclReduction, NcclType};
use crate::result::{self, Launch};
use crate::sys;
use c10d_core::{DType, DistError, ReduceOp, Result, Tensor};
use std::ffi::c_void;

/// Destroys the PREMUL_SUM reductions of calls whose group has ended.
pub(crate) fn destroy_premul(
    lib: &'static NcclLibrary,
    comm: sys::ncclComm_t,
    ops: &mut Vec<sys::ncclRedOp_t>,
) {
    for op in ops.drain(..) {
        // SAFETY: `op` was created on `comm`, which the caller holds live and locked; the
        // group of the calls that used it has ended.
        if let Err(e) = unsafe { result::red_op_destroy(lib, op, comm) } {
            log::warn!("c10d-nccl: {e}");
        }
    }
}

impl Enqueue<'_> {
    /// NCCL's type for `dtype`.
    ///
    /// # Errors
    /// A dtype the loaded NCCL lacks, with PyTorch's text.
    pub fn nccl_type(&self, dtype: DType) -> Result<NcclType> {
        nccl_type(dtype, self.lib.version())
    }

    /// NCCL's reduction for `op` on `dtype`; a PREMUL_SUM op is created on the communicator
    /// and destroyed after the group ends.
    ///
    /// # Errors
    /// PyTorch's refusals ("Cannot use ReduceOp.BAND with NCCL" …); NCCL's error.
    pub fn reduction(&mut self, op: ReduceOp, dtype: DType) -> Result<sys::ncclRedOp_t> {
        let complex = matches!(dtype, DType::Complex64 | DType::Complex128);
        if complex && !matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
            // Complex numbers go through as pairs of reals: only sums are the same there.
            return Err(DistError::invalid(format!(
                "ProcessGroupNCCL: ReduceOp.{} is not supported for complex tensors ({dtype})",
                op.name()
            )));
        }
        match nccl_reduction(op, dtype, self.lib.version())? {
            NcclReduction::Builtin(r) => Ok(r),
            NcclReduction::PreMulSum(factor) => self.premul_sum(factor, dtype),
        }
    }

    fn premul_sum(&mut self, factor: f64, dtype: DType) -> Result<sys::ncclRedOp_t> {
        let mut scalar = scalar_bytes(factor, dtype)?;
        let ty = self.nccl_type(dtype)?;
        // SAFETY: live, locked communicator; `scalar` holds one element of `dtype`, read before
        // the call returns (host-immediate residence).
        let op = unsafe {
            result::red_op_create_pre_mul_sum(
                self.lib,
                scalar.as_mut_ptr().cast::<c_void>(),
                ty.dtype,
                self.comm,
            )
        }?;
        self.premul_ops.push(op);
        Ok(op)
    }

    /// The launch arguments for `count` NCCL elements of `dtype` on this communicator.
    pub fn args(&self, count: usize, dtype: sys::ncclDataType_t) -> Launch {
        Launch {
            comm: self.comm,
            stream: self.stream,
            dtype,
            count,
        }
    }

    /// A temporary CUDA tensor on the group's device from the stream-ordered allocator on the
    /// NCCL stream; freed there after the op's kernels.
    ///
    /// # Errors
    /// While the caller's stream is capturing a CUDA graph (nothing is allocated then); out of
    /// device memory.
    pub fn scratch(&mut self, op: &str, dtype: DType, numel: usize) -> Result<Tensor> {
        if self.capturing {
            return Err(DistError::invalid(format!(
                "ProcessGroupNCCL::{op}: this form needs a temporary device buffer, which is not allocated during CUDA graph capture; use the flat-tensor form"
            )));
        }
        let t = crate::memory::empty_on_stream(dtype, numel, self.device, self.nccl_stream)?;
        self.temps.push(t.clone());
        Ok(t)
    }
}

/// One element of `dtype` holding `factor` (PREMUL_SUM's scalar).
fn scalar_bytes(factor: f64, dtype: DType) -> Result<Vec<u8>> {
    Ok(match dtype {
        DType::F32 => (factor as f32).to_ne_bytes().to_vec(),
        DType::F64 => factor.to_ne_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(factor).to_ne_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(factor).to_ne_bytes().to_vec(),
        other => {
            return Err(DistError::invalid(format!(
                "ProcessGroupNCCL: PREMUL_SUM needs a floating-point tensor, got {other}"
            )))
        }
    })
}
