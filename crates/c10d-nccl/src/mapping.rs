//! How c10d's dtypes and reductions become NCCL's, with PyTorch's refusals. Pure functions of
//! the dtype, the op and the loaded NCCL's version, shared by every collective.

use crate::sys;
use crate::version::Version;
use c10d_core::{DType, DistError, ReduceOp, Result};

/// First NCCL with `ncclBfloat16` and `ncclAvg`.
pub const BF16_AND_AVG_SINCE: Version = Version::new(2, 10, 0);
/// First NCCL with `ncclRedOpCreatePreMulSum` (PyTorch requires 2.11.1).
pub const PREMUL_SUM_SINCE: Version = Version::new(2, 11, 1);

/// An element type as NCCL sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclType {
    /// The NCCL data type.
    pub dtype: sys::ncclDataType_t,
    /// NCCL elements per tensor element: 2 for complex (PyTorch passes `view_as_real`).
    pub per_element: usize,
}

/// The NCCL type of `dtype` (bool as `ncclUint8`, complex as pairs of reals).
///
/// # Errors
/// [`DistError::InvalidArgument`] for `int16` (NCCL has no 16-bit integer) and for bf16 on an
/// NCCL older than 2.10.
pub fn nccl_type(dtype: DType, version: Version) -> Result<NcclType> {
    let t = |dtype, per_element| NcclType { dtype, per_element };
    Ok(match dtype {
        DType::F32 => t(sys::ncclFloat32, 1),
        DType::F64 => t(sys::ncclFloat64, 1),
        DType::F16 => t(sys::ncclFloat16, 1),
        DType::BF16 if version >= BF16_AND_AVG_SINCE => t(sys::ncclBfloat16, 1),
        DType::I8 => t(sys::ncclInt8, 1),
        DType::U8 | DType::Bool => t(sys::ncclUint8, 1),
        DType::I32 => t(sys::ncclInt32, 1),
        DType::I64 => t(sys::ncclInt64, 1),
        DType::Complex64 => t(sys::ncclFloat32, 2),
        DType::Complex128 => t(sys::ncclFloat64, 2),
        DType::BF16 | DType::I16 => {
            return Err(DistError::invalid(format!(
                "Input tensor data type is not supported for NCCL process group: {dtype:?} (NCCL {version})"
            )))
        }
    })
}

/// A reduction as NCCL runs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NcclReduction {
    /// A built-in `ncclRedOp_t`.
    Builtin(sys::ncclRedOp_t),
    /// `ncclRedOpCreatePreMulSum` with this factor, created per call on the communicator.
    PreMulSum(f64),
}

/// The NCCL reduction of `op` on `dtype`, as PyTorch maps it: bool SUM is MAX and PRODUCT is
/// MIN (logical or / and).
///
/// # Errors
/// [`DistError::InvalidArgument`]: "Cannot use ReduceOp.BAND with NCCL" (and BOR, BXOR),
/// "Cannot use ReduceOp.AVG with boolean inputs", and AVG / PREMUL_SUM on an NCCL too old.
pub fn nccl_reduction(op: ReduceOp, dtype: DType, version: Version) -> Result<NcclReduction> {
    let too_old = |since: Version| {
        DistError::invalid(format!(
            "Cannot use ReduceOp.{} with NCCL {version}: it needs NCCL >= {since}",
            op.name()
        ))
    };
    Ok(match op {
        ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => {
            return Err(DistError::invalid(format!(
                "Cannot use ReduceOp.{} with NCCL",
                op.name()
            )))
        }
        ReduceOp::Avg if dtype == DType::Bool => {
            return Err(DistError::invalid(
                "Cannot use ReduceOp.AVG with boolean inputs",
            ))
        }
        ReduceOp::Sum if dtype == DType::Bool => NcclReduction::Builtin(sys::ncclMax),
        ReduceOp::Product if dtype == DType::Bool => NcclReduction::Builtin(sys::ncclMin),
        ReduceOp::Sum => NcclReduction::Builtin(sys::ncclSum),
        ReduceOp::Product => NcclReduction::Builtin(sys::ncclProd),
        ReduceOp::Min => NcclReduction::Builtin(sys::ncclMin),
        ReduceOp::Max => NcclReduction::Builtin(sys::ncclMax),
        ReduceOp::Avg if version < BF16_AND_AVG_SINCE => return Err(too_old(BF16_AND_AVG_SINCE)),
        ReduceOp::Avg => NcclReduction::Builtin(sys::ncclAvg),
        ReduceOp::PremulSum(_) if version < PREMUL_SUM_SINCE => {
            return Err(too_old(PREMUL_SUM_SINCE))
        }
        ReduceOp::PremulSum(f) => NcclReduction::PreMulSum(f),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: Version = Version::new(2, 27, 3);

    #[test]
    fn dtypes() {
        assert_eq!(nccl_type(DType::F32, NEW).unwrap().dtype, sys::ncclFloat32);
        assert_eq!(
            nccl_type(DType::BF16, NEW).unwrap().dtype,
            sys::ncclBfloat16
        );
        assert_eq!(nccl_type(DType::Bool, NEW).unwrap().dtype, sys::ncclUint8);
        assert_eq!(
            nccl_type(DType::Complex128, NEW).unwrap(),
            NcclType {
                dtype: sys::ncclFloat64,
                per_element: 2
            }
        );
        for d in DType::ALL {
            let r = nccl_type(d, NEW);
            assert_eq!(r.is_err(), d == DType::I16, "{d:?}");
        }
        let e = nccl_type(DType::BF16, Version::new(2, 9, 9)).unwrap_err();
        assert_eq!(e.kind(), c10d_core::ErrorKind::InvalidArgument);
    }

    #[test]
    fn reductions() {
        use NcclReduction::*;
        assert_eq!(
            nccl_reduction(ReduceOp::Sum, DType::F32, NEW).unwrap(),
            Builtin(sys::ncclSum)
        );
        assert_eq!(
            nccl_reduction(ReduceOp::Sum, DType::Bool, NEW).unwrap(),
            Builtin(sys::ncclMax)
        );
        assert_eq!(
            nccl_reduction(ReduceOp::Product, DType::Bool, NEW).unwrap(),
            Builtin(sys::ncclMin)
        );
        assert_eq!(
            nccl_reduction(ReduceOp::Avg, DType::F16, NEW).unwrap(),
            Builtin(sys::ncclAvg)
        );
        assert_eq!(
            nccl_reduction(ReduceOp::PremulSum(3.0), DType::F32, NEW).unwrap(),
            PreMulSum(3.0)
        );
        for op in [ReduceOp::Band, ReduceOp::Bor, ReduceOp::Bxor] {
            let e = nccl_reduction(op, DType::I32, NEW).unwrap_err();
            assert_eq!(
                e.message(),
                format!("Cannot use ReduceOp.{} with NCCL", op.name())
            );
            assert_eq!(e.kind(), c10d_core::ErrorKind::InvalidArgument);
        }
        let e = nccl_reduction(ReduceOp::Avg, DType::Bool, NEW).unwrap_err();
        assert_eq!(e.message(), "Cannot use ReduceOp.AVG with boolean inputs");
        let e = nccl_reduction(ReduceOp::PremulSum(2.0), DType::F32, Version::new(2, 11, 0))
            .unwrap_err();
        assert!(e.message().contains("needs NCCL >= 2.11.1"), "{e}");
        assert!(nccl_reduction(ReduceOp::Avg, DType::F32, Version::new(2, 9, 6)).is_err());
    }
}
