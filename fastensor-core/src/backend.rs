//! The contract every I/O path implements.

use crate::knobs::{KnobSpec, Knobs};
use crate::policy::{NewLoadFacts, NewLoads};
use crate::{Capabilities, Error, ErrorKind, MemMut, MemRef, MemoryKind, Result};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// Whether a backend can run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// Ready to use.
    Available,
    /// Cannot run on this machine, and why (e.g. "libcufile.so.0 not found").
    Unavailable {
        /// A precise, human-readable reason.
        reason: String,
    },
}

impl Availability {
    /// True when available.
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available)
    }
}

impl fmt::Display for Availability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Availability::Available => f.write_str("available"),
            Availability::Unavailable { reason } => write!(f, "unavailable: {reason}"),
        }
    }
}

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpenMode {
    /// Read an existing file.
    Read,
    /// Read and write an existing file.
    ReadWrite,
    /// Read and write, creating the file when missing and keeping its content otherwise.
    Create,
    /// Read and write, creating the file when missing and emptying it otherwise.
    Truncate,
}

impl OpenMode {
    /// True for the modes that allow writing.
    pub fn writable(self) -> bool {
        !matches!(self, OpenMode::Read)
    }
}

/// An I/O path: page cache, `O_DIRECT`, mmap, io_uring, GPUDirect Storage, ...
///
/// Implementations never panic in `probe`: a backend that cannot run says why.
pub trait Backend: Send + Sync + 'static {
    /// The unique name, e.g. `"posix-direct"`.
    fn name(&self) -> &str;

    /// What the backend can do.
    fn capabilities(&self) -> Capabilities;

    /// Whether the backend can run on this machine. Default: available (a backend that
    /// needs nothing beyond the file system).
    fn probe(&self) -> Availability {
        Availability::Available
    }

    /// Opens `path`. Errors name the file and the backend.
    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>>;

    /// More about how the backend runs on this machine, when it is available, e.g.
    /// `true GDS (nvidia-fs 2.17)` or `compatibility mode (...)` for GPUDirect Storage.
    /// `fastensor backends` prints it after the status. Default: none.
    fn detail(&self) -> Option<String> {
        None
    }

    /// The tuning knobs this backend exposes (see [`crate::knobs`]). Default: none.
    fn knobs(&self) -> Vec<KnobSpec> {
        Vec::new()
    }

    /// A copy of this backend with `knobs` applied over its current settings; unknown names
    /// and bad values are [`ErrorKind::InvalidInput`]. Default: [`ErrorKind::Unsupported`].
    fn with_knobs(&self, knobs: &Knobs) -> Result<SharedBackend> {
        Err(no_knobs(self.name(), knobs))
    }
}

/// The error of a backend with no knobs asked for `knobs`.
pub(crate) fn no_knobs(backend: &str, knobs: &Knobs) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!("backend `{backend}` has no knobs (asked for `{knobs}`)"),
    )
    .with_backend(backend)
}

impl fmt::Debug for dyn Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name())
            .finish()
    }
}

/// One read of a batch: fill `dst` from `offset`; `done` receives the bytes read.
#[derive(Debug)]
pub struct ReadRequest<'a> {
    /// File offset.
    pub offset: u64,
    /// Destination.
    pub dst: MemMut<'a>,
    /// Set by the backend: bytes read (short only at the end of the file).
    pub done: usize,
}

impl<'a> ReadRequest<'a> {
    /// A request to fill `dst` from `offset`.
    pub fn new(offset: u64, dst: impl Into<MemMut<'a>>) -> Self {
        ReadRequest {
            offset,
            dst: dst.into(),
            done: 0,
        }
    }
}

/// One write of a batch: `src` to `offset`.
#[derive(Debug, Clone, Copy)]
pub struct WriteRequest<'a> {
    /// File offset.
    pub offset: u64,
    /// Source.
    pub src: MemRef<'a>,
}

