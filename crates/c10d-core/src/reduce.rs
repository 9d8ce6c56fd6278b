//! `ReduceOp` and the reduction kernels used by every CPU algorithm.
//!
//! Kernels are plain loops over slices that the compiler auto-vectorises. `f16`/`bf16` are
//! widened to `f32` for the arithmetic and rounded back once per step (round-to-nearest-even),
//! so they never accumulate in half precision. Integers wrap on overflow (as C++ does in Gloo).
//! `bool` SUM/MAX/BOR are OR, PRODUCT/MIN/BAND are AND, BXOR is XOR (PyTorch's results).
//! Complex tensors reduce as pairs of reals, so only SUM, AVG and PREMUL_SUM apply.

use crate::dtype::{c32, c64, DType};
use crate::error::{DistError, Result};
use half::{bf16, f16};

/// Reduction operation, mirroring `torch.distributed.ReduceOp` with PyTorch's numeric ids
/// (SUM 0, AVG 1, PRODUCT 2, MIN 3, MAX 4, BAND 5, BOR 6, BXOR 7, PREMUL_SUM 8).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ReduceOp {
    /// Sum (id 0).
    #[default]
    Sum,
    /// Average: sum divided by the group size (id 1). Integers use truncating division.
    Avg,
    /// Product (id 2).
    Product,
    /// Minimum (id 3).
    Min,
    /// Maximum (id 4).
    Max,
    /// Bitwise AND, integral and bool dtypes only (id 5).
    Band,
    /// Bitwise OR, integral and bool dtypes only (id 6).
    Bor,
    /// Bitwise XOR, integral and bool dtypes only (id 7).
    Bxor,
    /// Each input is multiplied by the factor, then summed (id 8). Mirrors
    /// `torch.distributed._make_nccl_premul_sum(factor)`; floating and complex dtypes only.
    PremulSum(f64),
}

