//! A file opened through the engine: every transfer picks its backend.

use super::decisions::Decisions;
use super::reread::FileReads;
use super::stream::{Measured, ReadStream, Run};
use super::write_run::WriteRun;
use super::{probe, Candidate, Inner};
use fastensor_core::{
    BackendFile, CacheState, Direction, Error, ErrorKind, FileLocation, MemMut, MemRef, MemoryKind,
    OpenMode, Purpose, ReadRequest, Result, WriteRequest,
};
use fastensor_sys::fork::{ForkMutex, ForkOnceLock, ForkRwLock};
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod account;
mod batch;
mod identity;
mod job;
mod transfer;

use identity::{not_regular, replaced, FileId};

type Handle = Arc<dyn BackendFile>;

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
    /// Per candidate of the engine (same order): its handle, once opened, and whether it
    /// was opened writable.
    handles: ForkRwLock<Vec<Option<(Handle, bool)>>>,
    /// Backends that refused this file (e.g. `O_DIRECT` on tmpfs).
    refused: ForkMutex<BTreeSet<String>>,
    pinned: ForkRwLock<Option<String>>,
    purpose: ForkRwLock<Purpose>,
    probe_fd: ForkOnceLock<Option<std::fs::File>>,
    /// The file first opened (`None` when the path names no file of the local file
    /// systems, e.g. for an in-memory backend): every handle opened later must reach it.
    identity: Option<FileId>,
    /// The sequential read stream in progress (see [`ReadStream`]).
    stream: ForkMutex<ReadStream>,
    /// The bytes read so far (to tell reading again from reading for the first time).
    read_ranges: ForkMutex<FileReads>,
    /// Bit `i`: a transfer went through the engine's candidate `i` (the first one through a
    /// handle pays its set-up: a mapping's first page faults, a ring's registration).
    used: AtomicU64,
    /// The selector's last answers for this file (see `decisions.rs`).
    decisions: ForkMutex<Decisions>,
    /// The chosen writes measured but not yet recorded (see `write_run.rs`).
    write_run: ForkMutex<WriteRun>,
}

impl Drop for EngineFile {
    /// Records the stream reads and the writes measured but not yet recorded, and counts
    /// the bytes read once (see `FileReads`).
    fn drop(&mut self) {
        // `None`: inherited from a parent whose thread held the lock (nothing to record).
        let read_once = self.read_ranges.get_mut().map_or(0, FileReads::finish);
        self.engine.reads.add(read_once, 0);
        let [read, window] = self
            .stream
            .get_mut()
            .map_or([None, None], ReadStream::take_runs);
        let writes = self.write_run.get_mut().and_then(WriteRun::take);
        for run in [read, window, writes].into_iter().flatten() {
            self.record_run(run);
        }
    }
}

