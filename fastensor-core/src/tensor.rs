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

    /// Size of the tensor's data in bytes, or an [`ErrorKind::InvalidInput`] error if it
    /// overflows `u64` or, for a packed dtype (`F4`, `F6_*`), the elements do not fill a
    /// whole number of bytes (as the safetensors format requires).
    pub fn byte_len(&self) -> Result<u64> {
        let bits = self
            .numel()?
            .checked_mul(self.dtype.bits() as u64)
            .ok_or_else(|| self.overflow())?;
        if bits % 8 != 0 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "tensor `{}`: {} × {:?} is {bits} bits, not a whole number of bytes",
                    self.name, self.dtype, self.shape
                ),
            ));
        }
        Ok(bits / 8)
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
        // Packed dtypes: two F4 elements a byte, four F6 elements in three bytes.
        assert_eq!(
            TensorDesc::new("f4", DType::F4, [3, 4]).byte_len().unwrap(),
            6
        );
        assert_eq!(
            TensorDesc::new("f6", DType::F6E2M3, [4])
                .byte_len()
                .unwrap(),
            3
        );
        let odd = TensorDesc::new("odd", DType::F4, [3])
            .byte_len()
            .unwrap_err();
        assert!(odd.to_string().contains("whole number of bytes"), "{odd}");
        assert_eq!(
            TensorDesc::new("c", DType::C64, [2]).byte_len().unwrap(),
            16
        );
    }
}