impl ReduceOp {
    /// PyTorch's numeric id (`ReduceOp.RedOpType`).
    pub const fn id(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Avg => 1,
            ReduceOp::Product => 2,
            ReduceOp::Min => 3,
            ReduceOp::Max => 4,
            ReduceOp::Band => 5,
            ReduceOp::Bor => 6,
            ReduceOp::Bxor => 7,
            ReduceOp::PremulSum(_) => 8,
        }
    }

    /// Inverse of [`ReduceOp::id`]; `factor` is used only for PREMUL_SUM (id 8).
    pub fn from_id(id: u8, factor: f64) -> Option<ReduceOp> {
        Some(match id {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Avg,
            2 => ReduceOp::Product,
            3 => ReduceOp::Min,
            4 => ReduceOp::Max,
            5 => ReduceOp::Band,
            6 => ReduceOp::Bor,
            7 => ReduceOp::Bxor,
            8 => ReduceOp::PremulSum(factor),
            _ => return None,
        })
    }

    /// Upper-case name as PyTorch prints it ("SUM", "PREMUL_SUM" ...).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "SUM",
            ReduceOp::Avg => "AVG",
            ReduceOp::Product => "PRODUCT",
            ReduceOp::Min => "MIN",
            ReduceOp::Max => "MAX",
            ReduceOp::Band => "BAND",
            ReduceOp::Bor => "BOR",
            ReduceOp::Bxor => "BXOR",
            ReduceOp::PremulSum(_) => "PREMUL_SUM",
        }
    }

    /// Parses the functional-collective op strings ("sum", "avg", "product", "min", "max",
    /// "band", "bor", "bxor", "premul_sum"), case-insensitive.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Unrecognized reduce_op: {s}" (PyTorch's text).
    pub fn parse(s: &str) -> Result<ReduceOp> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "avg" => ReduceOp::Avg,
            "product" => ReduceOp::Product,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "band" => ReduceOp::Band,
            "bor" => ReduceOp::Bor,
            "bxor" => ReduceOp::Bxor,
            "premul_sum" => ReduceOp::PremulSum(1.0),
            _ => return Err(DistError::invalid(format!("Unrecognized reduce_op: {s}"))),
        })
    }

    /// True for ops defined on complex tensors (SUM, AVG, PREMUL_SUM), as `supports_complex` in
    /// `torch.distributed.distributed_c10d`.
    pub const fn supports_complex(self) -> bool {
        matches!(self, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_))
    }

    /// True for BAND, BOR, BXOR.
    pub const fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor)
    }

    /// Checks that this op is defined on `dtype`.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`]: "Cannot use ReduceOp.BAND with non-integral dtype torch.float32",
    /// "ReduceOp.MAX does not support complex tensors (dtype torch.complex64)", "Cannot use
    /// ReduceOp.PREMUL_SUM with non-floating dtype torch.int32", "Cannot use ReduceOp.AVG with dtype torch.bool".
    pub fn check_dtype(self, dtype: DType) -> Result<()> {
        if self.is_bitwise() && !dtype.is_integral(true) {
            return Err(DistError::invalid(format!(
                "Cannot use ReduceOp.{} with non-integral dtype {dtype}",
                self.name()
            )));
        }
        if dtype.is_complex() && !self.supports_complex() {
            return Err(DistError::invalid(format!(
                "ReduceOp.{} does not support complex tensors (dtype {dtype})",
                self.name()
            )));
        }
        if matches!(self, ReduceOp::PremulSum(_))
            && !(dtype.is_floating_point() || dtype.is_complex())
        {
            return Err(DistError::invalid(format!(
                "Cannot use ReduceOp.PREMUL_SUM with non-floating dtype {dtype}"
            )));
        }
        if matches!(self, ReduceOp::Avg) && dtype == DType::Bool {
            return Err(DistError::invalid(format!(
                "Cannot use ReduceOp.AVG with dtype {dtype}"
            )));
        }
        Ok(())
    }

    /// The op applied pairwise while combining contributions (AVG and PREMUL_SUM combine as SUM).
    pub const fn combine_op(self) -> ReduceOp {
        match self {
            ReduceOp::Avg | ReduceOp::PremulSum(_) => ReduceOp::Sum,
            op => op,
        }
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReduceOp.{}", self.name())
    }
}

/// `acc[i] = acc[i] (op) src[i]` over raw bytes of `dtype`. AVG and PREMUL_SUM combine as SUM
/// (apply [`prescale`] / [`finalize`] around the combination).
///
/// Byte slices need not be aligned; aligned slices take the vectorised path directly.
///
/// # Errors
/// [`DistError::InvalidArgument`] when the op is undefined for the dtype, or when the slices'
/// lengths differ or are not a multiple of the element size.
pub fn reduce_into(op: ReduceOp, dtype: DType, acc: &mut [u8], src: &[u8]) -> Result<()> {
    op.check_dtype(dtype)?;
    if acc.len() != src.len() || !acc.len().is_multiple_of(dtype.size()) {
        return Err(DistError::invalid(format!(
            "reduce_into: buffer sizes {} and {} do not match or are not a multiple of {} ({dtype})",
            acc.len(),
            src.len(),
            dtype.size()
        )));
    }
    let op = op.combine_op();
    match dtype {
        DType::F32 => typed2::<f32>(acc, src, |a, s| combine_plain(op, a, s)),
        DType::F64 => typed2::<f64>(acc, src, |a, s| combine_plain(op, a, s)),
        DType::I8 => typed2::<i8>(acc, src, |a, s| combine_int(op, a, s)),
        DType::U8 => typed2::<u8>(acc, src, |a, s| combine_int(op, a, s)),
        DType::I16 => typed2::<i16>(acc, src, |a, s| combine_int(op, a, s)),
        DType::I32 => typed2::<i32>(acc, src, |a, s| combine_int(op, a, s)),
        DType::I64 => typed2::<i64>(acc, src, |a, s| combine_int(op, a, s)),
        DType::Bool => combine_bool(op, acc, src),
        DType::F16 => typed2::<u16>(acc, src, |a, s| combine_f16(op, a, s)),
        DType::BF16 => typed2::<u16>(acc, src, |a, s| combine_bf16(op, a, s)),
        // Only SUM reaches here for complex (checked above): add as interleaved reals.
        DType::Complex64 => typed2::<f32>(acc, src, |a, s| combine_plain(ReduceOp::Sum, a, s)),
        DType::Complex128 => typed2::<f64>(acc, src, |a, s| combine_plain(ReduceOp::Sum, a, s)),
    }
    Ok(())
}

