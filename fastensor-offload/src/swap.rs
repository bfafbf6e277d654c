//! The swap file as the opener gave it.

use fastensor_core::{BackendFile, MemMut, MemRef, Result};

/// The swap file as the opener gave it, read and written with any memory that converts
/// into a [`MemRef`] or [`MemMut`] (a slice, a buffer, device memory).
pub(crate) struct SwapFile(pub(crate) Box<dyn BackendFile>);

impl SwapFile {
    /// Reads at `offset` into `dst`: the bytes read (short only at the end of the file).
    pub(crate) fn read_at<'a>(&self, offset: u64, dst: impl Into<MemMut<'a>>) -> Result<usize> {
        self.0.read_at(offset, dst.into())
    }

    /// Writes all of `src` at `offset`.
    pub(crate) fn write_at<'a>(&self, offset: u64, src: impl Into<MemRef<'a>>) -> Result<()> {
        self.0.write_at(offset, src.into())
    }

    /// Sets the file's length.
    pub(crate) fn set_len(&self, len: u64) -> Result<()> {
        self.0.set_len(len)
    }
}
