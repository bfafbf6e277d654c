//! A file opened through the engine: every transfer picks its backend (`file/transfer.rs`),
//! and the engine's measurer learns from it.

use super::decisions::Decisions;
use super::measure::{FileState, MeasuredFile};
use super::{Candidate, Inner};
use fastensor_core::debug_fields;
use fastensor_core::{
    BackendFile, Direction, Error, ErrorKind, FileLocation, MemMut, MemRef, MemoryKind, OpenMode,
    Purpose, ReadRequest, Result, WriteRequest,
};
use fastensor_sys::fork::{ForkMutex, ForkRwLock};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod batch;
mod handles;
mod identity;
mod job;
mod reopened;
mod transfer;

use handles::{Handle, Handles};
use identity::{not_regular, replaced, FileId};

/// A file whose `read_at` / `write_at` choose a backend per transfer, time it (wall and CPU)
/// and tell the selector. Backend handles are opened lazily and kept; all backends reach the
/// same file through the kernel, so bytes written through one are read back through any
/// other. `Send + Sync`: threads may transfer disjoint ranges at once.
///
/// A file opened before a `fork` can be used in the child (and in the parent, at the same
/// time). Its locks are fork-safe ([`fastensor_sys::fork`]): one that a thread of the
/// parent held at the fork starts again in the child from its value at the open (no
/// handle opened yet, no pin of the file's own, the general purpose, nothing measured).
pub struct EngineFile {
    engine: Arc<Inner>,
    path: PathBuf,
    writable: bool,
    location: Arc<FileLocation>,
    /// The file first opened (`None` when the path names no file of the local file
    /// systems, e.g. for an in-memory backend): every handle opened later must reach it.
    identity: Option<FileId>,
    /// The backends' handles on the file, and the backends that refused it.
    handles: ForkRwLock<Handles>,
    /// The file's own pin and the purpose its transfers carry.
    settings: ForkRwLock<Settings>,
    /// A plain read-only descriptor of the file first opened (see
    /// [`EngineFile::probe_file`]).
    probe_fd: Option<std::fs::File>,
    /// What the measurer keeps of this file (its stream, the bytes it read, its writes).
    measures: ForkMutex<FileState>,
    /// The selector's last answers for this file (see `decisions.rs`).
    decisions: ForkMutex<Decisions>,
}

/// A file's settings: its own pin (`None`: the engine's pin or the selector), and the
/// purpose its transfers carry.
#[derive(Debug, Default)]
struct Settings {
    pin: Option<String>,
    purpose: Purpose,
}

impl Drop for EngineFile {
    /// Gives the measurer what it measured but did not record yet.
    fn drop(&mut self) {
        self.engine.measurer.close(self.measures.get_mut());
    }
}

impl MeasuredFile for EngineFile {
    fn state(&self) -> &ForkMutex<FileState> {
        &self.measures
    }

    fn location(&self) -> &Arc<FileLocation> {
        &self.location
    }

    fn purpose(&self) -> Purpose {
        self.settings.read().purpose
    }

    fn probe_file(&self) -> Option<&std::fs::File> {
        EngineFile::probe_file(self)
    }
}

debug_fields!(EngineFile, "EngineFile", |s| {
    path: s.path,
    writable: s.writable,
    location: s.location,
});

/// Errors after which another backend may well succeed with the same transfer.
fn refusal(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Unsupported | ErrorKind::Unaligned)
}

