//! `posix`: page-cache `pread`/`pwrite`, `fdatasync` on sync. The path `torch.save` takes,
//! and the baseline every other backend is compared with.

use crate::sys;
use fastensor_core::write_end;
use fastensor_core::{
    Availability, Backend, BackendFile, Capabilities, Error, MemMut, MemRef, OpenMode, ReadRequest,
    Result,
};
use std::fs::File;
use std::path::{Path, PathBuf};

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
        Capabilities::default()
    }

    fn probe(&self) -> Availability {
        Availability::Available
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        let file = sys::open_file(path, mode, false, POSIX)?;
        Ok(Box::new(PosixFile {
            file,
            path: path.to_path_buf(),
        }))
    }
}

/// An open file of the `posix` backend.
#[derive(Debug)]
struct PosixFile {
    file: File,
    path: PathBuf,
}

impl PosixFile {
    fn err(&self, e: std::io::Error, what: &str, offset: u64) -> Error {
        sys::transfer_error(e, what, POSIX, &self.path, offset)
    }
}

impl BackendFile for PosixFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let buf = dst.host_for(POSIX, &self.path)?;
        sys::pread_full(&self.file, buf, offset).map_err(|e| self.err(e, "read failed", offset))
    }

    /// See `read_batch_through_cache`: the batch's ranges are asked for up front.
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        crate::read_batch_through_cache(self, &self.file, requests)
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let buf = src.host_for(POSIX, &self.path)?;
        write_end(offset, buf.len(), POSIX, &self.path)?;
        sys::pwrite_all(&self.file, buf, offset).map_err(|e| self.err(e, "write failed", offset))
    }

    fn sync(&self) -> Result<()> {
        sys::sync_file(&self.file, POSIX, &self.path)
    }

    fn len(&self) -> Result<u64> {
        sys::file_len(&self.file, POSIX, &self.path)
    }

    fn set_len(&self, len: u64) -> Result<()> {
        sys::set_file_len(&self.file, len, POSIX, &self.path)
    }
}
