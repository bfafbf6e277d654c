//! The part of a backend's open file that is the same for every backend of local files: the
//! descriptor that syncs and sizes the file, its path, the backend's name for errors, and
//! the file's length as the handle knows it ([`KnownLen`]). A backend's handle holds one
//! [`LocalFile`] and forwards its `path`, `sync`, `len` and `set_len` to it with
//! [`local_file_methods!`](crate::local_file_methods).

use crate::{file_len, set_file_len, sync_file, transfer_error};
/// The result type of the methods [`local_file_methods!`](crate::local_file_methods) writes.
pub use fastensor_core::Result;
use fastensor_core::{Error, KnownLen};
use std::fs::File;
use std::path::{Path, PathBuf};

/// An open local file of one backend. Every error it returns names the backend and the path.
#[derive(Debug)]
pub struct LocalFile {
    file: File,
    path: PathBuf,
    backend: &'static str,
    /// The file's length as this handle knows it: reads are clamped by it, with no `fstat`.
    known: KnownLen,
}

impl LocalFile {
    /// `file`, opened at `path` by `backend`. Its known length starts at 0 (unknown), so the
    /// handle costs no `fstat` at open.
    pub fn new(backend: &'static str, file: File, path: PathBuf) -> Self {
        LocalFile {
            file,
            path,
            backend,
            known: KnownLen::default(),
        }
    }

    /// The descriptor.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's length as this handle knows it.
    pub fn known(&self) -> &KnownLen {
        &self.known
    }

    /// The file's length from the file system (`fstat`), not remembered.
    pub fn stat(&self) -> Result<u64> {
        file_len(&self.file, self.backend, &self.path)
    }

    /// A failed transfer of this file at `offset` ([`transfer_error`]).
    pub fn err(&self, e: std::io::Error, what: &str, offset: u64) -> Error {
        transfer_error(e, what, self.backend, &self.path, offset)
    }

    /// `e` with this file's backend and path (for errors from elsewhere, a device's driver).
    pub fn about(&self, e: Error) -> Error {
        e.with_backend(self.backend).with_path(&self.path)
    }

    /// `fdatasync` of the descriptor. Other descriptors of the same file share its inode, so
    /// this also writes back what they wrote through the page cache, and the file size.
    pub fn sync(&self) -> Result<()> {
        sync_file(&self.file, self.backend, &self.path)
    }

    /// The file's length from the file system, remembered ([`KnownLen::refresh`]).
    #[allow(clippy::len_without_is_empty)] // `BackendFile::is_empty` is the caller's
    pub fn len(&self) -> Result<u64> {
        self.known.refresh(|| self.stat())
    }

    /// Cuts or extends the file to `len` bytes, remembered ([`KnownLen::resize`]).
    pub fn set_len(&self, len: u64) -> Result<()> {
        self.known.resize(len, |len| {
            set_file_len(&self.file, len, self.backend, &self.path)
        })
    }

    /// [`KnownLen::read_clamped`] with this file's `fstat`.
    pub fn read_clamped(
        &self,
        offset: u64,
        want: usize,
        read: impl FnMut(usize) -> Result<()>,
    ) -> Result<usize> {
        self.known.read_clamped(offset, want, || self.stat(), read)
    }

    /// [`KnownLen::read_with`] with this file's `fstat`.
    pub fn read_with<T>(&self, end: u64, read: impl FnMut(u64) -> Result<T>) -> Result<T> {
        self.known.read_with(end, || self.stat(), read)
    }

    /// A write through this handle ended at `end` ([`KnownLen::wrote`]).
    pub fn wrote(&self, end: u64) {
        self.known.wrote(end);
    }
}

/// Inside an `impl BackendFile`, the methods every local-file backend shares, forwarded to
/// its [`LocalFile`](crate::local::LocalFile) field `$field`: `path`, `sync`, `len` and
/// `set_len`.
#[macro_export]
macro_rules! local_file_methods {
    ($field:ident) => {
        fn path(&self) -> &::std::path::Path {
            self.$field.path()
        }

        fn sync(&self) -> $crate::local::Result<()> {
            self.$field.sync()
        }

        fn len(&self) -> $crate::local::Result<u64> {
            self.$field.len()
        }

        fn set_len(&self, len: u64) -> $crate::local::Result<()> {
            self.$field.set_len(len)
        }
    };
}
