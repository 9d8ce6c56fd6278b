//! NCCL's element-wise reductions, computed on the CPU.
//!
//! NCCL reduces in three phases per element: a pre-op on each rank's input
//! (the scalar multiply of `PreMulSum`), a binary fold across ranks, and a
//! post-op on the result (the division of an integer `Avg`). [`reduce`] follows
//! that model with one generic path, `run`, over every data type; the data
//! types differ only in how an element is loaded and stored (`Codec`) and in
//! their arithmetic (`Num`).
//!
//! Where this simulation and NCCL may differ:
//! - float16, bfloat16 and both fp8 types are widened to `f32`, reduced in
//!   `f32` in rank order, and rounded to the data type once at the end. NCCL
//!   rounds after every step of its reduction tree (and fp8 goes through
//!   float16), so results can differ in the last bit.
//! - `Avg` on floats sums and then divides by the number of ranks; NCCL
//!   multiplies each input by `1/n` first, so results can differ in the last
//!   bit.
//! - `PreMulSum` rounds each product to the data type before summing, as
//!   NCCL's per-type multiply (`__hmul` for float16) does.
//! - `Max`/`Min` on floats return NaN when any input is NaN.
//! - Both fp8 types convert from `f32` with round-to-nearest-even and
//!   saturation to the largest finite value (±448 for e4m3, ±57344 for e5m2),
//!   as CUDA's `__nv_fp8_*` constructors (`__NV_SATFINITE`) that NCCL uses do:
//!   even an infinite e5m2 result is stored as ±57344. NaN stays NaN.

use half::{bf16, f16};

/// The size in bytes of one element of an NCCL data type, or `None` for an
/// unknown code.
///
/// NCCL data type codes (nccl.h): 0 int8, 1 uint8, 2 int32, 3 uint32, 4 int64,
/// 5 uint64, 6 float16, 7 float32, 8 float64, 9 bfloat16, 10 float8 e4m3 (fn:
/// no infinities, largest finite 448), 11 float8 e5m2.
pub fn dtype_size(dtype: i32) -> Option<usize> {
    match dtype {
        0 | 1 | 10 | 11 => Some(1),
        6 | 9 => Some(2),
        2 | 3 | 7 => Some(4),
        4 | 5 | 8 => Some(8),
        _ => None,
    }
}

/// An NCCL reduction operation.
#[derive(Clone, Debug, PartialEq)]
pub enum RedOp {
    /// Sum; integers wrap on overflow.
    Sum,
    /// Product; integers wrap on overflow.
    Prod,
    /// Maximum; NaN if any float input is NaN.
    Max,
    /// Minimum; NaN if any float input is NaN.
    Min,
    /// Sum divided by the number of ranks (integers: the wrapped sum divided
    /// with truncation toward zero, as C does).
    Avg,
    /// Each input multiplied by a scalar, then summed: NCCL's
    /// `ncclRedOpCreatePreMulSum` with a host scalar. The scalar is one element
    /// of the data type, as raw little-endian bytes.
    PreMulSum(Vec<u8>),
}

/// Reduces `inputs` (one byte slice per rank, in rank order, each
/// `count * dtype_size(dtype)` bytes) into `out` (the same length), element by
/// element, with NCCL's semantics (see the module documentation for where a
/// float result can differ from NCCL's in the last bit).
///
/// Slices may be unaligned. Fails, without panicking, for an unknown data
/// type, no inputs, an `out` that is not a whole number of elements, an input
/// whose length differs from `out`'s, or a `PreMulSum` scalar that is not
/// exactly one element.
pub fn reduce(dtype: i32, op: &RedOp, inputs: &[&[u8]], out: &mut [u8]) -> Result<(), String> {
    let size = dtype_size(dtype).ok_or_else(|| format!("unknown NCCL data type {dtype}"))?;
    check_lengths(size, inputs, out)?;
    match dtype {
        0 => run(native::<i8>(), op, inputs, out),
        1 => run(native::<u8>(), op, inputs, out),
        2 => run(native::<i32>(), op, inputs, out),
        3 => run(native::<u32>(), op, inputs, out),
        4 => run(native::<i64>(), op, inputs, out),
        5 => run(native::<u64>(), op, inputs, out),
        6 => run(F16, op, inputs, out),
        7 => run(native::<f32>(), op, inputs, out),
        8 => run(native::<f64>(), op, inputs, out),
        9 => run(BF16, op, inputs, out),
        10 => run(E4M3_CODEC, op, inputs, out),
        11 => run(E5M2_CODEC, op, inputs, out),
        _ => Err(format!("unknown NCCL data type {dtype}")),
    }
}

