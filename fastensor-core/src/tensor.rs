//! Tensor descriptors: name, dtype and shape.

use crate::{DType, Error, ErrorKind, Result};

/// Describes a tensor without holding its data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorDesc {
    /// The tensor's name, e.g. `"h.0.attn.c_attn.weight"`.
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// The dimensions; empty for a 0-d (scalar) tensor.
    pub shape: Vec<u64>,
}

impl TensorDesc {
    /// A new descriptor.
    pub fn new(name: impl Into<String>, dtype: DType, shape: impl Into<Vec<u64>>) -> Self {
        TensorDesc {
            name: name.into(),
            dtype,
            shape: shape.into(),
        }
    }

    /// Number of elements (1 for a 0-d tensor), or an error if it overflows `u64`.
    pub fn numel(&self) -> Result<u64> {
        self.shape.iter().try_fold(1u64, |acc, &d| {
            acc.checked_mul(d).ok_or_else(|| self.overflow())
        })
    }

    /// Size of the tensor's data in bytes, or an error if it overflows `u64`.
    pub fn byte_len(&self) -> Result<u64> {
        self.numel()?
            .checked_mul(self.dtype.size() as u64)
            .ok_or_else(|| self.overflow())
    }

    fn overflow(&self) -> Error {
        Error::new(
            ErrorKind::InvalidInput,
            format!(
                "tensor `{}`: shape {:?} of {} overflows a 64-bit byte count",
                self.name, self.shape, self.dtype
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_len_counts_elements_times_size() {
        assert_eq!(
            TensorDesc::new("a", DType::F32, [2, 3]).byte_len().unwrap(),
            24
        );
        assert_eq!(TensorDesc::new("s", DType::F64, []).byte_len().unwrap(), 8);
        assert_eq!(
            TensorDesc::new("e", DType::F16, [0, 7]).byte_len().unwrap(),
            0
        );
        let big = TensorDesc::new("big", DType::F64, [u64::MAX / 2, 3]);
        assert_eq!(big.byte_len().unwrap_err().kind(), ErrorKind::InvalidInput);
    }
}
