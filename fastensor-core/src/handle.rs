//! The preamble every backend's file handle shares: taking memory of the kind it transfers
//! (else the [`unsupported_memory`] error), and the file's length as the handle knows it
//! ([`KnownLen`]), so that a read inside the file needs no `fstat` to be clamped to its end.

use crate::{
    readable_len, unsupported_memory, DeviceSlice, DeviceSliceMut, ErrorKind, MemMut, MemRef,
    Result,
};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// `host_for` and `device_for` on the memory enum `$mem`, whose host variant holds `$host`
/// and device variant `$device`: the same two methods for a read's and a write's memory.
macro_rules! memory_for {
    ($mem:ident, $host:ty, $device:ty) => {
        impl<'a> $mem<'a> {
            /// The host bytes, or `backend`'s [`unsupported_memory`] error naming `path`.
            pub fn host_for(self, backend: &str, path: &Path) -> Result<$host> {
                match self {
                    $mem::Host(buf) => Ok(buf),
                    other => Err(unsupported_memory(backend, other.kind(), path)),
                }
            }

            /// The device memory, or `backend`'s [`unsupported_memory`] error naming `path`.
            pub fn device_for(self, backend: &str, path: &Path) -> Result<$device> {
                match self {
                    $mem::Device(d) => Ok(d),
                    other => Err(unsupported_memory(backend, other.kind(), path)),
                }
            }
        }
    };
}

memory_for!(MemMut, &'a mut [u8], DeviceSliceMut<'a>);
memory_for!(MemRef, &'a [u8], DeviceSlice<'a>);

/// The length of an open file as its handle last saw it: from its last `fstat`
/// ([`set`](Self::set) after [`BackendFile::len`](crate::BackendFile::len)), its own
/// `set_len` ([`set`](Self::set)) and its own writes ([`wrote`](Self::wrote)). It starts at
/// 0 (unknown), so a handle costs no `fstat` at open.
///
/// Reads are clamped to the end of the file through [`read_with`](Self::read_with), which
/// asks the file system (`stat`) only when the read reaches past the known length (the file
/// may have grown through another handle) or came up short with
/// [`ErrorKind::UnexpectedEof`] (it may have shrunk). Either way a read returns what it
/// returned when every read began with an `fstat`: short only at the end of the file as it
/// is when the read begins, and an `UnexpectedEof` error only when the file shrinks during
/// the read.
#[derive(Debug, Default)]
pub struct KnownLen(AtomicU64);

impl KnownLen {
    /// The file is `len` bytes long (seen by `fstat`, or set by this handle).
    pub fn set(&self, len: u64) {
        self.0.store(len, Ordering::Release);
    }

    /// A write through this handle ended at `end`: the file is at least that long.
    pub fn wrote(&self, end: u64) {
        self.0.fetch_max(end, Ordering::AcqRel);
    }

    /// The known length.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// The file's length from `stat` (an `fstat`), remembered: what a handle's
    /// [`BackendFile::len`](crate::BackendFile::len) returns.
    pub fn refresh(&self, stat: impl FnOnce() -> Result<u64>) -> Result<u64> {
        let len = stat()?;
        self.set(len);
        Ok(len)
    }

    /// Sets the file's length to `len` with `set_len` and remembers it: a handle's
    /// [`BackendFile::set_len`](crate::BackendFile::set_len).
    pub fn resize(&self, len: u64, set_len: impl FnOnce(u64) -> Result<()>) -> Result<()> {
        set_len(len)?;
        self.set(len);
        Ok(())
    }

