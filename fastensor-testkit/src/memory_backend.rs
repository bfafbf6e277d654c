//! `memory`: a backend that keeps files in memory. Always built; used to test selection,
//! offload and plugins without touching a disk, and as the simplest example of a backend.

use fastensor_core::{
    readable_len, write_end, Availability, Backend, BackendFile, Capabilities, Error, ErrorKind,
    MemMut, MemRef, OpenMode, Result,
};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The name of the in-memory backend.
pub const MEMORY: &str = "memory";

type Store = Arc<RwLock<Vec<u8>>>;

/// Files kept in memory, keyed by path. Clones share the same files.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    files: Arc<Mutex<HashMap<PathBuf, Store>>>,
    name: Option<Arc<str>>,
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store registered under another name (to have several in one registry).
    pub fn named(name: &str) -> Self {
        MemoryBackend {
            files: Arc::default(),
            name: Some(name.into()),
        }
    }

    /// True when a file exists at `path`.
    pub fn contains(&self, path: &Path) -> bool {
        self.files.lock().contains_key(path)
    }

    /// Removes the file at `path`; returns whether it existed.
    pub fn remove(&self, path: &Path) -> bool {
        self.files.lock().remove(path).is_some()
    }
}

impl Backend for MemoryBackend {
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(MEMORY)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            durable_sync: false,
            ..Capabilities::default()
        }
    }

    fn probe(&self) -> Availability {
        Availability::Available
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        if path.is_dir() {
            return Err(
                Error::new(ErrorKind::InvalidInput, "is a directory, not a file")
                    .with_backend(self.name())
                    .with_path(path),
            );
        }
        let mut files = self.files.lock();
        let store = match (mode, files.get(path)) {
            (OpenMode::Truncate, Some(s)) => {
                s.write().clear();
                s.clone()
            }
            (_, Some(s)) => s.clone(),
            (OpenMode::Create | OpenMode::Truncate, None) => {
                files.entry(path.to_path_buf()).or_default().clone()
            }
            (OpenMode::Read | OpenMode::ReadWrite, None) => {
                return Err(Error::new(ErrorKind::NotFound, "no such file")
                    .with_backend(self.name())
                    .with_path(path))
            }
        };
        Ok(Box::new(MemoryFile {
            store,
            path: path.to_path_buf(),
            writable: mode.writable(),
            backend: self.name().to_string(),
        }))
    }
}

struct MemoryFile {
    store: Store,
    path: PathBuf,
    writable: bool,
    backend: String,
}

impl MemoryFile {
    fn error(&self, kind: ErrorKind, msg: &str, offset: u64) -> Error {
        Error::new(kind, msg)
            .with_backend(&self.backend)
            .with_path(&self.path)
            .with_offset(offset)
    }
}

impl BackendFile for MemoryFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let buf = dst.host_for(&self.backend, &self.path)?;
        let data = self.store.read();
        let n = readable_len(offset, buf.len(), data.len() as u64);
        if n > 0 {
            // `offset` lies inside the data, so it fits a usize.
            let start = offset as usize;
            buf[..n].copy_from_slice(&data[start..start + n]);
        }
        Ok(n)
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let buf = src.host_for(&self.backend, &self.path)?;
        if !self.writable {
            return Err(self.error(ErrorKind::PermissionDenied, "file opened read-only", offset));
        }
        if buf.is_empty() {
            return Ok(());
        }
        let end = usize::try_from(write_end(offset, buf.len(), &self.backend, &self.path)?)
            .map_err(|_| {
                self.error(ErrorKind::InvalidInput, "offset + length overflows", offset)
            })?;
        let mut data = self.store.write();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[offset as usize..end].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.store.read().len() as u64)
    }

    fn set_len(&self, len: u64) -> Result<()> {
        if !self.writable {
            return Err(self.error(ErrorKind::PermissionDenied, "file opened read-only", len));
        }
        let len = usize::try_from(len)
            .map_err(|_| self.error(ErrorKind::InvalidInput, "length too large", len))?;
        self.store.write().resize(len, 0);
        Ok(())
    }
}
