//! A backend's handle opened through the descriptor an engine file keeps on the file it
//! opened (`/proc/self/fd/N`), once its path no longer names that file: the same file
//! whatever was renamed over the path or removed, its errors naming the path it was opened
//! at.

use fastensor_core::{
    Backend, BackendFile, Error, LayeredFile, MemMut, MemRef, OpenMode, ReadRequest, Result,
    WriteRequest,
};
use std::path::{Path, PathBuf};

/// Opens `backend`'s handle at `via` (a path that reaches the file first opened) for the
/// engine file of `path`.
pub(super) fn open(
    backend: &dyn Backend,
    via: &Path,
    path: &Path,
    mode: OpenMode,
) -> Result<Box<dyn BackendFile>> {
    let inner = backend
        .open(via, mode)
        .map_err(|e| e.with_path_renamed(via, path))?;
    Ok(Box::new(Reopened {
        inner,
        via: via.to_path_buf(),
        path: path.to_path_buf(),
    }))
}

/// The handle, and the two names of its file.
struct Reopened {
    inner: Box<dyn BackendFile>,
    via: PathBuf,
    path: PathBuf,
}

impl Reopened {
    fn named(&self, e: Error) -> Error {
        e.with_path_renamed(&self.via, &self.path)
    }
}

impl LayeredFile for Reopened {
    fn inner(&self) -> &dyn BackendFile {
        &*self.inner
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        self.inner.read_at(offset, dst).map_err(|e| self.named(e))
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        self.inner.write_at(offset, src).map_err(|e| self.named(e))
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        self.inner.read_batch(requests).map_err(|e| self.named(e))
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        self.inner.write_batch(requests).map_err(|e| self.named(e))
    }

    fn sync(&self) -> Result<()> {
        self.inner.sync().map_err(|e| self.named(e))
    }

    fn len(&self) -> Result<u64> {
        self.inner.len().map_err(|e| self.named(e))
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.inner.set_len(len).map_err(|e| self.named(e))
    }
}
