//! `mmap`: reads through a shared read-only memory map of the file.
//!
//! Writes are not offered: stores into a mapping cannot report a full disk (the process gets
//! `SIGBUS` instead of an error), which breaks the promise that every failure is a typed
//! error. [`Capabilities::write`] says so, and opening for writing fails with
//! [`ErrorKind::Unsupported`].
//!
//! As with every mapping, a file truncated by another process while it is read may raise
//! `SIGBUS`; use another backend for files that others shrink.

use crate::sys;
use fastensor_core::{
    unsupported_memory, Availability, Backend, BackendFile, Capabilities, Error, ErrorKind, MemMut,
    MemRef, OpenMode, Result,
};
use memmap2::{Advice, Mmap};
use parking_lot::RwLock;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The name of the mmap backend.
pub const MMAP: &str = "mmap";

/// Read-only memory-map backend.
#[derive(Debug, Clone, Default)]
pub struct MmapBackend;

impl Backend for MmapBackend {
    fn name(&self) -> &str {
        MMAP
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            write: false,
            ..Capabilities::default()
        }
    }

    fn probe(&self) -> Availability {
        Availability::Available
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        if mode.writable() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "the mmap backend is read-only (a full disk cannot be reported through a mapping)",
            )
            .with_backend(MMAP)
            .with_path(path));
        }
        let file = sys::open_file(path, mode, false, MMAP)?;
        let mapped = MmapFile {
            file,
            path: path.to_path_buf(),
            map: RwLock::new(None),
        };
        mapped.remap()?;
        Ok(Box::new(mapped))
    }
}

/// An open file of the `mmap` backend.
#[derive(Debug)]
struct MmapFile {
    file: File,
    path: PathBuf,
    /// The current mapping; `None` while the file is empty.
    map: RwLock<Option<Mmap>>,
}

impl MmapFile {
    fn err(&self, e: std::io::Error, what: &str, offset: u64) -> Error {
        sys::transfer_error(e, what, MMAP, &self.path, offset)
    }

    /// Maps the file as it is now (after it grew).
    fn remap(&self) -> Result<()> {
        let len = self.len()?;
        let mut slot = self.map.write();
        if slot.as_ref().map_or(0, |m| m.len() as u64) == len {
            return Ok(());
        }
        *slot = if len == 0 {
            None
        } else {
            // SAFETY: the map is read-only and private to this handle; the module docs state
            // the remaining hazard (another process truncating the file).
            let map =
                unsafe { Mmap::map(&self.file) }.map_err(|e| self.err(e, "mmap failed", 0))?;
            Some(map)
        };
        Ok(())
    }

    fn copy_out(&self, offset: u64, dst: &mut [u8]) -> Option<usize> {
        let guard = self.map.read();
        let map_len = guard.as_ref().map_or(0, |m| m.len() as u64);
        if offset + dst.len() as u64 > map_len {
            return None;
        }
        if let Some(map) = guard.as_ref() {
            let start = offset as usize;
            if dst.len() >= 1 << 20 {
                // Ask for the range up front so the page faults find the pages read ahead.
                let _ = map.advise_range(Advice::WillNeed, start, dst.len());
            }
            dst.copy_from_slice(&map[start..start + dst.len()]);
        }
        Some(dst.len())
    }
}

impl BackendFile for MmapFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let MemMut::Host(buf) = dst else {
            return Err(unsupported_memory(MMAP, dst.kind(), &self.path));
        };
        if let Some(n) = self.copy_out(offset, buf) {
            return Ok(n);
        }
        // The request reaches past the mapping: the file may have grown; map it again and
        // read what exists.
        self.remap()?;
        let map_len = self.map.read().as_ref().map_or(0, |m| m.len() as u64);
        if offset >= map_len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(map_len - offset) as usize;
        Ok(self.copy_out(offset, &mut buf[..n]).unwrap_or(0))
    }

    fn write_at(&self, offset: u64, _src: MemRef<'_>) -> Result<()> {
        Err(
            Error::new(ErrorKind::Unsupported, "the mmap backend is read-only")
                .with_backend(MMAP)
                .with_path(&self.path)
                .with_offset(offset),
        )
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| self.err(e, "cannot stat", 0))
    }

    fn set_len(&self, len: u64) -> Result<()> {
        Err(
            Error::new(ErrorKind::Unsupported, "the mmap backend is read-only")
                .with_backend(MMAP)
                .with_path(&self.path)
                .with_offset(len),
        )
    }
}