/// Checks that there is at least one input, that `out` holds whole elements,
/// and that every input is as long as `out`.
fn check_lengths(size: usize, inputs: &[&[u8]], out: &[u8]) -> Result<(), String> {
    if inputs.is_empty() {
        return Err("reduce needs at least one input".into());
    }
    if !out.len().is_multiple_of(size) {
        return Err(format!(
            "output length {} is not a multiple of the element size {size}",
            out.len()
        ));
    }
    match inputs.iter().position(|input| input.len() != out.len()) {
        Some(rank) => Err(format!(
            "input {rank} has {} bytes but the output has {}",
            inputs[rank].len(),
            out.len()
        )),
        None => Ok(()),
    }
}

/// Reduces every element of `inputs` into `out` with the kernel for `op`.
/// Lengths must already have been checked.
fn run<T: Num>(
    codec: Codec<T>,
    op: &RedOp,
    inputs: &[&[u8]],
    out: &mut [u8],
) -> Result<(), String> {
    let kernel = Kernel::new(codec, op, inputs.len())?;
    for (i, dst) in out.chunks_exact_mut(codec.size).enumerate() {
        let at = i * codec.size..(i + 1) * codec.size;
        let mut values = inputs
            .iter()
            .map(|input| (kernel.pre)((codec.load)(&input[at.clone()])));
        let first = values.next().ok_or("reduce needs at least one input")?;
        let folded = values.fold(first, kernel.fold);
        (codec.store)((kernel.post)(folded), dst);
    }
    Ok(())
}

/// How one element of a data type is read into, and written from, its
/// arithmetic type `T` (the type itself, or `f32` for the narrow floats).
struct Codec<T> {
    /// Bytes per element.
    size: usize,
    /// Reads one element from exactly `size` little-endian bytes.
    load: fn(&[u8]) -> T,
    /// Writes one element, rounding to the data type, into exactly `size` bytes.
    store: fn(T, &mut [u8]),
}

// Derived `Clone`/`Copy` would needlessly require `T: Copy`.
impl<T> Clone for Codec<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Codec<T> {}

impl<T> Codec<T> {
    /// Rounds `value` to the data type (a store and a load); the identity for
    /// types that are their own arithmetic type.
    fn round(&self, value: T) -> T {
        let mut buf = [0u8; 8];
        let bytes = &mut buf[..self.size];
        (self.store)(value, bytes);
        (self.load)(bytes)
    }
}

/// NCCL's three phases for one operation: `pre` on each input element, `fold`
/// across ranks in rank order (rank 0 first), `post` on the folded value.
struct Kernel<T> {
    /// Applied to each rank's element before folding.
    pre: Box<dyn Fn(T) -> T>,
    /// Combines the running value with the next rank's element.
    fold: fn(T, T) -> T,
    /// Applied to the folded value before it is stored.
    post: Box<dyn Fn(T) -> T>,
}

impl<T: Num> Kernel<T> {
    /// The kernel for `op` over `ranks` inputs of a type read by `codec`.
    fn new(codec: Codec<T>, op: &RedOp, ranks: usize) -> Result<Self, String> {
        let identity = || -> Box<dyn Fn(T) -> T> { Box::new(|x| x) };
        let fold_only = |fold: fn(T, T) -> T| Kernel {
            pre: identity(),
            fold,
            post: identity(),
        };
        Ok(match op {
            RedOp::Sum => fold_only(T::plus),
            RedOp::Prod => fold_only(T::times),
            RedOp::Max => fold_only(T::maximum),
            RedOp::Min => fold_only(T::minimum),
            RedOp::Avg => Kernel {
                post: Box::new(move |x: T| x.div_count(ranks)),
                ..fold_only(T::plus)
            },
            RedOp::PreMulSum(scalar) => {
                if scalar.len() != codec.size {
                    return Err(format!(
                        "PreMulSum scalar has {} bytes, expected {}",
                        scalar.len(),
                        codec.size
                    ));
                }
                let scalar = (codec.load)(scalar);
                let pre = Box::new(move |x: T| codec.round(x.times(scalar)));
                Kernel {
                    pre,
                    ..fold_only(T::plus)
                }
            }
        })
    }
}

