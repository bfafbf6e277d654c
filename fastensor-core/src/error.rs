//! One error type for every fastensor operation.

use std::fmt;
use std::path::{Path, PathBuf};

/// The category of an [`Error`]; match on it rather than on messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A file, backend or tensor that was asked for does not exist.
    NotFound,
    /// The operating system refused access (for example a write to a read-only file).
    PermissionDenied,
    /// Something that must be new already exists (for example a backend name).
    AlreadyExists,
    /// A backend cannot run on this machine (missing library, disabled kernel feature).
    Unavailable,
    /// The backend runs but cannot do this operation (for example writes through mmap,
    /// device memory on a host-only backend, or `O_DIRECT` on a file system that refuses it).
    Unsupported,
    /// An argument is wrong: bad offset, length, dtype, shape, a directory given as a file.
    InvalidInput,
    /// A buffer or offset does not meet an alignment the operation requires.
    Unaligned,
    /// A file's content is not what its format promises.
    Corrupt,
    /// The file ended before the bytes the operation needed.
    UnexpectedEof,
    /// The file system is full or a quota is exhausted.
    StorageFull,
    /// Memory could not be allocated.
    OutOfMemory,
    /// A GPU or driver call failed.
    Device,
    /// Any other operating-system I/O error; the OS error is kept as the source.
    Io,
    /// The file changed while the operation used it (a new file was renamed over its path):
    /// nothing of the two versions was mixed, and the operation may succeed when tried
    /// again.
    Changed,
    /// An error that fits no other kind.
    Other,
}

impl ErrorKind {
    /// A short lowercase description of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::AlreadyExists => "already exists",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::Unaligned => "unaligned",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::UnexpectedEof => "unexpected end of file",
            ErrorKind::StorageFull => "storage full",
            ErrorKind::OutOfMemory => "out of memory",
            ErrorKind::Device => "device error",
            ErrorKind::Io => "i/o error",
            ErrorKind::Changed => "file changed",
            ErrorKind::Other => "error",
        }
    }
}

display_as_str!(ErrorKind, as_str);

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error of every fastensor operation: a kind, a message, and where it happened
/// (backend, file, offset). OS and driver errors are kept as the [`source`](std::error::Error::source).
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    backend: Option<String>,
    path: Option<PathBuf>,
    offset: Option<u64>,
    source: Option<Source>,
}

/// Result alias used across fastensor.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with a human-readable `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            backend: None,
            path: None,
            offset: None,
            source: None,
        }
    }

    /// Wraps an OS error, choosing the kind from the error (ENOENT is `NotFound`, ENOSPC is
    /// `StorageFull`, ...). `what` says what was being done, e.g. "open for reading".
    pub fn io(err: std::io::Error, what: impl Into<String>) -> Self {
        let kind = kind_of_io(&err);
        Error::new(kind, what).with_source(err)
    }

    /// Records the backend the error happened in.
    pub fn with_backend(mut self, backend: impl Into<String>) -> Self {
        if self.backend.is_none() {
            self.backend = Some(backend.into());
        }
        self
    }

    /// Records the file the error is about.
    pub fn with_path(mut self, path: impl AsRef<Path>) -> Self {
        if self.path.is_none() {
            self.path = Some(path.as_ref().to_path_buf());
        }
        self
    }

    /// Names the file `to` where the error names it `from`: for a file reached through
    /// another path than the one its user gave (such as `/proc/self/fd/N`).
    pub fn with_path_renamed(mut self, from: &Path, to: impl AsRef<Path>) -> Self {
        if self.path.as_deref() == Some(from) {
            self.path = Some(to.as_ref().to_path_buf());
        }
        self
    }

    /// Records the file offset the error happened at.
    pub fn with_offset(mut self, offset: u64) -> Self {
        if self.offset.is_none() {
            self.offset = Some(offset);
        }
        self
    }

    /// Keeps `source` as the underlying cause.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The category of the error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without context.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The backend the error happened in, when known.
    pub fn backend(&self) -> Option<&str> {
        self.backend.as_deref()
    }

    /// The file the error is about, when known.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The file offset, when known.
    pub fn offset(&self) -> Option<u64> {
        self.offset
    }

    /// The raw OS error code (`errno`) behind this error, when there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        let mut cur: Option<&(dyn std::error::Error + 'static)> =
            self.source.as_deref().map(|s| s as _);
        while let Some(err) = cur {
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                return io.raw_os_error();
            }
            cur = err.source();
        }
        None
    }
}