/// Multiplies every element by `factor` (in the element's arithmetic; used for PREMUL_SUM).
///
/// # Errors
/// [`DistError::InvalidArgument`] for integral/bool dtypes or a length not a multiple of the element size.
pub fn scale(dtype: DType, buf: &mut [u8], factor: f64) -> Result<()> {
    if !buf.len().is_multiple_of(dtype.size()) {
        return Err(DistError::invalid(
            "scale: buffer length is not a multiple of the element size",
        ));
    }
    match dtype {
        DType::F32 | DType::Complex64 => {
            typed1::<f32>(buf, |a| a.iter_mut().for_each(|x| *x *= factor as f32))
        }
        DType::F64 | DType::Complex128 => {
            typed1::<f64>(buf, |a| a.iter_mut().for_each(|x| *x *= factor))
        }
        DType::F16 => typed1::<u16>(buf, |a| map_half::<F16Conv>(a, |x| x * factor as f32)),
        DType::BF16 => typed1::<u16>(buf, |a| map_half::<Bf16Conv>(a, |x| x * factor as f32)),
        _ => {
            return Err(DistError::invalid(format!(
                "cannot scale a tensor of dtype {dtype} by a real factor"
            )))
        }
    }
    Ok(())
}

/// Applied once to a rank's own contribution before combining: multiplies by the factor for
/// PREMUL_SUM; a no-op for every other op.
///
/// # Errors
/// As [`scale`].
pub fn prescale(op: ReduceOp, dtype: DType, buf: &mut [u8]) -> Result<()> {
    match op {
        ReduceOp::PremulSum(f) => scale(dtype, buf, f),
        _ => Ok(()),
    }
}

