//! An example of a **dynamic plugin**: a backend built as a shared library (`cdylib`) that
//! fastensor loads at run time.
//!
//! The backend, [`StdFsBackend`] (`example-stdfs`), moves bytes with the standard library's
//! positional file I/O (`pread`/`pwrite` through `std::os::unix::fs::FileExt`). The one line
//! that makes it a plugin is the [`fastensor_plugin::export_plugin!`] at the bottom of this file (the
//! plugin depends on `fastensor-core` for the traits and on `fastensor-plugin`, without its
//! `load` feature, for the macro).
//!
//! Build it and point fastensor at it:
//!
//! ```sh
//! cargo build -p fastensor-example-plugin
//! FASTENSOR_PLUGINS=target/debug/libfastensor_example_plugin.so fastensor backends
//! ```
#![deny(missing_docs)]

use fastensor_core::{
    write_end, Availability, Backend, BackendFile, Capabilities, Error, ErrorKind, MemMut, MemRef,
    OpenMode, Result,
};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// The name of the example backend.
pub const STDFS: &str = "example-stdfs";

/// Files read and written with `std::fs` positional I/O.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdFsBackend;

impl Backend for StdFsBackend {
    fn name(&self) -> &str {
        STDFS
    }

    fn capabilities(&self) -> Capabilities {
        // Host memory, any alignment, one request at a time, durable sync: the defaults.
        Capabilities::default()
    }

    fn probe(&self) -> Availability {
        if cfg!(unix) {
            Availability::Available
        } else {
            Availability::Unavailable {
                reason: "example-stdfs uses Unix positional I/O".into(),
            }
        }
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        let mut options = OpenOptions::new();
        options.read(true);
        match mode {
            OpenMode::Read => {}
            OpenMode::ReadWrite => {
                options.write(true);
            }
            OpenMode::Create => {
                options.write(true).create(true);
            }
            OpenMode::Truncate => {
                options.write(true).create(true).truncate(true);
            }
        }
        let fail = |e: std::io::Error| {
            Error::io(e, format!("cannot open ({mode:?})"))
                .with_backend(STDFS)
                .with_path(path)
        };
        let file = options.open(path).map_err(fail)?;
        // Opening a directory for reading succeeds on Linux; refuse it like every backend.
        if file.metadata().map_err(fail)?.is_dir() {
            return Err(Error::new(ErrorKind::InvalidInput, "is a directory")
                .with_backend(STDFS)
                .with_path(path));
        }
        Ok(Box::new(StdFsFile {
            file,
            path: path.to_path_buf(),
        }))
    }
}

/// An open file of [`StdFsBackend`].
#[derive(Debug)]
struct StdFsFile {
    file: File,
    path: PathBuf,
}

impl StdFsFile {
    fn err(&self, e: std::io::Error, what: &str, offset: Option<u64>) -> Error {
        let err = Error::io(e, what).with_backend(STDFS).with_path(&self.path);
        match offset {
            Some(o) => err.with_offset(o),
            None => err,
        }
    }
}

#[cfg(unix)]
impl BackendFile for StdFsFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        use std::os::unix::fs::FileExt;
        let buf = dst.host_for(STDFS, &self.path)?;
        // Short only at the end of the file: keep reading until full or end of file.
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.err(e, "read failed", Some(offset))),
            }
        }
        Ok(done)
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let buf = src.host_for(STDFS, &self.path)?;
        write_end(offset, buf.len(), STDFS, &self.path)?;
        // Every byte or an error.
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.err(e, "write failed", Some(offset)))
    }

    fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| self.err(e, "sync failed", None))
    }

    fn len(&self) -> Result<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| self.err(e, "cannot read the length", None))
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .map_err(|e| self.err(e, "cannot set the length", None))
    }
}

// The plugin's entry point: one backend per load.
fastensor_plugin::export_plugin!(StdFsBackend);
