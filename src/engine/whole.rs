//! Small whole-file operations on either kind of location (a local path or an `s3://`
//! object): what the metadata of a checkpoint needs (DCP's `.metadata`, an index), beside
//! the checkpoint files themselves.

use super::Engine;
use fastensor_core::{BackendFileExt, Commit, Error, FileOpener, MemRef, OpenMode, Result};
use std::io::Read;
use std::path::Path;

impl Engine {
    /// The whole file or object at `path` (meant for small ones: metadata, indexes). A local
    /// path that is not a regular file is [`ErrorKind::InvalidInput`](fastensor_core::ErrorKind::InvalidInput).
    pub fn read_whole(&self, path: &Path) -> Result<Vec<u8>> {
        if !self.place(path).directories {
            let file = self.open_file(path, OpenMode::Read)?;
            return Ok(file.read_all()?.to_vec());
        }
        // A regular file only: a FIFO or a device is refused, never read or waited on.
        let mut bytes = Vec::new();
        crate::atomic::open_regular(path)?
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(e, "cannot read the file").with_path(path))?;
        Ok(bytes)
    }

    /// Writes `bytes` as the file or object at `path`, atomically and durably: readers see
    /// the old content or the new, never part of it (a local file is written under a
    /// temporary name, synced and renamed; an object appears when its upload completes).
    pub fn write_whole(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        if self.place(path).commit == Commit::OnSync {
            let file = self.open_file(path, OpenMode::Truncate)?;
            file.write_at(0, MemRef::Host(bytes))?;
            return file.sync();
        }
        crate::atomic::write(path, bytes)
    }

    /// Removes the file or object at `path`; nothing to remove is not an error.
    pub fn remove(&self, path: &Path) -> Result<()> {
        if let fastensor_core::location::Location::Object(_) = super::opener::resolve(path) {
            return self.inner.objects.remove(path);
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(e, "cannot remove the file").with_path(path))
            }
            _ => Ok(()),
        }
    }
}