/// Applied once to the combined result: divides by `world_size` for AVG (truncating for
/// integers); a no-op for every other op.
///
/// # Errors
/// [`DistError::InvalidArgument`] for a length not a multiple of the element size.
pub fn finalize(op: ReduceOp, dtype: DType, buf: &mut [u8], world_size: usize) -> Result<()> {
    if !matches!(op, ReduceOp::Avg) || world_size == 1 {
        return Ok(());
    }
    let n = world_size as i64;
    match dtype {
        DType::I8 => typed1::<i8>(buf, |a| {
            a.iter_mut().for_each(|x| *x = (*x as i64 / n) as i8)
        }),
        DType::U8 => typed1::<u8>(buf, |a| {
            a.iter_mut().for_each(|x| *x = (*x as i64 / n) as u8)
        }),
        DType::I16 => typed1::<i16>(buf, |a| {
            a.iter_mut().for_each(|x| *x = (*x as i64 / n) as i16)
        }),
        DType::I32 => typed1::<i32>(buf, |a| {
            a.iter_mut().for_each(|x| *x = (*x as i64 / n) as i32)
        }),
        DType::I64 => typed1::<i64>(buf, |a| a.iter_mut().for_each(|x| *x /= n)),
        DType::Bool => {
            return Err(DistError::invalid(
                "Cannot use ReduceOp.AVG with dtype torch.bool",
            ))
        }
        _ => return scale(dtype, buf, 1.0 / world_size as f64),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Typed views over byte slices.

/// Runs `f` on `acc`/`src` viewed as `[T]`, via aligned stack blocks when the bytes are not aligned.
fn typed2<T: bytemuck::Pod>(acc: &mut [u8], src: &[u8], f: impl Fn(&mut [T], &[T])) {
    if let (Ok(a), Ok(s)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(acc),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        return f(a, s);
    }
    const BLOCK: usize = 1024;
    let mut ab = [T::zeroed(); BLOCK];
    let mut sb = [T::zeroed(); BLOCK];
    let es = std::mem::size_of::<T>();
    for (ac, sc) in acc.chunks_mut(BLOCK * es).zip(src.chunks(BLOCK * es)) {
        let n = ac.len() / es;
        bytemuck::cast_slice_mut::<T, u8>(&mut ab[..n]).copy_from_slice(ac);
        bytemuck::cast_slice_mut::<T, u8>(&mut sb[..n]).copy_from_slice(sc);
        f(&mut ab[..n], &sb[..n]);
        ac.copy_from_slice(bytemuck::cast_slice(&ab[..n]));
    }
}

fn typed1<T: bytemuck::Pod>(buf: &mut [u8], f: impl Fn(&mut [T])) {
    if let Ok(a) = bytemuck::try_cast_slice_mut::<u8, T>(buf) {
        return f(a);
    }
    const BLOCK: usize = 1024;
    let mut ab = [T::zeroed(); BLOCK];
    let es = std::mem::size_of::<T>();
    for ac in buf.chunks_mut(BLOCK * es) {
        let n = ac.len() / es;
        bytemuck::cast_slice_mut::<T, u8>(&mut ab[..n]).copy_from_slice(ac);
        f(&mut ab[..n]);
        ac.copy_from_slice(bytemuck::cast_slice(&ab[..n]));
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels. Each is one `match` on the op outside the loop, then a plain loop.

fn combine_plain<T>(op: ReduceOp, a: &mut [T], s: &[T])
where
    T: Copy + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
{
    match op {
        ReduceOp::Sum => a.iter_mut().zip(s).for_each(|(x, y)| *x = *x + *y),
        ReduceOp::Product => a.iter_mut().zip(s).for_each(|(x, y)| *x = *x * *y),
        ReduceOp::Min => a
            .iter_mut()
            .zip(s)
            .for_each(|(x, y)| *x = if *y < *x { *y } else { *x }),
        ReduceOp::Max => a
            .iter_mut()
            .zip(s)
            .for_each(|(x, y)| *x = if *y > *x { *y } else { *x }),
        _ => unreachable!("checked by ReduceOp::check_dtype"),
    }
}

trait IntLike:
    Copy
    + Ord
    + std::ops::BitAnd<Output = Self>
    + std::ops::BitOr<Output = Self>
    + std::ops::BitXor<Output = Self>
{
    fn wadd(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
}
macro_rules! int_like {
    ($($t:ty),*) => {$(impl IntLike for $t {
        #[inline(always)] fn wadd(self, o: Self) -> Self { self.wrapping_add(o) }
        #[inline(always)] fn wmul(self, o: Self) -> Self { self.wrapping_mul(o) }
    })*};
}
int_like!(i8, u8, i16, i32, i64);

fn combine_int<T: IntLike>(op: ReduceOp, a: &mut [T], s: &[T]) {
    match op {
        ReduceOp::Sum => a.iter_mut().zip(s).for_each(|(x, y)| *x = x.wadd(*y)),
        ReduceOp::Product => a.iter_mut().zip(s).for_each(|(x, y)| *x = x.wmul(*y)),
        ReduceOp::Min => a.iter_mut().zip(s).for_each(|(x, y)| *x = (*x).min(*y)),
        ReduceOp::Max => a.iter_mut().zip(s).for_each(|(x, y)| *x = (*x).max(*y)),
        ReduceOp::Band => a.iter_mut().zip(s).for_each(|(x, y)| *x = *x & *y),
        ReduceOp::Bor => a.iter_mut().zip(s).for_each(|(x, y)| *x = *x | *y),
        ReduceOp::Bxor => a.iter_mut().zip(s).for_each(|(x, y)| *x = *x ^ *y),
        _ => unreachable!("checked by ReduceOp::check_dtype"),
    }
}

fn combine_bool(op: ReduceOp, a: &mut [u8], s: &[u8]) {
    match op {
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::Bor => {
            a.iter_mut().zip(s).for_each(|(x, y)| *x |= *y)
        }
        ReduceOp::Product | ReduceOp::Min | ReduceOp::Band => {
            a.iter_mut().zip(s).for_each(|(x, y)| *x &= *y)
        }
        ReduceOp::Bxor => a.iter_mut().zip(s).for_each(|(x, y)| *x ^= *y),
        _ => unreachable!("checked by ReduceOp::check_dtype"),
    }
}

/// Conversions between a 16-bit float's bits and `f32`, written so loops over them vectorise.
trait HalfConv {
    fn to_f32(dst: &mut [f32], src: &[u16]);
    fn from_f32(dst: &mut [u16], src: &[f32]);
}

struct Bf16Conv;
impl HalfConv for Bf16Conv {
    #[inline]
    fn to_f32(dst: &mut [f32], src: &[u16]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = bf16_widen(*s));
    }
    #[inline]
    fn from_f32(dst: &mut [u16], src: &[f32]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = bf16_narrow(*s));
    }
}

struct F16Conv;
impl HalfConv for F16Conv {
    #[inline]
    fn to_f32(dst: &mut [f32], src: &[u16]) {
        use half::slice::HalfFloatSliceExt;
        let h: &[f16] = bytemuck::cast_slice(src);
        h.convert_to_f32_slice(dst);
    }
    #[inline]
    fn from_f32(dst: &mut [u16], src: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        let h: &mut [f16] = bytemuck::cast_slice_mut(dst);
        h.convert_from_f32_slice(src);
    }
}

const HALF_BLOCK: usize = 256;

fn combine_half<C: HalfConv>(op: ReduceOp, a: &mut [u16], s: &[u16]) {
    let mut fa = [0f32; HALF_BLOCK];
    let mut fs = [0f32; HALF_BLOCK];
    for (ac, sc) in a.chunks_mut(HALF_BLOCK).zip(s.chunks(HALF_BLOCK)) {
        let n = ac.len();
        C::to_f32(&mut fa[..n], ac);
        C::to_f32(&mut fs[..n], sc);
        combine_plain(op, &mut fa[..n], &fs[..n]);
        C::from_f32(ac, &fa[..n]);
    }
}

fn map_half<C: HalfConv>(a: &mut [u16], f: impl Fn(f32) -> f32) {
    let mut fa = [0f32; HALF_BLOCK];
    for ac in a.chunks_mut(HALF_BLOCK) {
        let n = ac.len();
        C::to_f32(&mut fa[..n], ac);
        fa[..n].iter_mut().for_each(|x| *x = f(*x));
        C::from_f32(ac, &fa[..n]);
    }
}

/// bf16 bits → f32 (exact).
#[inline(always)]
fn bf16_widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 → bf16 bits, round to nearest even; NaN stays a quiet NaN.
#[inline(always)]
fn bf16_narrow(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    if x.is_nan() {
        ((b >> 16) as u16) | 0x0040
    } else {
        rounded
    }
}

/// Widen, combine in f32, round once: one fused pass the compiler vectorises.
#[inline(always)]
fn combine_bf16_generic(op: ReduceOp, a: &mut [u16], s: &[u16]) {
    macro_rules! fused {
        ($f:expr) => {
            a.iter_mut()
                .zip(s)
                .for_each(|(x, y)| *x = bf16_narrow($f(bf16_widen(*x), bf16_widen(*y))))
        };
    }
    match op {
        ReduceOp::Sum => fused!(|x: f32, y: f32| x + y),
        ReduceOp::Product => fused!(|x: f32, y: f32| x * y),
        ReduceOp::Min => fused!(|x: f32, y: f32| if y < x { y } else { x }),
        ReduceOp::Max => fused!(|x: f32, y: f32| if y > x { y } else { x }),
        _ => unreachable!("checked by ReduceOp::check_dtype"),
    }
}

fn combine_bf16(op: ReduceOp, a: &mut [u16], s: &[u16]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), the only requirement of this fn.
        return unsafe { combine_bf16_avx2(op, a, s) };
    }
    combine_bf16_generic(op, a, s)
}

/// The generic loop compiled with AVX2 enabled (8 lanes instead of SSE2's 4).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn combine_bf16_avx2(op: ReduceOp, a: &mut [u16], s: &[u16]) {
    combine_bf16_generic(op, a, s)
}

