//! The identity of an open file: device and inode, checked when a backend's handle is opened
//! later, so that every handle of one engine file reaches the file first opened.

use fastensor_core::{Error, ErrorKind};
use std::path::Path;

/// The identity of a file on the local file systems: its device and inode, and what it is
/// when it is not a regular file or a directory.
#[derive(Debug, Clone, Copy)]
pub(super) struct FileId {
    dev: u64,
    ino: u64,
    pub(super) special: Option<&'static str>,
}

impl FileId {
    /// The file at `path` (following symbolic links); `None` when there is none.
    pub(super) fn of(path: &Path) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            special: special_kind(&meta.file_type()),
        })
    }

    pub(super) fn same_file(&self, other: &FileId) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }

    /// A read-only descriptor of this file, opened at `path`; `None` when `path` cannot be
    /// opened for reading or names another file now.
    pub(super) fn open_read_only(&self, path: &Path) -> Option<std::fs::File> {
        let f = std::fs::File::open(path).ok()?;
        let meta = f.metadata().ok()?;
        self.is(&meta).then_some(f)
    }

    /// True when `meta` describes this file.
    pub(super) fn is(&self, meta: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        (self.dev, self.ino) == (meta.dev(), meta.ino())
    }
}

/// What a file that is neither a regular file nor a directory is (`None` for those two).
pub(super) fn special_kind(ft: &std::fs::FileType) -> Option<&'static str> {
    (!ft.is_file() && !ft.is_dir()).then(|| crate::atomic::describe(ft))
}

pub(super) fn not_regular(kind: &str) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("not a regular file ({kind})"),
    )
}

/// The error of a file replaced (renamed over) `when`: [`ErrorKind::Changed`].
pub(super) fn replaced(path: &Path, when: &str) -> Error {
    Error::new(
        ErrorKind::Changed,
        format!("the file was replaced (renamed over) {when}: open it again"),
    )
    .with_path(path)
}