/// The arithmetic of one family: wrapping integers, or IEEE floats with NaN
/// propagating through `maximum`/`minimum`.
trait Num: Copy + 'static {
    /// `self + other` (wrapping for integers).
    fn plus(self, other: Self) -> Self;
    /// `self * other` (wrapping for integers).
    fn times(self, other: Self) -> Self;
    /// The larger value (NaN if either is NaN).
    fn maximum(self, other: Self) -> Self;
    /// The smaller value (NaN if either is NaN).
    fn minimum(self, other: Self) -> Self;
    /// `self / n`, truncating toward zero for integers; `n` is at least 1.
    fn div_count(self, n: usize) -> Self;
}

/// Types stored as themselves, little-endian.
trait Native: Num {
    /// Reads one value from exactly `size_of::<Self>()` bytes.
    fn load(bytes: &[u8]) -> Self;
    /// Writes one value into exactly `size_of::<Self>()` bytes.
    fn store(self, bytes: &mut [u8]);
}

/// The codec of a type stored as itself.
fn native<T: Native>() -> Codec<T> {
    Codec {
        size: std::mem::size_of::<T>(),
        load: T::load,
        store: T::store,
    }
}

/// Copies a slice of exactly `N` bytes into an array (any alignment).
fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(bytes);
    out
}

/// Implements [`Native`] for primitive number types.
macro_rules! native {
    ($($t:ty),*) => {$(
        impl Native for $t {
            fn load(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(array(bytes))
            }
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
native!(i8, u8, i32, u32, i64, u64, f32, f64);

/// Implements [`Num`] for integers: wrapping, with C's truncating division.
macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn plus(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            fn times(self, other: Self) -> Self {
                self.wrapping_mul(other)
            }
            fn maximum(self, other: Self) -> Self {
                Ord::max(self, other)
            }
            fn minimum(self, other: Self) -> Self {
                Ord::min(self, other)
            }
            fn div_count(self, n: usize) -> Self {
                // In i128 the divisor never wraps; the quotient's magnitude is
                // at most `self`'s, so it fits back.
                let n = i128::try_from(n).unwrap_or(i128::MAX);
                (i128::from(self) / n) as $t
            }
        }
    )*};
}
int_num!(i8, u8, i32, u32, i64, u64);

/// Implements [`Num`] for `f32` and `f64`.
macro_rules! float_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn plus(self, other: Self) -> Self {
                self + other
            }
            fn times(self, other: Self) -> Self {
                self * other
            }
            fn maximum(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() { <$t>::NAN } else { self.max(other) }
            }
            fn minimum(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() { <$t>::NAN } else { self.min(other) }
            }
            fn div_count(self, n: usize) -> Self {
                self / n as $t
            }
        }
    )*};
}
float_num!(f32, f64);

/// float16, reduced in `f32`.
const F16: Codec<f32> = Codec {
    size: 2,
    load: |b| f16::from_le_bytes(array(b)).to_f32(),
    store: |v, b| b.copy_from_slice(&f16::from_f32(v).to_le_bytes()),
};

/// bfloat16, reduced in `f32`.
const BF16: Codec<f32> = Codec {
    size: 2,
    load: |b| bf16::from_le_bytes(array(b)).to_f32(),
    store: |v, b| b.copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
};

/// float8 e4m3, reduced in `f32`.
const E4M3_CODEC: Codec<f32> = Codec {
    size: 1,
    load: |b| E4M3.decode(b[0]),
    store: |v, b| b[0] = E4M3.encode(v),
};

/// float8 e5m2, reduced in `f32`.
const E5M2_CODEC: Codec<f32> = Codec {
    size: 1,
    load: |b| E5M2.decode(b[0]),
    store: |v, b| b[0] = E5M2.encode(v),
};

/// An 8-bit float layout: 1 sign bit, then exponent, then `mant` mantissa bits.
struct Fp8 {
    /// Mantissa bits.
    mant: u32,
    /// Exponent bias.
    bias: i32,
    /// The largest finite value; larger magnitudes saturate to it.
    max: f32,
    /// The NaN code written (with the sign bit).
    nan: u8,
    /// Whether the all-ones exponent means infinity/NaN as in IEEE (e5m2);
    /// otherwise only the all-ones code `0x7f` is NaN (e4m3fn).
    ieee: bool,
}

