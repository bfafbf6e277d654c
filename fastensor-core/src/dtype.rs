//! Element types, named as the safetensors format names them.

use crate::{Error, ErrorKind, Result};
use std::str::FromStr;

/// The element type of a tensor; every dtype the safetensors format defines.
///
/// Most are whole bytes; `F4` (4 bits) and the `F6` types (6 bits) pack several elements
/// into a byte, so a tensor of them must hold a whole number of bytes (see
/// [`TensorDesc::byte_len`](crate::TensorDesc::byte_len)). The header holds the logical
/// shape (elements, not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Boolean, one byte.
    Bool,
    /// 4-bit float, 2 exponent bits and 1 mantissa bit (MX FP4 E2M1), two to a byte.
    F4,
    /// 6-bit float, 2 exponent bits and 3 mantissa bits (MX FP6).
    F6E2M3,
    /// 6-bit float, 3 exponent bits and 2 mantissa bits (MX FP6).
    F6E3M2,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// 8-bit float, 5 exponent bits and 2 mantissa bits.
    F8E5M2,
    /// 8-bit float, 4 exponent bits and 3 mantissa bits.
    F8E4M3,
    /// 8-bit exponent-only scale (MX E8M0).
    F8E8M0,
    /// 8-bit float E4M3, finite, no negative zero (FNUZ).
    F8E4M3Fnuz,
    /// 8-bit float E5M2, finite, no negative zero (FNUZ).
    F8E5M2Fnuz,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half precision float.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single precision float.
    F32,
    /// Complex number of two IEEE single precision floats (real, imaginary).
    C64,
    /// IEEE double precision float.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl DType {
    /// Every dtype, in the order of the safetensors format's own list (by size).
    pub const ALL: [DType; 22] = [
        DType::Bool,
        DType::F4,
        DType::F6E2M3,
        DType::F6E3M2,
        DType::U8,
        DType::I8,
        DType::F8E5M2,
        DType::F8E4M3,
        DType::F8E8M0,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
        DType::I16,
        DType::U16,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::F32,
        DType::C64,
        DType::F64,
        DType::I64,
        DType::U64,
    ];

    /// Size of one element in bits (4 for `F4`, 6 for the `F6` types).
    pub const fn bits(self) -> usize {
        match self {
            DType::F4 => 4,
            DType::F6E2M3 | DType::F6E3M2 => 6,
            DType::Bool
            | DType::U8
            | DType::I8
            | DType::F8E5M2
            | DType::F8E4M3
            | DType::F8E8M0
            | DType::F8E4M3Fnuz
            | DType::F8E5M2Fnuz => 8,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 16,
            DType::I32 | DType::U32 | DType::F32 => 32,
            DType::C64 | DType::I64 | DType::U64 | DType::F64 => 64,
        }
    }

    /// Size of one element in bytes, for the dtypes of whole bytes; `None` for the packed
    /// ones (`F4`, `F6_E2M3`, `F6_E3M2`).
    pub const fn size(self) -> Option<usize> {
        match self.bits() {
            b if b % 8 == 0 => Some(b / 8),
            _ => None,
        }
    }

    /// The safetensors name, e.g. `"BF16"`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "BOOL",
            DType::F4 => "F4",
            DType::F6E2M3 => "F6_E2M3",
            DType::F6E3M2 => "F6_E3M2",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::F8E5M2 => "F8_E5M2",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E8M0 => "F8_E8M0",
            DType::F8E4M3Fnuz => "F8_E4M3FNUZ",
            DType::F8E5M2Fnuz => "F8_E5M2FNUZ",
            DType::I16 => "I16",
            DType::U16 => "U16",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I32 => "I32",
            DType::U32 => "U32",
            DType::F32 => "F32",
            DType::C64 => "C64",
            DType::F64 => "F64",
            DType::I64 => "I64",
            DType::U64 => "U64",
        }
    }
}

display_as_str!(DType, name);

impl FromStr for DType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                let known: Vec<_> = DType::ALL.iter().map(|d| d.name()).collect();
                Error::new(
                    ErrorKind::InvalidInput,
                    format!("unknown dtype `{s}` (known: {})", known.join(", ")),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_are_right() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::BF16.size(), Some(2));
        assert_eq!(DType::F8E4M3.size(), Some(1));
        assert_eq!(DType::F8E5M2Fnuz.size(), Some(1));
        assert_eq!(DType::C64.size(), Some(8));
        assert_eq!(DType::F64.size(), Some(8));
        assert_eq!(DType::F4.size(), None);
        assert_eq!(DType::F4.bits(), 4);
        assert_eq!(DType::F6E3M2.bits(), 6);
        let err = "F128".parse::<DType>().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("F128"));
    }

    #[test]
    fn all_lists_each_dtype_once_in_the_formats_order() {
        // (the safetensors crate's order: BOOL first, then by size)
        for w in DType::ALL.windows(2) {
            assert!(w[0] < w[1], "{} before {}", w[0], w[1]);
        }
        assert_eq!(DType::ALL[0], DType::Bool);
        assert!(DType::ALL[1..]
            .windows(2)
            .all(|w| w[0].bits() <= w[1].bits()));
    }
}
