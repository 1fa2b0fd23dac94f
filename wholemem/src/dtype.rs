//! Element types: what a table, a file or a gather's output holds, and
//! which of them convert into each other. One vocabulary for the memory
//! layer (files), the gather layer (conversion) and the tools.

use std::fmt;
use std::str::FromStr;

/// An element type of a table, a file, or a gather's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
}

/// Why a conversion was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot convert {from} to {to}: {reason}")]
pub struct ConversionError {
    /// The source type.
    pub from: DType,
    /// The destination type.
    pub to: DType,
    /// Why not.
    pub reason: &'static str,
}

impl DType {
    /// Every type.
    pub const ALL: [DType; 8] = [Self::F16, Self::Bf16, Self::F32, Self::F64, Self::I8, Self::I16, Self::I32, Self::I64];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::I8 => 1,
            Self::F16 | Self::Bf16 | Self::I16 => 2,
            Self::F32 | Self::I32 => 4,
            Self::F64 | Self::I64 => 8,
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, Self::F16 | Self::Bf16 | Self::F32 | Self::F64)
    }

    /// The lower-case name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
            Self::F64 => "f64",
            Self::I8 => "i8",
            Self::I16 => "i16",
            Self::I32 => "i32",
            Self::I64 => "i64",
        }
    }

    /// Writes `v` into `out` as one element of this type, little-endian:
    /// floats rounded to the nearest value, integers as Rust's `as` casts
    /// make them (to `i64`, saturating, then cut to the width).
    ///
    /// # Panics
    /// If `out` is not [`size`](Self::size) bytes long.
    pub fn write_f64(self, out: &mut [u8], v: f64) {
        match self {
            Self::F16 => out.copy_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            Self::Bf16 => out.copy_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
            Self::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
            Self::F64 => out.copy_from_slice(&v.to_le_bytes()),
            Self::I8 => out.copy_from_slice(&((v as i64) as i8).to_le_bytes()),
            Self::I16 => out.copy_from_slice(&((v as i64) as i16).to_le_bytes()),
            Self::I32 => out.copy_from_slice(&((v as i64) as i32).to_le_bytes()),
            Self::I64 => out.copy_from_slice(&(v as i64).to_le_bytes()),
        }
    }

    /// Reads the element of this type at the start of `b` (little-endian)
    /// as an `f64`: exact for every type, and for `i64` up to 2^53.
    ///
    /// # Panics
    /// If `b` is shorter than [`size`](Self::size).
    pub fn read_f64(self, b: &[u8]) -> f64 {
        let mut w = [0u8; 8];
        w[..self.size()].copy_from_slice(&b[..self.size()]);
        match self {
            Self::F16 => half::f16::from_le_bytes([w[0], w[1]]).to_f64(),
            Self::Bf16 => half::bf16::from_le_bytes([w[0], w[1]]).to_f64(),
            Self::F32 => f64::from(f32::from_le_bytes([w[0], w[1], w[2], w[3]])),
            Self::F64 => f64::from_le_bytes(w),
            Self::I8 => f64::from(w[0] as i8),
            Self::I16 => f64::from(i16::from_le_bytes([w[0], w[1]])),
            Self::I32 => f64::from(i32::from_le_bytes([w[0], w[1], w[2], w[3]])),
            Self::I64 => i64::from_le_bytes(w) as f64,
        }
    }

    /// Whether gather and scatter may convert `self` into `to`.
    ///
    /// # Errors
    /// [`ConversionError`] for floating ↔ integer.
    pub fn check_conversion(self, to: DType) -> Result<(), ConversionError> {
        if self.is_float() == to.is_float() {
            Ok(())
        } else {
            Err(ConversionError { from: self, to, reason: "floating and integer types do not convert into each other" })
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown element type {s:?}; expected one of f16, bf16, f32, f64, i8, i16, i32, i64"))
    }
}

/// A Rust type that is one of the [`DType`]s (what a typed tensor or buffer holds).
pub trait Element: bytemuck::Pod {
    /// Its [`DType`].
    const DTYPE: DType;
}
macro_rules! element {
    ($($t:ty => $d:ident),*) => {$( impl Element for $t { const DTYPE: DType = DType::$d; } )*};
}
element!(half::f16 => F16, half::bf16 => Bf16, f32 => F32, f64 => F64, i8 => I8, i16 => I16, i32 => I32, i64 => I64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_stay_within_float_or_int() {
        for a in DType::ALL {
            for b in DType::ALL {
                assert_eq!(a.check_conversion(b).is_ok(), a.is_float() == b.is_float(), "{a} -> {b}");
            }
        }
        let e = DType::F32.check_conversion(DType::I32).unwrap_err();
        assert_eq!(e.to_string(), "cannot convert f32 to i32: floating and integer types do not convert into each other");
    }

    #[test]
    fn values_written_read_back_as_written() {
        for d in DType::ALL {
            for v in [-100.5, -1.0, 0.0, 3.5, 100.0] {
                let mut b = vec![0u8; d.size()];
                d.write_f64(&mut b, v);
                let want = if d.is_float() { v } else { v.trunc() };
                assert_eq!(d.read_f64(&b), want, "{d} {v}");
            }
        }
        let mut b = [0u8; 1];
        DType::I8.write_f64(&mut b, 300.0);
        assert_eq!(DType::I8.read_f64(&b), 44.0, "300 cut to 8 bits");
    }

    #[test]
    fn names_parse_and_sizes_match() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::ALL.map(DType::size), [2, 2, 4, 8, 1, 2, 4, 8]);
        assert!("f8".parse::<DType>().unwrap_err().contains("\"f8\""));
    }
}