impl<'a> WriteRequest<'a> {
    /// A request to write `src` at `offset`.
    pub fn new(offset: u64, src: impl Into<MemRef<'a>>) -> Self {
        WriteRequest {
            offset,
            src: src.into(),
        }
    }
}

/// An open file of a backend. All methods take `&self`: a handle may be shared by threads,
/// and transfers to disjoint ranges may run at the same time.
///
/// **Reads past the end** are short, never an error: `read_at` returns how many bytes it
/// read, which is less than the destination's length only when the file ends first (0 when
/// `offset` is at or past the end). Every backend behaves this way.
///
/// **Writes** write every byte or fail; writing past the end extends the file to exactly
/// `offset + len` and never changes bytes outside `[offset, offset + len)`.
pub trait BackendFile: Send + Sync {
    /// The file's path.
    fn path(&self) -> &Path;

    /// Reads into `dst` from `offset`; returns the bytes read (short only at end of file).
    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize>;

    /// Writes all of `src` at `offset`.
    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()>;

    /// A small read of the file's own metadata (a checkpoint's header) into host memory:
    /// a file that chooses its path per transfer reads it plainly, with no choice and no
    /// measurement. Returns the bytes read (short only at the end of the file).
    fn read_metadata_at(&self, offset: u64, dst: &mut [u8]) -> Result<usize> {
        self.read_at(offset, MemMut::Host(dst))
    }

    /// Starts a job: the reads of `job` (one checkpoint load) that belong together.
    /// Returns the file to issue the job's reads through, or `None` to use this one. A file
    /// that chooses its path per transfer (an engine's) chooses once for the whole job and
    /// measures it whole, when the returned file is dropped.
    fn begin_read_job(&self, job: &ReadJob) -> Option<Box<dyn BackendFile + '_>> {
        let _ = job;
        None
    }

    /// Reads of this file a caller should keep in flight at once to reach its speed, where
    /// that is more than the caller's own count of I/O threads gives: an object's file,
    /// each of whose reads is one request over the network, asks for as many as its store
    /// allows. `None` (the default): the caller decides.
    fn reads_in_flight(&self) -> Option<usize> {
        None
    }

    /// Reads many requests; each request's `done` receives its byte count. The default runs
    /// them one after another; backends with a native batch path override it.
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        for req in requests.iter_mut() {
            req.done = self.read_at(req.offset, req.dst.reborrow())?;
        }
        Ok(())
    }

    /// Writes many requests. The default runs them one after another.
    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        for req in requests {
            self.write_at(req.offset, req.src)?;
        }
        Ok(())
    }

    /// Makes every completed write durable (data and the file size).
    fn sync(&self) -> Result<()>;

    /// The file's current length in bytes.
    fn len(&self) -> Result<u64>;

    /// True when the file is empty.
    fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Sets the file's length, cutting or extending it with zeros.
    fn set_len(&self, len: u64) -> Result<()>;
}

impl fmt::Debug for dyn BackendFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendFile")
            .field("path", &self.path())
            .finish()
    }
}

/// Conveniences on every [`BackendFile`] (kept out of the core trait).
pub trait BackendFileExt: BackendFile {
    /// Reads exactly `dst.len()` bytes or fails with [`ErrorKind::UnexpectedEof`].
    fn read_exact_at(&self, offset: u64, dst: MemMut<'_>) -> Result<()> {
        let want = dst.len();
        let got = self.read_at(offset, dst)?;
        if got != want {
            return Err(Error::new(
                ErrorKind::UnexpectedEof,
                format!("wanted {want} bytes, the file ended after {got}"),
            )
            .with_path(self.path())
            .with_offset(offset));
        }
        Ok(())
    }

    /// Reads the whole file into a new page-aligned host buffer.
    fn read_all(&self) -> Result<crate::HostBuffer> {
        let len = usize::try_from(self.len()?).map_err(|_| {
            Error::new(ErrorKind::InvalidInput, "file too large for memory").with_path(self.path())
        })?;
        let mut buf = crate::HostBuffer::new(len)?;
        self.read_exact_at(0, buf.as_mem_mut())?;
        Ok(buf)
    }
}