impl EngineFile {
    pub(crate) fn open(engine: Arc<Inner>, path: &Path, mode: OpenMode) -> Result<EngineFile> {
        let before = FileId::of(path);
        if let Some(kind) = before.and_then(|id| id.special) {
            // Refused before any backend opens it: opening a FIFO blocks.
            return Err(not_regular(kind).with_path(path));
        }
        let location = Arc::new(location_of(path));
        let measures = engine.measurer.file_state(&location);
        let handles = Handles::new(engine.candidates.len());
        let mut file = EngineFile {
            engine,
            path: path.to_path_buf(),
            writable: mode.writable(),
            location,
            identity: None,
            handles: ForkRwLock::new(handles),
            settings: ForkRwLock::default(),
            probe_fd: None,
            measures: ForkMutex::new(measures),
            decisions: ForkMutex::default(),
        };
        // Open one handle now, in the requested mode: creation and truncation happen once,
        // and a missing file or a refused permission is reported here.
        let first: Vec<(usize, Candidate)> = file
            .engine
            .candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                if mode.writable() {
                    c.caps.write
                } else {
                    c.caps.read
                }
            })
            .map(|(i, c)| (i, c.clone()))
            .collect();
        if first.is_empty() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "no available backend can open the file in this mode",
            )
            .with_path(path));
        }
        let mut last = None;
        for (i, c) in first {
            match c.backend.open(path, mode) {
                Ok(h) => {
                    // The file the handle reached: the one at the path before and after the
                    // open (a rename over the path in between leaves no way to tell).
                    let after = FileId::of(path);
                    if let (Some(b), Some(a)) = (before, after) {
                        if !b.same_file(&a) {
                            return Err(replaced(path, "while it was being opened"));
                        }
                    }
                    file.identity = after;
                    file.probe_fd = after.and_then(|id| id.open_read_only(path));
                    file.handles_mut().open[i] = Some((Arc::from(h), mode.writable()));
                    return Ok(file);
                }
                Err(e) if refusal(e.kind()) => {
                    file.handles_mut().refused.insert(c.name().to_string());
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one candidate was tried"))
    }

    /// Notes that `backend` refused this file: it is no longer offered, and the answers
    /// kept for the candidates offered before are forgotten.
    fn refuse(&self, backend: &str) {
        self.handles_mut().refused.insert(backend.to_string());
        self.decisions.lock().clear();
    }

    /// Keeps this file's transfers off the page cache: the backends that read or write
    /// through it are set aside, where at least one backend left can both read and write
    /// host memory and opens this file (a file system without `O_DIRECT` keeps them all).
    /// For a file whose bytes are written once and read back once (an offload swap file): a
    /// cached copy would hold the very memory the file exists to free, and cost a copy each
    /// way. Returns whether any backend was set aside.
    pub(crate) fn bypass_page_cache(&self) -> bool {
        let direct = |c: &super::Candidate| c.caps.bypasses_page_cache;
        let both = |c: &super::Candidate| {
            c.fits(Direction::Read, MemoryKind::Host) && c.fits(Direction::Write, MemoryKind::Host)
        };
        let candidates = &self.engine.candidates;
        let usable = (0..candidates.len())
            .filter(|&i| direct(&candidates[i]) && both(&candidates[i]))
            .any(|i| self.handle(i).is_ok());
        if !usable {
            return false;
        }
        let mut any = false;
        for c in candidates.iter().filter(|c| !direct(c)) {
            self.refuse(c.name());
            any = true;
        }
        any
    }

    /// The file system and device of the file.
    pub fn location(&self) -> &FileLocation {
        &self.location
    }

    /// Uses `backend` for this file's transfers (`None`: the engine's pin or the selector).
    pub fn pin(&self, backend: Option<&str>) -> Result<()> {
        if let Some(name) = backend {
            self.engine.candidate(name)?;
        }
        self.settings.write().pin = backend.map(String::from);
        Ok(())
    }

    /// Sets the purpose recorded in the contexts of this file's transfers. With a purpose
    /// whose writes are durable ([`Purpose::durable_writes`]: checkpoints, logs) every write
    /// is measured until its bytes have reached the device, so the selector compares
    /// buffered and direct writes at their true cost.
    pub fn set_purpose(&self, purpose: Purpose) {
        self.settings.write().purpose = purpose;
    }

    /// A read-only descriptor of the file first opened, opened with it: for cheap questions
    /// (page-cache residency), write-back, and the backends' handles opened once the path
    /// names another file (see `file/handles.rs`); `None` when it could not be opened (no
    /// read permission, a file of no local file system).
    fn probe_file(&self) -> Option<&std::fs::File> {
        self.probe_fd.as_ref()
    }

    /// Waits until the bytes just written at `offset..offset + len` have left the page
    /// cache for the device (a no-op for direct writes, which left it already), so that a
    /// durable write is measured at its true cost. A file no probe handle could open waits
    /// for nothing (the final `sync` still makes the file durable).
    fn write_back(&self, offset: u64, len: usize) -> Result<()> {
        if let Some(f) = self.probe_file() {
            return fastensor_sys::flush_range(f, offset, len as u64).map_err(|e| {
                Error::io(e, "cannot write back a durable write")
                    .with_path(&self.path)
                    .with_offset(offset)
            });
        }
        let _ = (offset, len);
        Ok(())
    }
}

impl BackendFile for EngineFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, offset: u64, mut dst: MemMut<'_>) -> Result<usize> {
        let (len, kind) = (dst.len(), dst.kind());
        self.transfer(
            Direction::Read,
            len,
            kind,
            offset,
            |h| h.read_at(offset, dst.reborrow()),
            |n| *n,
        )
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let (len, kind) = (src.len(), src.kind());
        self.transfer(
            Direction::Write,
            len,
            kind,
            offset,
            |h| h.write_at(offset, src),
            |_| len,
        )
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        EngineFile::read_batch(self, requests)
    }

    /// Through the file's plain read-only descriptor where it has one (no backend choice,
    /// no measurement), else as any read.
    fn read_metadata_at(&self, offset: u64, dst: &mut [u8]) -> Result<usize> {
        let Some(f) = self.probe_file() else {
            return self.read_at(offset, MemMut::Host(dst));
        };
        fastensor_sys::pread_full(f, dst, offset).map_err(|e| {
            Error::io(e, "cannot read the file's header")
                .with_path(&self.path)
                .with_offset(offset)
        })
    }

    /// One backend for the whole job, measured whole (see `file/job.rs`).
    fn begin_read_job(&self, job: &fastensor_core::ReadJob) -> Option<Box<dyn BackendFile + '_>> {
        self.begin_job(job)
            .map(|j| Box::new(j) as Box<dyn BackendFile + '_>)
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        EngineFile::write_batch(self, requests)
    }

    /// Makes every write durable, through every handle that wrote.
    fn sync(&self) -> Result<()> {
        let handles: Vec<Handle> = self
            .handles()
            .all()
            .filter(|(_, w)| *w)
            .map(|(h, _)| h.clone())
            .collect();
        for h in handles {
            h.sync()?;
        }
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        self.any_handle(false)?.len()
    }

    /// Sets the length through one handle and drops the others (a memory map of the old
    /// length must not outlive a cut).
    fn set_len(&self, len: u64) -> Result<()> {
        if !self.writable {
            return Err(
                Error::new(ErrorKind::PermissionDenied, "the file was opened read-only")
                    .with_path(&self.path),
            );
        }
        let h = self.any_handle(true)?;
        h.set_len(len)?;
        for slot in self.handles_mut().open.iter_mut() {
            if slot
                .as_ref()
                .is_some_and(|(other, _)| !Arc::ptr_eq(other, &h))
            {
                *slot = None;
            }
        }
        Ok(())
    }
}

