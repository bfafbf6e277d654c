//! An example of a **compiled-in plugin**: a crate outside fastensor that adds a backend to
//! the registry with [`fastensor_core::register_backend!`].
//!
//! [`ChecksumBackend`] wraps another backend (by default `posix`) as a
//! [`fastensor_core::LayeredBackend`]: it writes only the methods it changes,
//! the rest forward to the inner backend. It keeps a CRC-32 of every range written through
//! it. Reads are checked against those checksums: a read that covers a recorded range whole
//! recomputes its checksum, and a mismatch (the file changed behind the backend's back, or
//! the disk returned other bytes) is an [`ErrorKind::Corrupt`] error naming the file and the
//! offset. The checksums can be listed with [`ChecksumBackend::checksums`].
//!
//! The backend is registered as [`CHECKSUM_POSIX`] (`checksum-posix`). Because `inventory` only
//! sees crates that are linked, a program that wants it in
//! [`Registry::compiled_in`](fastensor_core::Registry::compiled_in) calls [`link`] once:
//!
//! ```
//! checksum_plugin::link();
//! let registry = fastensor_core::Registry::compiled_in();
//! assert!(registry.get(checksum_plugin::CHECKSUM_POSIX).is_ok());
//! ```
//!
//! Only writes made through this backend are recorded, keyed by the path as given to `open`:
//! a file also written through another backend or another path to it will fail
//! verification where the checksummed ranges changed.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use fastensor_core::{
    unsupported_memory, Backend, BackendFile, Capabilities, Error, ErrorKind, LayeredBackend,
    LayeredFile, MemMut, MemRef, OpenMode, ReadRequest, Result, SharedBackend, WriteRequest,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The name of the checksumming backend over `posix`.
pub const CHECKSUM_POSIX: &str = "checksum-posix";

fastensor_core::register_backend!(CHECKSUM_POSIX, || Arc::new(ChecksumBackend::over_posix()));

/// Makes sure this crate is linked, so that its registration is seen by
/// [`Registry::compiled_in`](fastensor_core::Registry::compiled_in).
#[inline(never)]
pub fn link() {}

/// The checksum of one range written through the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// File offset of the first byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// CRC-32 (IEEE) of the bytes.
    pub crc32: u32,
}

impl Record {
    fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// Checksums by file, then by start offset; the ranges of one file never overlap.
#[derive(Debug, Default)]
struct Ledger {
    files: Mutex<HashMap<PathBuf, BTreeMap<u64, Record>>>,
    verified: AtomicU64,
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, HashMap<PathBuf, BTreeMap<u64, Record>>> {
        // A panic while holding the lock leaves the map consistent (every update is one call).
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets every range that overlaps `[start, end)`. Ranges never overlap each other, so
    /// their ends grow with their starts: walking back from the last range starting before
    /// `end`, the overlapping ones are those met before the first that ends at or before
    /// `start`.
    fn forget(map: &mut BTreeMap<u64, Record>, start: u64, end: u64) {
        let doomed: Vec<u64> = map
            .range(..end)
            .rev()
            .take_while(|(_, r)| r.end() > start)
            .map(|(&k, _)| k)
            .collect();
        for k in doomed {
            map.remove(&k);
        }
    }

    fn record(&self, path: &Path, offset: u64, data: &[u8]) {
        let mut files = self.lock();
        let map = files.entry(path.to_path_buf()).or_default();
        let len = data.len() as u64;
        Self::forget(map, offset, offset.saturating_add(len));
        if len > 0 {
            map.insert(
                offset,
                Record {
                    offset,
                    len,
                    crc32: crc32fast::hash(data),
                },
            );
        }
    }

    fn cut(&self, path: &Path, len: u64) {
        let mut files = self.lock();
        if let Some(map) = files.get_mut(path) {
            Self::forget(map, len, u64::MAX);
        }
    }

    fn clear(&self, path: &Path) {
        self.lock().remove(path);
    }

    /// The records lying wholly inside `[offset, offset + len)`.
    fn covered(&self, path: &Path, offset: u64, len: u64) -> Vec<Record> {
        let files = self.lock();
        let Some(map) = files.get(path) else {
            return Vec::new();
        };
        let end = offset.saturating_add(len);
        map.range(offset..end)
            .map(|(_, r)| *r)
            .filter(|r| r.end() <= end)
            .collect()
    }

    fn verify(&self, backend: &str, path: &Path, offset: u64, data: &[u8]) -> Result<()> {
        for r in self.covered(path, offset, data.len() as u64) {
            let start = (r.offset - offset) as usize;
            let got = crc32fast::hash(&data[start..start + r.len as usize]);
            if got != r.crc32 {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "checksum mismatch in the {} bytes written at offset {}: CRC-32 {got:08x}, \
                         written {:08x}",
                        r.len, r.offset, r.crc32
                    ),
                )
                .with_backend(backend)
                .with_path(path)
                .with_offset(r.offset));
            }
            self.verified.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// A backend that checksums every write and verifies every read, over an inner backend.
/// Clones share their checksums.
#[derive(Debug, Clone)]
pub struct ChecksumBackend {
    inner: SharedBackend,
    name: String,
    ledger: Arc<Ledger>,
}

impl ChecksumBackend {
    /// Wraps `inner`; the backend is named `checksum-<inner's name>`.
    pub fn new(inner: SharedBackend) -> Self {
        let name = format!("checksum-{}", inner.name());
        ChecksumBackend {
            inner,
            name,
            ledger: Arc::default(),
        }
    }

