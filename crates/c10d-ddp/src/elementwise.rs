//! The few elementwise operations DDP needs on floating-point tensors: divide or multiply in
//! place, copy with a factor, copy with a dtype cast (compression hooks).

use c10d_core::half::{bf16, f16};
use c10d_core::{DType, DistError, Element, Result, Tensor};

/// A floating-point element type, converted through `f64` only where exact.
pub(crate) trait Float: Element + Copy {
    fn div_by(self, n: f64) -> Self;
    fn mul_by(self, f: f64) -> Self;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

impl Float for f32 {
    fn div_by(self, n: f64) -> Self {
        self / n as f32
    }
    fn mul_by(self, f: f64) -> Self {
        self * f as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Float for f64 {
    fn div_by(self, n: f64) -> Self {
        self / n
    }
    fn mul_by(self, f: f64) -> Self {
        self * f
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

macro_rules! half_float {
    ($t:ty) => {
        impl Float for $t {
            fn div_by(self, n: f64) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
            fn mul_by(self, f: f64) -> Self {
                <$t>::from_f32(self.to_f32() * f as f32)
            }
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
        }
    };
}
half_float!(f16);
half_float!(bf16);

/// Dispatches on the floating-point dtypes; any other dtype is an error.
macro_rules! dispatch_float {
    ($dtype:expr, $m:ident) => {
        match $dtype {
            DType::F32 => $m!(f32),
            DType::F64 => $m!(f64),
            DType::F16 => $m!(f16),
            DType::BF16 => $m!(bf16),
            other => Err(not_float(other)),
        }
    };
}

/// The error for a gradient of a dtype DDP cannot average.
pub(crate) fn not_float(dtype: DType) -> DistError {
    DistError::invalid(format!(
        "DDP reduces floating-point gradients (float32, float64, float16, bfloat16), got {dtype}"
    ))
}

/// `t.div_(n)`.
pub(crate) fn div_in_place(t: &Tensor, n: f64) -> Result<()> {
    macro_rules! go {
        ($t:ty) => {
            t.write(|s: &mut [$t]| s.iter_mut().for_each(|x| *x = x.div_by(n)))
        };
    }
    dispatch_float!(t.dtype(), go)
}

/// `dst.copy_(src * factor)` (`at::mul_out`); `dst` and `src` have one dtype and element count.
pub(crate) fn copy_scaled(dst: &Tensor, src: &Tensor, factor: f64) -> Result<()> {
    check_same_numel(dst, src)?;
    if dst.dtype() != src.dtype() {
        return Err(DistError::invalid(format!(
            "Expected {}, got {}",
            dst.dtype(),
            src.dtype()
        )));
    }
    let src = unaliased(dst, src)?;
    macro_rules! go {
        ($t:ty) => {
            src.read(|s: &[$t]| {
                dst.write(|d: &mut [$t]| {
                    d.iter_mut().zip(s).for_each(|(d, s)| *d = s.mul_by(factor))
                })
            })?
        };
    }
    dispatch_float!(dst.dtype(), go)
}

/// `dst.copy_(src)` across floating-point dtypes (rounding to nearest).
pub(crate) fn cast_copy(dst: &Tensor, src: &Tensor) -> Result<()> {
    check_same_numel(dst, src)?;
    if dst.dtype() == src.dtype() {
        return dst.copy_from(src);
    }
    let src = unaliased(dst, src)?;
    let wide: Vec<f64> = {
        macro_rules! rd {
            ($t:ty) => {
                src.read(|s: &[$t]| s.iter().map(|x| x.to_f64()).collect())
            };
        }
        dispatch_float!(src.dtype(), rd)?
    };
    macro_rules! wr {
        ($t:ty) => {
            dst.write(|d: &mut [$t]| {
                d.iter_mut()
                    .zip(&wide)
                    .for_each(|(d, v)| *d = <$t as Float>::from_f64(*v))
            })
        };
    }
    dispatch_float!(dst.dtype(), wr)
}

fn check_same_numel(dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.numel() != src.numel() {
        return Err(DistError::invalid(format!(
            "gradient {src:?} does not match its bucket view {dst:?} ({} vs {} elements)",
            src.numel(),
            dst.numel()
        )));
    }
    Ok(())
}

/// `src` itself, or a private copy when it shares storage with `dst` (so that reading it while
/// writing `dst` does not trip the storage's borrow flag).
fn unaliased(dst: &Tensor, src: &Tensor) -> Result<Tensor> {
    if src.shares_storage_with(dst) {
        src.deep_clone()
    } else {
        Ok(src.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_and_cast() {
        let t = Tensor::from_vec(vec![2.0f32, 4.0]);
        div_in_place(&t, 2.0).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        let d = Tensor::zeros(DType::F32, &[2]);
        copy_scaled(&d, &t, 0.5).unwrap();
        assert_eq!(d.to_vec::<f32>().unwrap(), vec![0.5, 1.0]);
        let h = Tensor::zeros(DType::F16, &[2]);
        cast_copy(&h, &d).unwrap();
        assert_eq!(
            h.to_vec::<f16>().unwrap(),
            vec![f16::from_f32(0.5), f16::ONE]
        );
        assert!(div_in_place(&Tensor::from_vec(vec![1i32]), 2.0).is_err());
    }
}
