//! Element types (`torch.dtype`) and the Rust types that carry them.

use crate::error::{DistError, Result};
use half::{bf16, f16};

/// A complex number of two `f32` (`torch.complex64`, PyTorch name "ComplexFloat").
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct c32 {
    /// Real part.
    pub re: f32,
    /// Imaginary part.
    pub im: f32,
}

/// A complex number of two `f64` (`torch.complex128`, PyTorch name "ComplexDouble").
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct c64 {
    /// Real part.
    pub re: f64,
    /// Imaginary part.
    pub im: f64,
}

/// Tensor element type, mirroring `torch.dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `torch.float32`
    F32,
    /// `torch.float64`
    F64,
    /// `torch.float16`
    F16,
    /// `torch.bfloat16`
    BF16,
    /// `torch.int8`
    I8,
    /// `torch.uint8`
    U8,
    /// `torch.int16`
    I16,
    /// `torch.int32`
    I32,
    /// `torch.int64`
    I64,
    /// `torch.bool` (one byte, 0 or 1)
    Bool,
    /// `torch.complex64`
    Complex64,
    /// `torch.complex128`
    Complex128,
}

impl DType {
    /// Every supported dtype, in declaration order.
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::Complex64,
        DType::Complex128,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 | DType::Complex64 => 8,
            DType::Complex128 => 16,
        }
    }

    /// Floating point (real) dtype.
    pub const fn is_floating_point(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Complex dtype.
    pub const fn is_complex(self) -> bool {
        matches!(self, DType::Complex64 | DType::Complex128)
    }

    /// Integral dtype; `bool` counts when `include_bool` (as `torch.is_integral(include_bool)`).
    pub const fn is_integral(self, include_bool: bool) -> bool {
        match self {
            DType::I8 | DType::U8 | DType::I16 | DType::I32 | DType::I64 => true,
            DType::Bool => include_bool,
            _ => false,
        }
    }

    /// PyTorch's C++ scalar type name ("Float", "Long", "BFloat16" ...), as printed in
    /// collective fingerprints.
    pub const fn torch_name(self) -> &'static str {
        match self {
            DType::F32 => "Float",
            DType::F64 => "Double",
            DType::F16 => "Half",
            DType::BF16 => "BFloat16",
            DType::I8 => "Char",
            DType::U8 => "Byte",
            DType::I16 => "Short",
            DType::I32 => "Int",
            DType::I64 => "Long",
            DType::Bool => "Bool",
            DType::Complex64 => "ComplexFloat",
            DType::Complex128 => "ComplexDouble",
        }
    }

    /// Short name as used by benchmarks and the CLI ("float", "bfloat16", "int64" ...).
    pub const fn short_name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F64 => "double",
            DType::F16 => "half",
            DType::BF16 => "bfloat16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::Bool => "bool",
            DType::Complex64 => "complex64",
            DType::Complex128 => "complex128",
        }
    }

    /// Stable one-byte code used on the wire by c10d-rs backends.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Inverse of [`DType::code`].
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(code as usize).copied()
    }

    /// Parses "float32"/"f32"/"float", "bf16"/"bfloat16", "int64"/"long" ... (case-insensitive).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] naming the unknown string.
    pub fn parse(s: &str) -> Result<DType> {
        let d = match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i8" | "int8" | "char" => DType::I8,
            "u8" | "uint8" | "byte" => DType::U8,
            "i16" | "int16" | "short" => DType::I16,
            "i32" | "int32" | "int" => DType::I32,
            "i64" | "int64" | "long" => DType::I64,
            "bool" => DType::Bool,
            "c64" | "complex64" | "cfloat" => DType::Complex64,
            "c128" | "complex128" | "cdouble" => DType::Complex128,
            _ => return Err(DistError::invalid(format!("unknown dtype '{s}'"))),
        };
        Ok(d)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "torch.{}",
            match self {
                DType::F32 => "float32",
                DType::F64 => "float64",
                DType::F16 => "float16",
                DType::BF16 => "bfloat16",
                DType::I8 => "int8",
                DType::U8 => "uint8",
                DType::I16 => "int16",
                DType::I32 => "int32",
                DType::I64 => "int64",
                DType::Bool => "bool",
                DType::Complex64 => "complex64",
                DType::Complex128 => "complex128",
            }
        )
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can be a tensor element. Implemented for `f32`, `f64`, [`half::f16`],
/// [`half::bf16`], `i8`, `u8`, `i16`, `i32`, `i64`, `bool`, [`c32`] and [`c64`].
///
/// Every element type has the size and alignment its dtype needs and every bit pattern the
/// kernels produce is valid for it (`bool` is only ever 0 or 1).
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed + std::fmt::Debug {
    /// The dtype of this element type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t { const DTYPE: DType = DType::$d; }
    )*};
}
element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i8 => I8, u8 => U8, i16 => I16,
    i32 => I32, i64 => I64, bool => Bool, c32 => Complex64, c64 => Complex128);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert!(d.size() >= 1);
        }
        assert_eq!(std::mem::size_of::<c64>(), DType::Complex128.size());
        assert_eq!(DType::parse("BF16").unwrap(), DType::BF16);
        assert!(DType::parse("float8").is_err());
        assert!(DType::Bool.is_integral(true) && !DType::Bool.is_integral(false));
    }
}