    /// Wraps the `posix` backend (what [`CHECKSUM_POSIX`] is).
    pub fn over_posix() -> Self {
        Self::new(Arc::new(fastensor_posix::PosixBackend))
    }

    /// The checksums recorded for `path` (as given to `open`), in offset order.
    pub fn checksums(&self, path: &Path) -> Vec<Record> {
        self.ledger
            .lock()
            .get(path)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default()
    }

    /// How many recorded ranges reads have verified so far.
    pub fn verified_ranges(&self) -> u64 {
        self.ledger.verified.load(Ordering::Relaxed)
    }
}

impl LayeredBackend for ChecksumBackend {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // The checksum is computed on host bytes.
            device_memory: false,
            ..self.inner.capabilities()
        }
    }

    fn detail(&self) -> Option<String> {
        Some(format!(
            "CRC-32 of every write, over `{}`",
            self.inner.name()
        ))
    }

    fn wrap(
        &self,
        inner: Box<dyn BackendFile>,
        path: &Path,
        mode: OpenMode,
    ) -> Result<Box<dyn BackendFile>> {
        if mode == OpenMode::Truncate {
            self.ledger.clear(path);
        }
        Ok(Box::new(ChecksumFile {
            inner,
            name: self.name.clone(),
            ledger: self.ledger.clone(),
        }))
    }
}

/// An open file of [`ChecksumBackend`].
struct ChecksumFile {
    inner: Box<dyn BackendFile>,
    name: String,
    ledger: Arc<Ledger>,
}

impl LayeredFile for ChecksumFile {
    fn inner(&self) -> &dyn BackendFile {
        &*self.inner
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let buf = dst.host_for(&self.name, self.inner.path())?;
        let n = self.inner.read_at(offset, MemMut::Host(&mut *buf))?;
        self.ledger
            .verify(&self.name, self.inner.path(), offset, &buf[..n])?;
        Ok(n)
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let buf = src.host_for(&self.name, self.inner.path())?;
        self.inner.write_at(offset, src)?;
        self.ledger.record(self.inner.path(), offset, buf);
        Ok(())
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        let path = self.inner.path();
        if let Some(r) = requests.iter().find(|r| !matches!(r.dst, MemMut::Host(_))) {
            return Err(unsupported_memory(&self.name, r.dst.kind(), path));
        }
        self.inner.read_batch(requests)?;
        for r in requests.iter() {
            if let MemMut::Host(buf) = &r.dst {
                self.ledger
                    .verify(&self.name, path, r.offset, &buf[..r.done])?;
            }
        }
        Ok(())
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        let path = self.inner.path();
        if let Some(r) = requests.iter().find(|r| !matches!(r.src, MemRef::Host(_))) {
            return Err(unsupported_memory(&self.name, r.src.kind(), path));
        }
        self.inner.write_batch(requests)?;
        for r in requests {
            if let MemRef::Host(buf) = r.src {
                self.ledger.record(path, r.offset, buf);
            }
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.inner.set_len(len)?;
        self.ledger.cut(self.inner.path(), len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: u64, len: u64) -> Record {
        Record {
            offset,
            len,
            crc32: 0,
        }
    }

    #[test]
    fn forget_drops_exactly_the_overlapping_ranges() {
        let mut map: BTreeMap<u64, Record> = [rec(0, 10), rec(10, 10), rec(20, 10), rec(40, 5)]
            .into_iter()
            .map(|r| (r.offset, r))
            .collect();
        Ledger::forget(&mut map, 15, 21);
        assert_eq!(map.keys().copied().collect::<Vec<_>>(), vec![0, 40]);
        Ledger::forget(&mut map, 42, u64::MAX);
        assert_eq!(map.keys().copied().collect::<Vec<_>>(), vec![0]);
        Ledger::forget(&mut map, 10, 12);
        assert_eq!(map.keys().copied().collect::<Vec<_>>(), vec![0]);
    }
}