fn combine_f16(op: ReduceOp, a: &mut [u16], s: &[u16]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx") && std::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU supports AVX and F16C (checked just above), the only requirements.
        return unsafe { combine_f16_f16c(op, a, s) };
    }
    combine_half::<F16Conv>(op, a, s)
}

/// f16 with hardware conversion: 8 halves → 8 floats, combine, round back (nearest even).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn combine_f16_f16c(op: ReduceOp, a: &mut [u16], s: &[u16]) {
    use std::arch::x86_64::*;
    let n = a.len().min(s.len());
    let body = n - n % 8;
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= n, so both 16-byte loads/stores stay inside the slices; unaligned
        // load/store intrinsics have no alignment requirement.
        unsafe {
            let pa = a.as_mut_ptr().add(i);
            let pb = s.as_ptr().add(i);
            let x = _mm256_cvtph_ps(_mm_loadu_si128(pa as *const __m128i));
            let y = _mm256_cvtph_ps(_mm_loadu_si128(pb as *const __m128i));
            let r = match op {
                ReduceOp::Sum => _mm256_add_ps(x, y),
                ReduceOp::Product => _mm256_mul_ps(x, y),
                ReduceOp::Min => _mm256_min_ps(y, x),
                ReduceOp::Max => _mm256_max_ps(y, x),
                _ => unreachable!("checked by ReduceOp::check_dtype"),
            };
            _mm_storeu_si128(
                pa as *mut __m128i,
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r),
            );
        }
        i += 8;
    }
    combine_half::<F16Conv>(op, &mut a[body..n], &s[body..n]);
}

