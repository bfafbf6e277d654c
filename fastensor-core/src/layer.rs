//! Layers: backends that wrap another backend and change a few of its methods (fault
//! injection, throttling, checksums), as OpenDAL's layers wrap an accessor.
//!
//! A layer implements [`LayeredBackend`] and its files [`LayeredFile`]; every method it does
//! not write forwards to the inner backend or file, and the blanket implementations make it
//! a [`Backend`] and a [`BackendFile`]. A layer therefore writes only what it changes:
//!
//! ```
//! use fastensor_core::{Backend, BackendFile, LayeredBackend, LayeredFile, MemMut, OpenMode, Result};
//! use std::path::Path;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//!
//! /// Counts the reads of every file it opens; everything else is the inner backend's.
//! struct Counting { inner: Arc<dyn Backend>, reads: Arc<AtomicU64> }
//! struct CountingFile { inner: Box<dyn BackendFile>, reads: Arc<AtomicU64> }
//!
//! impl LayeredBackend for Counting {
//!     fn inner(&self) -> &dyn Backend { &*self.inner }
//!     fn name(&self) -> &str { "counting" }
//!     fn wrap(&self, inner: Box<dyn BackendFile>, _: &Path, _: OpenMode) -> Result<Box<dyn BackendFile>> {
//!         Ok(Box::new(CountingFile { inner, reads: self.reads.clone() }))
//!     }
//! }
//!
//! impl LayeredFile for CountingFile {
//!     fn inner(&self) -> &dyn BackendFile { &*self.inner }
//!     fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
//!         self.reads.fetch_add(1, Ordering::Relaxed);
//!         self.inner.read_at(offset, dst)
//!     }
//! }
//! ```

use crate::knobs::{KnobSpec, Knobs};
use crate::{
    Availability, Backend, BackendFile, Capabilities, MemMut, MemRef, OpenMode, ReadRequest,
    Result, SharedBackend, WriteRequest,
};
use std::path::Path;

/// A backend over another one: its own name, the inner backend's files wrapped by
/// [`wrap`](Self::wrap). Every [`LayeredBackend`] is a [`Backend`] (blanket implementation).
///
/// Forwarded to the inner backend unless overridden: `capabilities` and `probe`. Not
/// forwarded (a layer is a backend of its own): `detail`, `knobs` and `with_knobs` default to
/// none, none and [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported), as for any
/// backend.
pub trait LayeredBackend: Send + Sync + 'static {
    /// The backend this one wraps.
    fn inner(&self) -> &dyn Backend;

    /// This layer's name (see [`Backend::name`]).
    fn name(&self) -> &str;

    /// Wraps a file the inner backend opened at `path` in `mode`.
    fn wrap(
        &self,
        inner: Box<dyn BackendFile>,
        path: &Path,
        mode: OpenMode,
    ) -> Result<Box<dyn BackendFile>>;

    /// Opens `path`: the inner backend's file ([`open_inner`]) passed to
    /// [`wrap`](Self::wrap). A layer that refuses some opens overrides this and calls
    /// [`open_inner`] itself.
    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        let inner = open_inner(self, path, mode)?;
        self.wrap(inner, path, mode)
    }

    /// See [`Backend::capabilities`]; default: the inner backend's.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// See [`Backend::probe`]; default: the inner backend's.
    fn probe(&self) -> Availability {
        self.inner().probe()
    }

    /// See [`Backend::detail`]; default: none.
    fn detail(&self) -> Option<String> {
        None
    }

    /// See [`Backend::knobs`]; default: none.
    fn knobs(&self) -> Vec<KnobSpec> {
        Vec::new()
    }

    /// See [`Backend::with_knobs`]; default: [`ErrorKind::Unsupported`](crate::ErrorKind).
    fn with_knobs(&self, knobs: &Knobs) -> Result<SharedBackend> {
        Err(crate::backend::no_knobs(self.name(), knobs))
    }
}

/// The inner backend's file at `path`, its errors naming the layer as their backend (unless
/// they name one already).
pub fn open_inner<L: LayeredBackend + ?Sized>(
    layer: &L,
    path: &Path,
    mode: OpenMode,
) -> Result<Box<dyn BackendFile>> {
    layer
        .inner()
        .open(path, mode)
        .map_err(|e| e.with_backend(layer.name()))
}

impl<L: LayeredBackend> Backend for L {
    fn name(&self) -> &str {
        LayeredBackend::name(self)
    }

    fn capabilities(&self) -> Capabilities {
        LayeredBackend::capabilities(self)
    }

    fn probe(&self) -> Availability {
        LayeredBackend::probe(self)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        LayeredBackend::open(self, path, mode)
    }

    fn detail(&self) -> Option<String> {
        LayeredBackend::detail(self)
    }

    fn knobs(&self) -> Vec<KnobSpec> {
        LayeredBackend::knobs(self)
    }

    fn with_knobs(&self, knobs: &Knobs) -> Result<SharedBackend> {
        LayeredBackend::with_knobs(self, knobs)
    }
}

/// A file over another backend's file. Every [`LayeredFile`] is a [`BackendFile`] (blanket
/// implementation).
///
/// Forwarded to the inner file unless overridden: `path`, `read_at`, `write_at`, `sync`,
/// `len`, `set_len`, and the batch calls `read_batch` and `write_batch` (to the inner file's
/// batch path: **a layer that changes `read_at` or `write_at` changes the batch call too**,
/// or batches bypass it). Not forwarded: `is_empty` goes through the layer's own `len`, and
/// `read_metadata_at` and `begin_read_job` keep [`BackendFile`]'s defaults (through the
/// layer's own `read_at`; no job of its own).
pub trait LayeredFile: Send + Sync {
    /// The file this one wraps.
    fn inner(&self) -> &dyn BackendFile;

    /// See [`BackendFile::path`].
    fn path(&self) -> &Path {
        self.inner().path()
    }

    /// See [`BackendFile::read_at`].
    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        self.inner().read_at(offset, dst)
    }

    /// See [`BackendFile::write_at`].
    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        self.inner().write_at(offset, src)
    }

    /// See [`BackendFile::read_batch`].
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        self.inner().read_batch(requests)
    }

    /// See [`BackendFile::write_batch`].
    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        self.inner().write_batch(requests)
    }

    /// See [`BackendFile::sync`].
    fn sync(&self) -> Result<()> {
        self.inner().sync()
    }

    /// See [`BackendFile::len`].
    fn len(&self) -> Result<u64> {
        self.inner().len()
    }

    /// See [`BackendFile::is_empty`]; default: through the layer's own `len`.
    fn is_empty(&self) -> Result<bool> {
        Ok(LayeredFile::len(self)? == 0)
    }

    /// See [`BackendFile::set_len`].
    fn set_len(&self, len: u64) -> Result<()> {
        self.inner().set_len(len)
    }
}

impl<F: LayeredFile> BackendFile for F {
    fn path(&self) -> &Path {
        LayeredFile::path(self)
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        LayeredFile::read_at(self, offset, dst)
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        LayeredFile::write_at(self, offset, src)
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        LayeredFile::read_batch(self, requests)
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        LayeredFile::write_batch(self, requests)
    }

    fn sync(&self) -> Result<()> {
        LayeredFile::sync(self)
    }

    fn len(&self) -> Result<u64> {
        LayeredFile::len(self)
    }

    fn is_empty(&self) -> Result<bool> {
        LayeredFile::is_empty(self)
    }

    fn set_len(&self, len: u64) -> Result<()> {
        LayeredFile::set_len(self, len)
    }
}