impl<T: BackendFile + ?Sized> BackendFileExt for T {}

/// The error for memory of a kind the backend does not take.
pub fn unsupported_memory(backend: &str, kind: MemoryKind, path: &Path) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!("backend `{backend}` cannot transfer to or from {kind} memory"),
    )
    .with_backend(backend)
    .with_path(path)
}

/// A shared backend.
pub type SharedBackend = Arc<dyn Backend>;

/// How many of `want` bytes a read at `offset` can return from a file of `file_len` bytes:
/// fewer only at the end of the file, 0 at or past it. Every backend clamps its reads so.
pub fn readable_len(offset: u64, want: usize, file_len: u64) -> usize {
    if offset >= file_len {
        return 0;
    }
    (want as u64).min(file_len - offset) as usize
}

/// The end of a write of `len` bytes at `offset`, or an [`ErrorKind::InvalidInput`] error
/// naming the backend and file when it overflows a 64-bit offset.
pub fn write_end(offset: u64, len: usize, backend: &str, path: &Path) -> Result<u64> {
    offset.checked_add(len as u64).ok_or_else(|| {
        Error::new(ErrorKind::InvalidInput, "offset + length overflows")
            .with_backend(backend)
            .with_path(path)
            .with_offset(offset)
    })
}

/// What a job of reads is: see [`BackendFile::begin_read_job`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadJob {
    /// Bytes the job reads in all.
    pub bytes: u64,
    /// Reads it issues.
    pub requests: usize,
    /// Bytes of its largest read (the size the job's context is keyed by).
    pub largest: u64,
    /// Reads in flight at once.
    pub in_flight: u32,
    /// Where the bytes go.
    pub memory: MemoryKind,
    /// Whether the destination is new memory not yet touched (it pays its page faults and
    /// zeroing under the reads).
    pub fresh: bool,
    /// The file offset of the job's first read.
    pub first_offset: u64,
}

/// What differs between the places a [`FileOpener`] reaches (a local file system, an object
/// store), as the opener answers for one path ([`FileOpener::place`]): the layers above ask
/// it, never the path's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// How a save makes its bytes visible, whole.
    pub commit: Commit,
    /// Whether a file there may be memory-mapped (else it is read).
    pub mappable: bool,
    /// Whether a name there may be a directory of its own (created, synced, tested with
    /// `is_dir`). Where not, a directory is only the prefix of the names under it, and a
    /// name that does not end in `.safetensors` is taken for one (no request is made).
    pub directories: bool,
}

/// How a save makes its bytes visible, whole: see [`Place::commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Written under a temporary name beside the path and renamed over it once synced (a
    /// reader sees the old file or the new one); the directory decides what is visible.
    RenameOver,
    /// Written at the path itself, which shows nothing until [`BackendFile::sync`] makes the
    /// whole appear (an upload); dropped before, nothing appears. Its length is declared
    /// ([`BackendFile::set_len`]) before its first byte, and nothing is renamed: a sharded
    /// save commits by writing its index last.
    OnSync,
}

impl Place {
    /// A local file system: rename-over saves, mappable files, directories.
    pub const LOCAL: Place = Place {
        commit: Commit::RenameOver,
        mappable: true,
        directories: true,
    };
    /// An object store: saves appear whole on sync, objects are read, prefixes only.
    pub const OBJECT: Place = Place {
        commit: Commit::OnSync,
        mappable: false,
        directories: false,
    };
}