// Keep the named types referenced so the element mapping above stays in sync with dtype.rs.
const _: () = {
    assert!(std::mem::size_of::<bf16>() == 2 && std::mem::size_of::<f16>() == 2);
    assert!(std::mem::size_of::<c32>() == 8 && std::mem::size_of::<c64>() == 16);
};

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn ids_and_names_match_pytorch() {
        let ops = [
            ReduceOp::Sum,
            ReduceOp::Avg,
            ReduceOp::Product,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Band,
            ReduceOp::Bor,
            ReduceOp::Bxor,
            ReduceOp::PremulSum(2.0),
        ];
        for (i, op) in ops.iter().enumerate() {
            assert_eq!(op.id() as usize, i);
            assert_eq!(ReduceOp::from_id(i as u8, 2.0), Some(*op));
        }
        assert_eq!(
            ReduceOp::parse("foo").unwrap_err().to_string(),
            "Unrecognized reduce_op: foo"
        );
        assert!(ReduceOp::Sum.supports_complex() && !ReduceOp::Max.supports_complex());
    }

    #[test]
    fn dtype_checks_give_clear_errors() {
        let e = ReduceOp::Band.check_dtype(DType::F32).unwrap_err();
        assert!(e
            .to_string()
            .contains("Cannot use ReduceOp.BAND with non-integral dtype"));
        assert!(ReduceOp::Max
            .check_dtype(DType::Complex64)
            .unwrap_err()
            .to_string()
            .contains("complex"));
        assert!(ReduceOp::PremulSum(1.0).check_dtype(DType::I32).is_err());
        assert!(ReduceOp::Bxor.check_dtype(DType::Bool).is_ok());
        let mut a = bytes(&[1.0f32]);
        assert!(reduce_into(ReduceOp::Bor, DType::F32, &mut a, &bytes(&[1.0f32])).is_err());
        assert!(reduce_into(ReduceOp::Sum, DType::F32, &mut a, &[0u8; 8]).is_err());
    }

    #[test]
    fn every_op_on_every_allowed_dtype_matches_a_scalar_reference() {
        // rank r contributes r+1 for r in 0..4 (PyTorch's test pattern).
        let w = 4usize;
        for op in [
            ReduceOp::Sum,
            ReduceOp::Product,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Avg,
        ] {
            let mut acc = bytes(&[1i64; 3]);
            for r in 1..w {
                reduce_into(op, DType::I64, &mut acc, &bytes(&[(r + 1) as i64; 3])).unwrap();
            }
            finalize(op, DType::I64, &mut acc, w).unwrap();
            let got: &[i64] = bytemuck::cast_slice(&acc);
            let want = match op {
                ReduceOp::Sum => 10,
                ReduceOp::Product => 24,
                ReduceOp::Min => 1,
                ReduceOp::Max => 4,
                ReduceOp::Avg => 2,
                _ => unreachable!(),
            };
            assert_eq!(got, &[want; 3], "{op}");
        }
        // bitwise on i32: r | (1<<i)
        let mut acc = bytes(&[1i32, 1 | 2]);
        reduce_into(ReduceOp::Band, DType::I32, &mut acc, &bytes(&[2i32, 2])).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&acc), &[0, 2]);
        // bool SUM is OR, PRODUCT is AND
        let mut b = vec![0u8, 1, 0, 1];
        reduce_into(ReduceOp::Sum, DType::Bool, &mut b, &[0, 0, 1, 1]).unwrap();
        assert_eq!(b, vec![0, 1, 1, 1]);
        reduce_into(ReduceOp::Product, DType::Bool, &mut b, &[1, 0, 1, 0]).unwrap();
        assert_eq!(b, vec![0, 0, 1, 0]);
        // complex SUM and AVG
        let mut c = bytes(&[c32 { re: 1.0, im: 2.0 }]);
        reduce_into(
            ReduceOp::Avg,
            DType::Complex64,
            &mut c,
            &bytes(&[c32 { re: 3.0, im: 4.0 }]),
        )
        .unwrap();
        finalize(ReduceOp::Avg, DType::Complex64, &mut c, 2).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<u8, c32>(&c),
            &[c32 { re: 2.0, im: 3.0 }]
        );
        // PREMUL_SUM on f64
        let mut p = bytes(&[1.0f64, 2.0]);
        prescale(ReduceOp::PremulSum(3.0), DType::F64, &mut p).unwrap();
        let mut q = bytes(&[2.0f64, 2.0]);
        prescale(ReduceOp::PremulSum(3.0), DType::F64, &mut q).unwrap();
        reduce_into(ReduceOp::PremulSum(3.0), DType::F64, &mut p, &q).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f64>(&p), &[9.0, 12.0]);
    }

    #[test]
    fn half_types_combine_in_f32_and_round_once() {
        // Each pairwise step is the correctly rounded f32 result, never a half-precision
        // intermediate: 1000 + 0.5 + ... and large products stay exact where representable.
        let xs: Vec<f32> = (0..512).map(|i| (i as f32 - 256.0) * 0.37).collect();
        let ys: Vec<f32> = (0..512).map(|i| (i as f32 * 1.3).sin() * 100.0).collect();
        for op in [
            ReduceOp::Sum,
            ReduceOp::Product,
            ReduceOp::Min,
            ReduceOp::Max,
        ] {
            let a16: Vec<f16> = xs.iter().map(|x| f16::from_f32(*x)).collect();
            let b16: Vec<f16> = ys.iter().map(|x| f16::from_f32(*x)).collect();
            let mut acc = bytes(&a16);
            reduce_into(op, DType::F16, &mut acc, &bytes(&b16)).unwrap();
            let got: &[f16] = bytemuck::cast_slice(&acc);
            let a2: Vec<bf16> = xs.iter().map(|x| bf16::from_f32(*x)).collect();
            let b2: Vec<bf16> = ys.iter().map(|x| bf16::from_f32(*x)).collect();
            let mut acc2 = bytes(&a2);
            reduce_into(op, DType::BF16, &mut acc2, &bytes(&b2)).unwrap();
            let got2: &[bf16] = bytemuck::cast_slice(&acc2);
            let f = |x: f32, y: f32| match op {
                ReduceOp::Sum => x + y,
                ReduceOp::Product => x * y,
                ReduceOp::Min => x.min(y),
                _ => x.max(y),
            };
            for i in 0..xs.len() {
                let want = f16::from_f32(f(a16[i].to_f32(), b16[i].to_f32()));
                assert_eq!(got[i].to_bits(), want.to_bits(), "f16 {op} at {i}");
                let want2 = bf16::from_f32(f(a2[i].to_f32(), b2[i].to_f32()));
                assert_eq!(got2[i].to_bits(), want2.to_bits(), "bf16 {op} at {i}");
            }
        }
        // 200 contributions of 0.1 summed pairwise (as a tree would) stay within 1e-2 relative.
        let mut vals: Vec<Vec<u8>> = (0..200).map(|_| bytes(&[f16::from_f32(0.1)])).collect();
        while vals.len() > 1 {
            let b = vals.pop().unwrap();
            let mut a = vals.remove(0);
            reduce_into(ReduceOp::Sum, DType::F16, &mut a, &b).unwrap();
            vals.push(a);
        }
        let total = bytemuck::cast_slice::<u8, f16>(&vals[0])[0].to_f32();
        assert!((total - 20.0).abs() / 20.0 < 1e-2, "{total}");
    }

    #[test]
    fn bf16_rounding_is_nearest_even() {
        for x in [
            1.0f32,
            1.003_906_3,
            1.011_718_8,
            -3.5e-3,
            65504.0,
            f32::INFINITY,
        ] {
            let mut out = [0u16];
            Bf16Conv::from_f32(&mut out, &[x]);
            assert_eq!(out[0], bf16::from_f32(x).to_bits(), "{x}");
        }
        let mut out = [0u16];
        Bf16Conv::from_f32(&mut out, &[f32::NAN]);
        assert!(bf16::from_bits(out[0]).is_nan());
    }

    proptest! {
        #[test]
        fn unaligned_and_aligned_paths_agree(v in proptest::collection::vec(-1000i32..1000, 1..300), w in proptest::collection::vec(-1000i32..1000, 300)) {
            let n = v.len();
            let a = bytes(&v);
            let b = bytes(&w[..n]);
            let mut aligned = a.clone();
            reduce_into(ReduceOp::Max, DType::I32, &mut aligned, &b).unwrap();
            // Shift by one byte to force the unaligned path.
            let mut ua = vec![0u8; a.len() + 1];
            ua[1..].copy_from_slice(&a);
            let mut ub = vec![0u8; b.len() + 1];
            ub[1..].copy_from_slice(&b);
            reduce_into(ReduceOp::Max, DType::I32, &mut ua[1..], &ub[1..]).unwrap();
            prop_assert_eq!(&ua[1..], &aligned[..]);
            let want: Vec<i32> = v.iter().zip(&w).map(|(x, y)| *x.max(y)).collect();
            prop_assert_eq!(bytemuck::cast_slice::<u8, i32>(&aligned), &want[..]);
        }
    }
}
