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
    Backend, BackendFile, Capabilities, Error, ErrorKind, MemMut, MemRef, OpenMode, ReadRequest,
    Result,
};
use fastensor_sys::fork::ForkRwLock;
use memmap2::{Advice, Mmap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The name of the mmap backend.
pub const MMAP: &str = "mmap";

/// Reads of this size or more ask for their range up front (`MADV_WILLNEED`).
const WILL_NEED_FROM: usize = 1 << 20;

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
            maps_file: true,
            ..Capabilities::local()
        }
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
            map: ForkRwLock::new(None),
            last_end: AtomicU64::new(u64::MAX),
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
    /// The current mapping; `None` while the file is empty. A child made by `fork` keeps
    /// the inherited mapping (its own) unless a thread of the parent held the lock at the
    /// fork (a read in progress), and then maps the file again.
    map: ForkRwLock<Option<Mmap>>,
    /// Where the last large read ended (see [`MmapFile::ahead`]).
    last_end: AtomicU64,
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

    /// Bytes to ask for beyond a large read of `len` bytes at `offset` in a mapping of
    /// `map_len` bytes: as many again when the read continues the last large one (a
    /// sequential stream), else none. Page faults start no readahead of their own beyond
    /// the range asked for, so without this every read of a stream would wait for its own
    /// pages from the device; with it the next range is read while this one is copied
    /// (figures: `docs/lab/io-paths.md`, "Figures behind settings in the code").
    fn ahead(&self, offset: u64, len: usize, map_len: usize) -> usize {
        let end = offset + len as u64;
        let sequential = self.last_end.swap(end, Ordering::Relaxed) == offset;
        if sequential {
            len.min(map_len.saturating_sub(end as usize))
        } else {
            0
        }
    }

    fn copy_out(&self, offset: u64, dst: &mut [u8]) -> Option<usize> {
        let guard = self.map.read();
        let map_len = guard.as_ref().map_or(0, |m| m.len() as u64);
        if offset + dst.len() as u64 > map_len {
            return None;
        }
        if let Some(map) = guard.as_ref() {
            let start = offset as usize;
            if dst.len() >= WILL_NEED_FROM {
                let ahead = self.ahead(offset, dst.len(), map.len());
                // Ask for the range (and, reading on in sequence, the next one) up front so
                // the page faults find the pages read ahead.
                let _ = map.advise_range(Advice::WillNeed, start, dst.len() + ahead);
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
        let buf = dst.host_for(MMAP, &self.path)?;
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

    /// See `read_batch_through_cache`: the batch's ranges are asked for up front.
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        crate::read_batch_through_cache(self, &self.file, requests)
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
        sys::file_len(&self.file, MMAP, &self.path)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_read_continuing_the_last_one_asks_for_the_next_range_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        std::fs::write(&path, b"x").unwrap();
        let mapped = MmapFile {
            file: File::open(&path).unwrap(),
            path,
            map: ForkRwLock::new(None),
            last_end: AtomicU64::new(u64::MAX),
        };
        const MIB: usize = 1 << 20;
        let map_len = 5 * MIB + MIB / 2;
        // (offset, length) of each read, and what it asks for beyond its range.
        let reads = [
            ((0, MIB), 0),                           // the first read
            ((MIB, MIB), MIB),                       // continues it: the next MiB too
            ((2 * MIB, MIB), MIB),                   // and on
            ((3 * MIB + 4096, MIB), 0),              // a jump
            ((4 * MIB + 4096, MIB), MIB / 2 - 4096), // on, up to the mapping's end only
        ];
        for ((offset, len), ahead) in reads {
            assert_eq!(
                mapped.ahead(offset as u64, len, map_len),
                ahead,
                "read at {offset}"
            );
        }
    }

    #[test]
    fn a_sequential_stream_of_large_reads_returns_the_files_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        let bytes: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = MmapBackend.open(&path, OpenMode::Read).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        for offset in (0..3u64 << 20).step_by(1 << 20) {
            assert_eq!(
                file.read_at(offset, MemMut::Host(&mut buf)).unwrap(),
                1 << 20
            );
            assert_eq!(&buf[..], &bytes[offset as usize..][..1 << 20]);
        }
    }
}