/// Maps an OS error onto an [`ErrorKind`].
pub fn kind_of_io(err: &std::io::Error) -> ErrorKind {
    use std::io::ErrorKind as K;
    match err.raw_os_error() {
        Some(28) | Some(122) => return ErrorKind::StorageFull, // ENOSPC, EDQUOT
        Some(21) | Some(20) => return ErrorKind::InvalidInput, // EISDIR, ENOTDIR
        Some(22) => return ErrorKind::InvalidInput,            // EINVAL
        Some(30) => return ErrorKind::PermissionDenied,        // EROFS
        Some(12) => return ErrorKind::OutOfMemory,             // ENOMEM
        Some(38) | Some(95) => return ErrorKind::Unsupported,  // ENOSYS, EOPNOTSUPP
        _ => {}
    }
    match err.kind() {
        K::NotFound => ErrorKind::NotFound,
        K::PermissionDenied => ErrorKind::PermissionDenied,
        K::AlreadyExists => ErrorKind::AlreadyExists,
        K::UnexpectedEof => ErrorKind::UnexpectedEof,
        K::InvalidInput => ErrorKind::InvalidInput,
        K::InvalidData => ErrorKind::Corrupt,
        K::OutOfMemory => ErrorKind::OutOfMemory,
        K::Unsupported => ErrorKind::Unsupported,
        _ => ErrorKind::Io,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(path) = &self.path {
            write!(f, ": {}", path.display())?;
        }
        let mut parts = Vec::new();
        if let Some(b) = &self.backend {
            parts.push(format!("backend {b}"));
        }
        if let Some(o) = self.offset {
            parts.push(format!("offset {o}"));
        }
        if !parts.is_empty() {
            write!(f, " ({})", parts.join(", "))?;
        }
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|s| s as _)
    }
}

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Self {
        Error::io(err, "i/o error")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_path_backend_offset_and_source() {
        let os = std::io::Error::from_raw_os_error(2);
        let err = Error::io(os, "cannot open for reading")
            .with_backend("posix")
            .with_path("/x/y.bin")
            .with_offset(4096);
        assert_eq!(err.kind(), ErrorKind::NotFound);
        let text = err.to_string();
        assert!(
            text.starts_with("cannot open for reading: /x/y.bin (backend posix, offset 4096): ")
        );
        assert_eq!(err.raw_os_error(), Some(2));
    }

    #[test]
    fn os_codes_map_to_kinds() {
        let k = |c| kind_of_io(&std::io::Error::from_raw_os_error(c));
        assert_eq!(k(28), ErrorKind::StorageFull);
        assert_eq!(k(13), ErrorKind::PermissionDenied);
        assert_eq!(k(21), ErrorKind::InvalidInput);
        assert_eq!(k(5), ErrorKind::Io);
    }

    #[test]
    fn first_context_wins() {
        let err = Error::new(ErrorKind::Io, "x")
            .with_path("/a")
            .with_path("/b");
        assert_eq!(err.path(), Some(Path::new("/a")));
        // A path is renamed only where it is the one named.
        let via = Path::new("/proc/self/fd/7");
        let renamed = err.with_path_renamed(Path::new("/a"), "/c");
        assert_eq!(renamed.path(), Some(Path::new("/c")));
        let kept = renamed.with_path_renamed(via, "/d");
        assert_eq!(kept.path(), Some(Path::new("/c")));
    }
}
