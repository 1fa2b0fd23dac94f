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
    fn names_parse_and_sizes_match() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::ALL.map(DType::size), [2, 2, 4, 8, 1, 2, 4, 8]);
        assert!("f8".parse::<DType>().unwrap_err().contains("\"f8\""));
    }
}
