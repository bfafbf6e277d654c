//! `posix`: page-cache `pread`/`pwrite`, `fdatasync` on sync. The path `torch.save` takes,
//! and the baseline every other backend is compared with.

use crate::sys;
use fastensor_core::write_end;
use fastensor_core::{
    Backend, BackendFile, Capabilities, MemMut, MemRef, OpenMode, ReadRequest, Result,
};
use fastensor_sys::local::LocalFile;
use std::path::Path;

/// The name of the page-cache backend.
pub const POSIX: &str = "posix";

/// Page-cache `pread`/`pwrite` backend.
#[derive(Debug, Clone, Default)]
pub struct PosixBackend;

impl Backend for PosixBackend {
    fn name(&self) -> &str {
        POSIX
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::local()
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        let file = sys::open_file(path, mode, false, POSIX)?;
        Ok(Box::new(PosixFile {
            local: LocalFile::new(POSIX, file, path.to_path_buf()),
        }))
    }
}

/// An open file of the `posix` backend.
#[derive(Debug)]
struct PosixFile {
    local: LocalFile,
}

impl BackendFile for PosixFile {
    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let buf = dst.host_for(POSIX, self.local.path())?;
        sys::pread_full(self.local.file(), buf, offset)
            .map_err(|e| self.local.err(e, "read failed", offset))
    }

    /// See `read_batch_through_cache`: the batch's ranges are asked for up front.
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        crate::read_batch_through_cache(self, self.local.file(), requests)
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let buf = src.host_for(POSIX, self.local.path())?;
        write_end(offset, buf.len(), POSIX, self.local.path())?;
        sys::pwrite_all(self.local.file(), buf, offset)
            .map_err(|e| self.local.err(e, "write failed", offset))
    }

    fastensor_sys::local_file_methods!(local);
}
