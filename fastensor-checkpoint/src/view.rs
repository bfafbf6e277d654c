//! What a save writes: tensors as descriptors and bytes.

use crate::{MemRef, TensorDesc};

/// A tensor to save: its descriptor and its bytes (host or device memory).
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    /// Name, dtype and shape.
    pub desc: TensorDesc,
    /// The tensor's bytes; exactly `desc.byte_len()` of them.
    pub data: MemRef<'a>,
}

impl<'a> TensorView<'a> {
    /// A view of `data` described by `desc`.
    pub fn new(desc: TensorDesc, data: impl Into<MemRef<'a>>) -> Self {
        TensorView {
            desc,
            data: data.into(),
        }
    }
}

/// Tensors to save: descriptors and bytes, by index.
pub(crate) trait Tensors<'a>: Sync {
    /// Number of tensors.
    fn count(&self) -> usize;
    /// The descriptor of tensor `i`.
    fn desc(&self, i: usize) -> &'a TensorDesc;
    /// The bytes of tensor `i`.
    fn data(&self, i: usize) -> MemRef<'a>;
    /// The whole data section as one buffer, when the tensors lie one after another in it
    /// (it is then written as one, not tensor by tensor).
    fn section(&self) -> Option<MemRef<'a>> {
        None
    }
}