/// Opens files for the layers above the backends (checkpoints): a [`Backend`] (every
/// transfer through it), or an engine that picks a backend per transfer. It lives here, below
/// both, so that the engine implements it without depending on the layers that use it.
pub trait FileOpener: Send + Sync {
    /// Opens `path` in `mode` for checkpoint transfers. Errors name the file.
    fn open_file(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>>;

    /// Opens, for offload, the swap file at `path` (written once, read back once, its
    /// length set by the caller): through the backend `pin` names when given, else through
    /// one that bypasses the page cache where one can take it (a cached copy would hold the
    /// very memory offload frees). The default opens it as [`open_file`](Self::open_file)
    /// does (`pin` is the caller's choice of backend, which only an engine has).
    fn open_swap(&self, path: &Path, pin: Option<&str>) -> Result<Box<dyn BackendFile>> {
        let _ = pin;
        self.open_file(path, OpenMode::Truncate)
    }

    /// The device library GPU memory moves through where this opener has one (an engine
    /// built with CUDA support), for the users of its files that copy device memory
    /// themselves (offload's GPU tensors). The default, none.
    fn device_runtime(&self) -> Option<std::sync::Arc<dyn crate::device_copies::DeviceRuntime>> {
        None
    }

    /// What the place `path` names is ([`Place`]), as this opener reaches it. The default,
    /// a local file system.
    fn place(&self, path: &Path) -> Place {
        let _ = path;
        Place::LOCAL
    }

    /// What a load of a whole checkpoint into new host memory is planned from
    /// ([`plan_new_load`](crate::policy::plan_new_load): map the file copy-on-write, or read
    /// it through [`open_file`](Self::open_file)'s files). A query, with no effect. The
    /// default, facts that plan a read.
    fn new_load_facts(&self) -> NewLoadFacts {
        NewLoadFacts::default()
    }

    /// The names directly inside `dir` (a directory, or an object prefix), sorted: how a
    /// sharded checkpoint's index is found. The default is [`ErrorKind::Unsupported`].
    fn list_names(&self, dir: &Path) -> Result<Vec<String>> {
        Err(Error::new(
            ErrorKind::Unsupported,
            "this opener cannot list a directory",
        )
        .with_path(dir))
    }

    /// Removes the file (or object) at `path`; nothing there is not an error. How a save
    /// removes what an earlier save left and the new one does not name (the shards of a
    /// sharded checkpoint under an object prefix). The default is [`ErrorKind::Unsupported`].
    fn remove_file(&self, path: &Path) -> Result<()> {
        Err(Error::new(ErrorKind::Unsupported, "this opener cannot remove a file").with_path(path))
    }

    /// A local copy of the file at `path` that a load reads instead, where this opener keeps
    /// one (a cache of remote objects): fetched now unless a complete copy of the current
    /// version is there already. `None`: read `path` itself. The copy is the caller's to
    /// read only. The default, none.
    fn local_copy(&self, path: &Path) -> Result<Option<std::path::PathBuf>> {
        let _ = path;
        Ok(None)
    }

    /// Told once per load into new host memory (all tensors or a selection) where it put the bytes
    /// (a mapping the file system or a lease refused counts as the read that replaced it).
    /// The default does nothing; an engine counts them.
    fn note_new_load(&self, placement: NewLoads) {
        let _ = placement;
    }
}

/// A plain backend is the caller's choice: every transfer goes through it, and loads into
/// new memory read through it.
impl<B: Backend + ?Sized> FileOpener for B {
    fn open_file(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        self.open(path, mode)
    }

    fn new_load_facts(&self) -> NewLoadFacts {
        NewLoadFacts {
            readers: vec![self.capabilities()],
            chosen: true,
            ..NewLoadFacts::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_clamped_to_the_file() {
        assert_eq!(readable_len(0, 10, 100), 10);
        assert_eq!(readable_len(95, 10, 100), 5);
        assert_eq!(readable_len(100, 10, 100), 0);
        assert_eq!(readable_len(u64::MAX, 10, 100), 0);
    }

    #[test]
    fn overflowing_writes_are_refused() {
        assert_eq!(write_end(10, 5, "b", Path::new("/f")).unwrap(), 15);
        let err = write_end(u64::MAX - 1, 5, "b", Path::new("/f")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("/f"));
    }
}