    /// Runs `read` with the length of the file, for reads that end at most at `end`: the
    /// known length when `end` lies within it, else `stat`'s (remembered). When `read`
    /// fails with [`ErrorKind::UnexpectedEof`] on a known length and `stat` now says the
    /// file is shorter, the file shrank before the read began: `read` runs again with the new
    /// length. `read` must be idempotent.
    pub fn read_with<T>(
        &self,
        end: u64,
        stat: impl FnOnce() -> Result<u64>,
        mut read: impl FnMut(u64) -> Result<T>,
    ) -> Result<T> {
        let known = self.get();
        if end > known {
            return read(self.refresh(stat)?);
        }
        match read(known) {
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                let len = self.refresh(stat)?;
                if len < known {
                    read(len)
                } else {
                    Err(e)
                }
            }
            other => other,
        }
    }

    /// Reads `want` bytes at `offset`, clamped to the end of the file ([`readable_len`]):
    /// `read(len)` fills the first `len` bytes (never called for 0). Returns the bytes read.
    /// See [`read_with`](Self::read_with) for when `stat` runs.
    pub fn read_clamped(
        &self,
        offset: u64,
        want: usize,
        stat: impl FnOnce() -> Result<u64>,
        mut read: impl FnMut(usize) -> Result<()>,
    ) -> Result<usize> {
        if want == 0 {
            return Ok(0);
        }
        let end = offset.saturating_add(want as u64);
        self.read_with(end, stat, |file_len| {
            let len = readable_len(offset, want, file_len);
            if len > 0 {
                read(len)?;
            }
            Ok(len)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use std::cell::Cell;

    /// A file of `len` bytes whose reads fail with `UnexpectedEof` past its end, and the
    /// `fstat`s asked for.
    struct File {
        len: Cell<u64>,
        stats: Cell<u32>,
    }

    impl File {
        fn new(len: u64) -> Self {
            File {
                len: Cell::new(len),
                stats: Cell::new(0),
            }
        }

        fn stat(&self) -> Result<u64> {
            self.stats.set(self.stats.get() + 1);
            Ok(self.len.get())
        }

        fn read(&self, known: &KnownLen, offset: u64, want: usize) -> Result<usize> {
            known.read_clamped(
                offset,
                want,
                || self.stat(),
                |len| {
                    if offset + len as u64 > self.len.get() {
                        return Err(Error::new(ErrorKind::UnexpectedEof, "shrank"));
                    }
                    Ok(())
                },
            )
        }
    }

    #[test]
    fn reads_within_the_known_length_ask_no_fstat() {
        let file = File::new(100);
        let known = KnownLen::default();
        assert_eq!(file.read(&known, 0, 10).unwrap(), 10);
        assert_eq!(file.stats.get(), 1);
        for offset in [0, 50, 90] {
            assert_eq!(file.read(&known, offset, 10).unwrap(), 10);
        }
        assert_eq!(file.stats.get(), 1);
        // Past the end: asked again, and short.
        assert_eq!(file.read(&known, 95, 10).unwrap(), 5);
        assert_eq!(file.read(&known, 100, 10).unwrap(), 0);
        assert_eq!(file.read(&known, 0, 0).unwrap(), 0);
        assert_eq!(file.stats.get(), 3);
    }

    #[test]
    fn a_file_grown_or_shrunk_elsewhere_reads_as_it_is_now() {
        let file = File::new(100);
        let known = KnownLen::default();
        known.set(100);
        // Grown through another handle: a read past the known end sees the new length.
        file.len.set(200);
        assert_eq!(file.read(&known, 150, 100).unwrap(), 50);
        assert_eq!(known.get(), 200);
        // Shrunk through another handle: the short read asks again and reads what is left.
        file.len.set(120);
        assert_eq!(file.read(&known, 100, 50).unwrap(), 20);
        assert_eq!(file.read(&known, 130, 10).unwrap(), 0);
        assert_eq!(known.get(), 120);
    }

    #[test]
    fn an_eof_the_length_does_not_explain_is_an_error() {
        let known = KnownLen::default();
        known.set(100);
        let err = known
            .read_clamped(
                0,
                50,
                || Ok(100),
                |_| {
                    Err(Error::new(
                        ErrorKind::UnexpectedEof,
                        "shrank during the read",
                    ))
                },
            )
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnexpectedEof);
        // Other errors are returned as they are, with no `fstat`.
        let err = known
            .read_clamped(
                0,
                50,
                || panic!("no fstat"),
                |_| Err(Error::new(ErrorKind::Io, "device")),
            )
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Io);
    }

    #[test]
    fn writes_and_set_len_move_the_known_length() {
        let known = KnownLen::default();
        known.wrote(4096);
        known.wrote(100);
        assert_eq!(known.get(), 4096);
        known.set(10);
        assert_eq!(known.get(), 10);
    }
}