/// float8 e4m3fn: exponent bias 7, 3 mantissa bits, no infinities, NaN `0x7f`.
const E4M3: Fp8 = Fp8 {
    mant: 3,
    bias: 7,
    max: 448.0,
    nan: 0x7f,
    ieee: false,
};

/// float8 e5m2: exponent bias 15, 2 mantissa bits, IEEE infinities and NaNs.
const E5M2: Fp8 = Fp8 {
    mant: 2,
    bias: 15,
    max: 57344.0,
    nan: 0x7e,
    ieee: true,
};

impl Fp8 {
    /// The exact value of the code `bits`.
    fn decode(&self, bits: u8) -> f32 {
        let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
        let magnitude = bits & 0x7f;
        let exponent = i32::from(magnitude >> self.mant);
        let mantissa = magnitude & ((1 << self.mant) - 1);
        let all_ones = i32::from(0x7f_u8 >> self.mant);
        if self.ieee && exponent == all_ones {
            return if mantissa == 0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            };
        }
        if !self.ieee && magnitude == 0x7f {
            return f32::NAN;
        }
        // Subnormals (exponent 0) have no implicit bit and the exponent of 1.
        let implicit = if exponent == 0 { 0 } else { 1 << self.mant };
        let scale = 2f32.powi(exponent.max(1) - self.bias - self.mant as i32);
        sign * f32::from(implicit + mantissa) * scale
    }

    /// The code nearest `value` (ties to even), saturating to `±max`.
    fn encode(&self, value: f32) -> u8 {
        let sign = if value.is_sign_negative() { 0x80 } else { 0 };
        if value.is_nan() {
            return sign | self.nan;
        }
        // Clamping first equals rounding then clamping: `max` is representable.
        let magnitude = f64::from(value.abs().min(self.max));
        let min_exponent = 1 - self.bias;
        let exponent = binary_exponent(magnitude).max(min_exponent);
        let ulp = 2f64.powi(exponent - self.mant as i32);
        // Significand in units of `ulp`: in [2^mant, 2^(mant+1)] for normals
        // (the top end carries into the next exponent), below for subnormals.
        let significand = (magnitude / ulp).round_ties_even() as i32;
        let code = ((exponent - min_exponent) << self.mant) + significand;
        sign | u8::try_from(code).unwrap_or(self.nan)
    }
}