impl fmt::Debug for EngineFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineFile")
            .field("path", &self.path)
            .field("writable", &self.writable)
            .field("location", &self.location)
            .finish()
    }
}

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
        let window = engine.read_ahead_window(&location.device);
        let handles = vec![None; engine.candidates.len()];
        let mut file = EngineFile {
            engine,
            path: path.to_path_buf(),
            writable: mode.writable(),
            location,
            handles: ForkRwLock::new(handles),
            refused: ForkMutex::default(),
            pinned: ForkRwLock::default(),
            purpose: ForkRwLock::new(Purpose::General),
            probe_fd: ForkOnceLock::new(),
            identity: None,
            stream: ForkMutex::new(ReadStream::new(window)),
            read_ranges: ForkMutex::default(),
            used: AtomicU64::new(0),
            decisions: ForkMutex::default(),
            write_run: ForkMutex::default(),
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
                    file.handles_mut()[i] = Some((Arc::from(h), mode.writable()));
                    return Ok(file);
                }
                Err(e) if refusal(e.kind()) => {
                    file.refused().insert(c.name().to_string());
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one candidate was tried"))
    }

    fn handles_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Option<(Handle, bool)>>> {
        self.handles.write_or(|| self.no_handles())
    }

    fn handles(&self) -> std::sync::RwLockReadGuard<'_, Vec<Option<(Handle, bool)>>> {
        self.handles.read_or(|| self.no_handles())
    }

    /// One empty handle slot per candidate of the engine.
    fn no_handles(&self) -> Vec<Option<(Handle, bool)>> {
        vec![None; self.engine.candidates.len()]
    }

    /// The read stream in progress (a fresh one after a fork that caught it locked).
    fn stream(&self) -> std::sync::MutexGuard<'_, ReadStream> {
        self.stream
            .lock_or(|| ReadStream::new(self.engine.read_ahead_window(&self.location.device)))
    }

    /// Notes that `backend` refused this file: it is no longer offered, and the answers
    /// kept for the candidates offered before are forgotten.
    fn refuse(&self, backend: &str) {
        self.refused().insert(backend.to_string());
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

    fn refused(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.refused.lock()
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
        *self.pinned.write() = backend.map(String::from);
        Ok(())
    }

    /// Sets the purpose recorded in the contexts of this file's transfers. With a purpose
    /// whose writes are durable ([`Purpose::durable_writes`]: checkpoints, logs) every write
    /// is measured until its bytes have reached the device, so the selector compares
    /// buffered and direct writes at their true cost.
    pub fn set_purpose(&self, purpose: Purpose) {
        *self.purpose.write() = purpose;
    }

    /// The backends that have an open handle on this file.
    pub fn open_backends(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .handles()
            .iter()
            .zip(&self.engine.candidates)
            .filter(|(h, _)| h.is_some())
            .map(|(_, c)| c.name().to_string())
            .collect();
        names.sort();
        names
    }

    /// The handle of the engine's candidate at `index`, opened when first needed and kept.
    fn handle(&self, index: usize) -> Result<Handle> {
        if let Some(Some((h, _))) = self.handles().get(index) {
            return Ok(h.clone());
        }
        let c = &self.engine.candidates[index];
        let writable = self.writable && c.caps.write;
        let mode = if writable {
            OpenMode::ReadWrite
        } else {
            OpenMode::Read
        };
        let h: Handle = Arc::from(c.backend.open(&self.path, mode)?);
        self.check_identity()?;
        let mut handles = self.handles_mut();
        let entry = handles[index].get_or_insert((h, writable));
        Ok(entry.0.clone())
    }

    /// Fails unless the path still names the file first opened: a handle opened by path
    /// after a rename over it would reach another file (a load would mix two checkpoints).
    fn check_identity(&self) -> Result<()> {
        let Some(first) = &self.identity else {
            return Ok(());
        };
        match FileId::of(&self.path) {
            Some(now) if now.same_file(first) => Ok(()),
            Some(_) => Err(replaced(&self.path, "since it was opened")),
            None => Err(Error::new(
                ErrorKind::NotFound,
                "the file was removed or renamed since it was opened: open it again",
            )
            .with_path(&self.path)),
        }
    }

    /// Whether this is the first transfer through the engine's candidate `index` on this
    /// file (noting that it happened). That transfer pays its handle's one-off set-up,
    /// whenever the handle was opened (the handle opened with the file included): a
    /// mapping's first page faults, a ring's first submission. Candidates past the 64th are
    /// never taken for first.
    fn first_use(&self, index: usize) -> bool {
        let Some(bit) = u32::try_from(index).ok().and_then(|i| 1u64.checked_shl(i)) else {
            return false;
        };
        self.used.load(Ordering::Relaxed) & bit == 0
            && self.used.fetch_or(bit, Ordering::Relaxed) & bit == 0
    }

    fn any_handle(&self, writable: bool) -> Result<Handle> {
        if let Some((h, _)) = self
            .handles()
            .iter()
            .flatten()
            .find(|(_, w)| *w || !writable)
        {
            return Ok(h.clone());
        }
        let index = self
            .engine
            .candidates
            .iter()
            .position(|c| !writable || c.caps.write)
            .ok_or_else(|| {
                Error::new(ErrorKind::Unsupported, "no available backend can write")
                    .with_path(&self.path)
            })?;
        self.handle(index)
    }

    fn cache_state(&self, offset: u64, len: usize) -> CacheState {
        if !self.engine.detect_cache {
            return CacheState::Unknown;
        }
        match self.probe_file() {
            Some(f) => probe::cache_state(f, offset, len),
            None => CacheState::Unknown,
        }
    }

    /// The page-cache state a read is keyed by (see [`ReadStream::begin`]), and for a read
    /// that continues the stream the backend of the stream's last read.
    fn read_cache_state(&self, offset: u64, len: usize) -> (CacheState, Option<usize>) {
        let mut stream = self.stream();
        let reread = || self.read_ranges.lock().covers(offset, offset + len as u64);
        let read_through_cache = || {
            self.read_ranges
                .lock()
                .covers_through_cache(offset, offset + len as u64)
        };
        stream.begin(
            offset,
            len,
            reread,
            || self.cache_state(offset, len),
            read_through_cache,
            |range| self.cached_range(range),
        )
    }

    /// Whether every byte of `range` is in the page cache; `None` when that cannot be told
    /// (no probe, or the range runs past the end of the file).
    fn cached_range(&self, range: std::ops::Range<u64>) -> Option<bool> {
        if !self.engine.detect_cache {
            return None;
        }
        probe::cached_range(self.probe_file()?, range)
    }

    /// Records a run of reads or writes as one observation (a warm-up run only when it shows
    /// its path far behind the leader, see [`Run::warm_up`]).
    fn record_run(&self, run: Run) {
        let Some(c) = self.engine.candidates.get(run.path) else {
            return;
        };
        if run.warm_up {
            if let Some(wall) = run.far_test_wall(c.keeps_cache()) {
                self.engine
                    .record_if_far(&run.ctx, c.name(), run.bytes, wall, run.cpu());
            }
        } else {
            self.engine
                .record(&run.ctx, c.name(), run.bytes, run.wall, run.cpu());
        }
    }

    /// Records a useful write through the candidate `path`: a chosen one in a run of writes,
    /// and so an exploration's through a path that keeps the page cache; an exploration's
    /// through a path that bypasses it alone (after the run in progress, so the selector
    /// learns in order). See `write_run.rs`.
    fn record_write(&self, measured: Measured, path: usize, exploring: bool) {
        let alone = exploring && !self.engine.candidates[path].keeps_cache();
        let ended = {
            let mut runs = self.write_run.lock();
            if alone {
                [runs.take(), Some(Run::start(measured, path, None))]
            } else {
                runs.add(measured, path)
            }
        };
        for run in ended.into_iter().flatten() {
            self.record_run(run);
        }
    }

    /// A read-only descriptor of the file for cheap questions (page-cache residency) and
    /// write-back; `None` when it cannot be opened.
    fn probe_file(&self) -> Option<&std::fs::File> {
        self.probe_fd
            .get_or_init(|| {
                let f = std::fs::File::open(&self.path).ok()?;
                let meta = f.metadata().ok()?;
                let same = self.identity.as_ref().is_some_and(|id| id.is(&meta));
                same.then_some(f)
            })
            .as_ref()
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
            .iter()
            .flatten()
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
        for slot in self.handles_mut().iter_mut() {
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