impl EngineFile {
    /// Makes every write durable (see [`BackendFile::sync`]).
    pub fn sync(&self) -> Result<()> {
        BackendFile::sync(self)
    }

    /// The file's current length.
    pub fn len(&self) -> Result<u64> {
        BackendFile::len(self)
    }

    /// True when the file is empty.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(BackendFile::len(self)? == 0)
    }

    /// Sets the file's length (see [`BackendFile::set_len`]).
    pub fn set_len(&self, len: u64) -> Result<()> {
        BackendFile::set_len(self, len)
    }

    /// Reads into `dst` from `offset` (a `&mut [u8]`, `&mut Vec<u8>`, `&mut HostBuffer` or
    /// device memory); returns the bytes read, short only at the end of the file.
    pub fn read_at<'a>(&self, offset: u64, dst: impl Into<MemMut<'a>>) -> Result<usize> {
        BackendFile::read_at(self, offset, dst.into())
    }

    /// Writes all of `src` at `offset`.
    pub fn write_at<'a>(&self, offset: u64, src: impl Into<MemRef<'a>>) -> Result<()> {
        BackendFile::write_at(self, offset, src.into())
    }
}

/// The file system and device of `path` (its directory when the file does not exist yet);
fn location_of(path: &Path) -> FileLocation {
    fastensor_sys::file_location(path)
}