/// `floor(log2(x))` for a positive normal `x`; very negative for zero.
fn binary_exponent(x: f64) -> i32 {
    let biased = (x.to_bits() >> 52) & 0x7ff;
    i32::try_from(biased).unwrap_or(0) - 1023
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANKS: usize = 3;

    /// The expected result of element `i`.
    type Expect<'a, T> = Box<dyn Fn(usize) -> T + 'a>;
    const COUNT: usize = 4;

    /// Runs `reduce` on owned inputs and returns the output.
    fn run_op(dtype: i32, op: &RedOp, inputs: &[Vec<u8>]) -> Vec<u8> {
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = vec![0u8; inputs[0].len()];
        reduce(dtype, op, &refs, &mut out).unwrap();
        out
    }

    /// The rank-by-element table `value(rank, i)`.
    fn table<T>(value: impl Fn(usize, usize) -> T) -> Vec<Vec<T>> {
        (0..RANKS)
            .map(|r| (0..COUNT).map(|i| value(r, i)).collect())
            .collect()
    }

    /// Integer reductions against an i128 wrapping reference, for one type.
    macro_rules! int_case {
        ($t:ty, $dtype:expr, $offset:expr) => {{
            let vals = table(|r, i| ((r * 10 + i) as i64 - $offset) as $t);
            let inputs: Vec<Vec<u8>> = vals
                .iter()
                .map(|row| row.iter().flat_map(|v| v.to_le_bytes()).collect())
                .collect();
            let column = |i: usize| vals.iter().map(move |row| i128::from(row[i]));
            let scalar: $t = 3;
            let ops: [(RedOp, Expect<'_, $t>); 6] = [
                (RedOp::Sum, Box::new(|i| column(i).sum::<i128>() as $t)),
                (
                    RedOp::Prod,
                    Box::new(|i| column(i).fold(1i128, i128::wrapping_mul) as $t),
                ),
                (RedOp::Max, Box::new(|i| column(i).max().unwrap() as $t)),
                (RedOp::Min, Box::new(|i| column(i).min().unwrap() as $t)),
                (
                    RedOp::Avg,
                    Box::new(|i| (i128::from(column(i).sum::<i128>() as $t) / RANKS as i128) as $t),
                ),
                (
                    RedOp::PreMulSum(scalar.to_le_bytes().to_vec()),
                    Box::new(|i| column(i).map(|v| v * 3).sum::<i128>() as $t),
                ),
            ];
            for (op, expect) in ops {
                let out = run_op($dtype, &op, &inputs);
                let want: Vec<u8> = (0..COUNT).flat_map(|i| expect(i).to_le_bytes()).collect();
                assert_eq!(out, want, "{} {op:?}", stringify!($t));
            }
        }};
    }

    #[test]
    fn integers_every_op() {
        int_case!(i8, 0, 7);
        int_case!(u8, 1, 0);
        int_case!(i32, 2, 15);
        int_case!(u32, 3, 0);
        int_case!(i64, 4, 15);
        int_case!(u64, 5, 0);
    }

    #[test]
    fn integers_wrap_negative_values_for_unsigned() {
        // Offsets below zero wrap the unsigned inputs to huge values.
        int_case!(u8, 1, 13);
        int_case!(u32, 3, 13);
        int_case!(u64, 5, 13);
    }

    #[test]
    fn integer_wrap_around() {
        let sum = |dtype, a: &[u8], b: &[u8]| run_op(dtype, &RedOp::Sum, &[a.to_vec(), b.to_vec()]);
        assert_eq!(sum(1, &[200], &[100]), [44]);
        assert_eq!(
            sum(0, &100i8.to_le_bytes(), &100i8.to_le_bytes()),
            (-56i8).to_le_bytes()
        );
        assert_eq!(
            sum(2, &i32::MAX.to_le_bytes(), &1i32.to_le_bytes()),
            i32::MIN.to_le_bytes()
        );
        assert_eq!(
            sum(5, &u64::MAX.to_le_bytes(), &2u64.to_le_bytes()),
            1u64.to_le_bytes()
        );
        let prod = run_op(
            4,
            &RedOp::Prod,
            &[i64::MAX.to_le_bytes().to_vec(), 2i64.to_le_bytes().to_vec()],
        );
        assert_eq!(prod, (-2i64).to_le_bytes());
        let premul = run_op(
            3,
            &RedOp::PreMulSum(0x8000_0000u32.to_le_bytes().to_vec()),
            &[3u32.to_le_bytes().to_vec(), 2u32.to_le_bytes().to_vec()],
        );
        assert_eq!(premul, 0x8000_0000u32.to_le_bytes());
    }

    #[test]
    fn integer_avg_truncates_toward_zero() {
        let avg = |a: i32, b: i32| {
            let out = run_op(
                2,
                &RedOp::Avg,
                &[a.to_le_bytes().to_vec(), b.to_le_bytes().to_vec()],
            );
            i32::from_le_bytes(out.try_into().unwrap())
        };
        assert_eq!(avg(-7, 0), -3);
        assert_eq!(avg(7, 0), 3);
        assert_eq!(avg(-1, 0), 0);
        assert_eq!(avg(i32::MAX, 1), i32::MIN / 2); // wrapped sum, then divided
                                                    // uint8: 200 + 100 wraps to 44, and 44 / 2 = 22.
        assert_eq!(run_op(1, &RedOp::Avg, &[vec![200], vec![100]]), [22]);
        // int8 with more ranks than i8::MAX: the divisor does not wrap (255
        // as an i8 would be -1, and -128 / -1 would overflow); the wrapped
        // sum -128 divided by 255 is 0.
        let ranks: Vec<Vec<u8>> = (0..255).map(|_| (-128i8).to_le_bytes().to_vec()).collect();
        assert_eq!(run_op(0, &RedOp::Avg, &ranks), [0]);
    }

    /// One float data type as the tests see it, built from the `half` crate
    /// or from a brute-force nearest-code search (for fp8).
    struct FloatType {
        dtype: i32,
        /// Rounds an exact value to the nearest value of the type.
        round: fn(f64) -> f64,
        /// Encodes a value of the type.
        encode: fn(f64) -> Vec<u8>,
    }

    /// The fp8 code nearest `x` by exhaustive search over the finite codes
    /// (ties to the even code, i.e. even mantissa), clamping to the largest
    /// finite value: independent of `Fp8::encode`'s bit arithmetic.
    fn nearest_fp8(format: &Fp8, x: f64) -> u8 {
        let x = x.clamp(-f64::from(format.max), f64::from(format.max));
        let finite = (0..=255u8).filter(|&c| format.decode(c).is_finite());
        let key = |c: &u8| ((f64::from(format.decode(*c)) - x).abs(), c & 1);
        let best = finite
            .min_by(|a, b| key(a).partial_cmp(&key(b)).unwrap())
            .unwrap();
        // Keep the sign of zero, as a conversion does.
        if format.decode(best) == 0.0 && x.is_sign_negative() {
            0x80
        } else {
            best
        }
    }

    fn float_types() -> Vec<FloatType> {
        vec![
            FloatType {
                dtype: 6,
                round: |x| f16::from_f64(x).to_f64(),
                encode: |x| f16::from_f64(x).to_le_bytes().to_vec(),
            },
            FloatType {
                dtype: 7,
                round: |x| f64::from(x as f32),
                encode: |x| (x as f32).to_le_bytes().to_vec(),
            },
            FloatType {
                dtype: 8,
                round: |x| x,
                encode: |x| x.to_le_bytes().to_vec(),
            },
            FloatType {
                dtype: 9,
                round: |x| bf16::from_f64(x).to_f64(),
                encode: |x| bf16::from_f64(x).to_le_bytes().to_vec(),
            },
            FloatType {
                dtype: 10,
                round: |x| f64::from(E4M3.decode(nearest_fp8(&E4M3, x))),
                encode: |x| vec![nearest_fp8(&E4M3, x)],
            },
            FloatType {
                dtype: 11,
                round: |x| f64::from(E5M2.decode(nearest_fp8(&E5M2, x))),
                encode: |x| vec![nearest_fp8(&E5M2, x)],
            },
        ]
    }

    #[test]
    fn floats_every_op() {
        for ty in float_types() {
            let vals = table(|r, i| (ty.round)((r as f64 + 1.0) * 0.5 + i as f64 * 0.75 - 1.25));
            let inputs: Vec<Vec<u8>> = vals
                .iter()
                .map(|row| row.iter().flat_map(|&v| (ty.encode)(v)).collect())
                .collect();
            let column = |i: usize| vals.iter().map(move |row| row[i]);
            let scalar = 1.5;
            let ops: [(RedOp, Expect<'_, f64>); 6] = [
                (RedOp::Sum, Box::new(|i| column(i).sum::<f64>())),
                (RedOp::Prod, Box::new(|i| column(i).product::<f64>())),
                (RedOp::Max, Box::new(|i| column(i).fold(f64::MIN, f64::max))),
                (RedOp::Min, Box::new(|i| column(i).fold(f64::MAX, f64::min))),
                (
                    RedOp::Avg,
                    Box::new(|i| column(i).sum::<f64>() / RANKS as f64),
                ),
                // The product is rounded to the type before the sum.
                (
                    RedOp::PreMulSum((ty.encode)(scalar)),
                    Box::new(|i| column(i).map(|v| (ty.round)(v * scalar)).sum::<f64>()),
                ),
            ];
            for (op, expect) in ops {
                let out = run_op(ty.dtype, &op, &inputs);
                let want: Vec<u8> = (0..COUNT).flat_map(|i| (ty.encode)(expect(i))).collect();
                assert_eq!(out, want, "dtype {} {op:?}", ty.dtype);
            }
        }
    }

    #[test]
    fn narrow_floats_round_once_at_the_end() {
        // 2048 + 1 + 1 in float16: stepwise rounding would give 2048, one
        // rounding of the f32 sum gives 2050.
        let h = |x: f32| f16::from_f32(x).to_le_bytes().to_vec();
        let out = run_op(6, &RedOp::Sum, &[h(2048.0), h(1.0), h(1.0)]);
        assert_eq!(out, h(2050.0));
        // float32 accumulates in f32, in rank order: each + 4 is a tie that
        // rounds back to 1e8 (an f64 accumulator would give 100000008).
        let f = |x: f32| x.to_le_bytes().to_vec();
        let out = run_op(7, &RedOp::Sum, &[f(1e8), f(4.0), f(4.0)]);
        assert_eq!(out, f(1e8));
    }

    #[test]
    fn premulsum_rounds_each_product_to_the_dtype() {
        // float16: (1 + 2^-10)^2 rounds to 1 + 2^-9, so the sum with
        // -(1 + 2^-10) is 2^-10 (unrounded it would be 2^-10 + 2^-20).
        let h = |x: f64| f16::from_f64(x).to_le_bytes().to_vec();
        let s = 1.0 + 2f64.powi(-10);
        let out = run_op(6, &RedOp::PreMulSum(h(s)), &[h(s), h(-1.0)]);
        assert_eq!(out, h(2f64.powi(-10)));
        // e4m3: 1.125 * 1.125 rounds to 1.25 and -1.25 * 1.125 to -1.375, so
        // the sum is -0.125 (unrounded it would be -0.140625).
        let out = run_op(10, &RedOp::PreMulSum(vec![0x39]), &[vec![0x39], vec![0xba]]);
        assert_eq!(out, [0xa0]);
    }

    #[test]
    fn float_max_min_propagate_nan() {
        let f = |x: f64| x.to_le_bytes().to_vec();
        for op in [RedOp::Max, RedOp::Min] {
            for inputs in [[f(f64::NAN), f(1.0)], [f(1.0), f(f64::NAN)]] {
                let out = run_op(8, &op, &inputs);
                assert!(
                    f64::from_le_bytes(out.try_into().unwrap()).is_nan(),
                    "{op:?}"
                );
            }
            let out = run_op(10, &op, &[vec![0x38], vec![0x7f]]);
            assert!(E4M3.decode(out[0]).is_nan());
            let out = run_op(
                9,
                &op,
                &[
                    bf16::NAN.to_le_bytes().to_vec(),
                    bf16::ONE.to_le_bytes().to_vec(),
                ],
            );
            assert!(bf16::from_le_bytes(out.try_into().unwrap()).is_nan());
        }
    }

    #[test]
    fn float_sum_of_infinities() {
        let f = |x: f32| x.to_le_bytes().to_vec();
        let out = run_op(7, &RedOp::Sum, &[f(f32::INFINITY), f(1.0)]);
        assert_eq!(out, f(f32::INFINITY));
        let out = run_op(7, &RedOp::Sum, &[f(f32::INFINITY), f(f32::NEG_INFINITY)]);
        assert!(f32::from_le_bytes(out.try_into().unwrap()).is_nan());
    }

    #[test]
    fn e4m3_decodes_known_codes() {
        let cases = [
            (0x00, 0.0),
            (0x01, 2f32.powi(-9)),
            (0x07, 7.0 * 2f32.powi(-9)),
            (0x08, 2f32.powi(-6)),
            (0x30, 0.5),
            (0x38, 1.0),
            (0x3c, 1.5),
            (0x40, 2.0),
            (0x77, 240.0),
            (0x7e, 448.0),
            (0xb8, -1.0),
            (0xfe, -448.0),
        ];
        for (code, value) in cases {
            assert_eq!(E4M3.decode(code), value, "{code:#x}");
        }
        assert!(E4M3.decode(0x80) == 0.0 && E4M3.decode(0x80).is_sign_negative());
        assert!(E4M3.decode(0x7f).is_nan() && E4M3.decode(0xff).is_nan());
        assert_eq!((0..=255u8).filter(|&c| E4M3.decode(c).is_nan()).count(), 2);
        assert!((0..=255u8).all(|c| !E4M3.decode(c).is_infinite()));
    }

    #[test]
    fn e5m2_decodes_as_truncated_float16() {
        for code in 0..=255u8 {
            let half = f16::from_bits(u16::from(code) << 8).to_f32();
            let ours = E5M2.decode(code);
            assert!(
                ours == half || (ours.is_nan() && half.is_nan()),
                "{code:#x}: {ours} vs {half}"
            );
        }
        assert_eq!(E5M2.decode(0x7b), 57344.0);
        assert_eq!(E5M2.decode(0x7c), f32::INFINITY);
        assert_eq!(E5M2.decode(0x01), 2f32.powi(-16));
    }

    #[test]
    fn fp8_round_trips_every_finite_code() {
        for format in [&E4M3, &E5M2] {
            for code in 0..=255u8 {
                let value = format.decode(code);
                if value.is_finite() {
                    assert_eq!(format.encode(value), code, "{code:#x} = {value}");
                }
            }
        }
    }

    #[test]
    fn fp8_encode_matches_nearest_search() {
        for format in [&E4M3, &E5M2] {
            let mut values: Vec<f32> = (-20_000..20_000).map(|k| k as f32 / 256.0).collect();
            values.extend((-3000..3000).map(|k| k as f32 * 23.0));
            values.extend((-200..200).map(|k| k as f32 * 2f32.powi(-19)));
            for value in values {
                let want = nearest_fp8(format, f64::from(value));
                assert_eq!(format.encode(value), want, "{value}");
            }
        }
    }

    #[test]
    fn fp8_rounds_to_nearest_even() {
        assert_eq!(E4M3.encode(1.0625), 0x38); // tie between 1 and 1.125: even
        assert_eq!(E4M3.encode(1.1875), 0x3a); // tie between 1.125 and 1.25: even
        assert_eq!(E4M3.encode(1.07), 0x39);
        assert_eq!(E4M3.encode(2f32.powi(-10)), 0x00); // half the smallest subnormal
        assert_eq!(E4M3.encode(1.5 * 2f32.powi(-10)), 0x01);
        assert_eq!(E4M3.encode(-2f32.powi(-12)), 0x80); // underflow keeps the sign
        assert_eq!(E5M2.encode(2.25), 0x40); // tie between 2 and 2.5: even
        assert_eq!(E5M2.encode(2.75), 0x42); // tie between 2.5 and 3: even
    }

    #[test]
    fn fp8_saturates() {
        for value in [449.0, 464.0, 470.0, 1000.0, 1e30, f32::INFINITY] {
            assert_eq!(E4M3.encode(value), 0x7e, "{value}");
            assert_eq!(E4M3.encode(-value), 0xfe, "{value}");
        }
        for value in [57345.0, 61440.0, 1e6, f32::INFINITY] {
            assert_eq!(E5M2.encode(value), 0x7b, "{value}");
            assert_eq!(E5M2.encode(-value), 0xfb, "{value}");
        }
        assert!(E4M3.decode(E4M3.encode(f32::NAN)).is_nan());
        assert!(E5M2.decode(E5M2.encode(f32::NAN)).is_nan());
        // A reduction that overflows saturates too.
        assert_eq!(run_op(10, &RedOp::Sum, &[vec![0x7e], vec![0x7e]]), [0x7e]);
        assert_eq!(run_op(11, &RedOp::Prod, &[vec![0x7b], vec![0x7b]]), [0x7b]);
    }

    #[test]
    fn unaligned_slices() {
        let mut a = vec![0u8];
        a.extend([1.5f64, -2.0].iter().flat_map(|v| v.to_le_bytes()));
        let mut b = vec![0u8, 0];
        b.extend([0.25f64, 8.0].iter().flat_map(|v| v.to_le_bytes()));
        let mut out = [0u8; 17];
        reduce(8, &RedOp::Sum, &[&a[1..], &b[2..]], &mut out[1..]).unwrap();
        let want: Vec<u8> = [1.75f64, 6.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(&out[1..], &want[..]);
    }

    #[test]
    fn single_rank_and_empty_buffers() {
        assert_eq!(
            run_op(2, &RedOp::Avg, &[7i32.to_le_bytes().to_vec()]),
            7i32.to_le_bytes()
        );
        let mut out = [0u8; 0];
        assert_eq!(reduce(7, &RedOp::Max, &[&[], &[]], &mut out), Ok(()));
    }

    #[test]
    fn errors() {
        let mut out = [0u8; 4];
        let four = [0u8; 4];
        for dtype in [-1, 12, 100] {
            assert!(reduce(dtype, &RedOp::Sum, &[&four], &mut out)
                .unwrap_err()
                .contains("data type"));
        }
        let bad_scalar = RedOp::PreMulSum(vec![0; 2]);
        assert!(reduce(7, &bad_scalar, &[&four], &mut out)
            .unwrap_err()
            .contains("scalar"));
        assert!(reduce(7, &RedOp::Sum, &[&four, &[0u8; 8]], &mut out)
            .unwrap_err()
            .contains("input 1"));
        assert!(reduce(7, &RedOp::Sum, &[], &mut out).is_err());
        let mut odd = [0u8; 3];
        assert!(reduce(9, &RedOp::Sum, &[&[0u8; 3]], &mut odd)
            .unwrap_err()
            .contains("multiple"));
        assert_eq!(dtype_size(12), None);
        assert_eq!(
            (0..12).map(|d| dtype_size(d).unwrap()).collect::<Vec<_>>(),
            [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1]
        );
    }
}
