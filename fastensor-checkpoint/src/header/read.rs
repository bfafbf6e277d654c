//! Reading a header from a file: in one read when it is short, parsed as it is read when
//! it is long.

use super::PARSE_WHOLE_MAX;
use super::{check_header_len, header_len_of, parse_header, parse_header_from, Header};
use crate::{BackendFile, Error, ErrorKind, HostBuffer, Result};
use std::path::Path;

/// The first read of a file: enough for most headers.
const FIRST_READ: u64 = 64 << 10;

/// Reads and validates the header of an open file; one longer than [`PARSE_WHOLE_MAX`] is
/// parsed as it is read, in pieces of [`FIRST_READ`] bytes (its JSON never held whole).
pub(crate) fn read_header(file: &dyn BackendFile, path: &Path) -> Result<Header> {
    let file_len = file.len().map_err(|e| e.with_path(path))?;
    read_header_with(file_len, &|at, buf| file.read_metadata_at(at, buf), path)
}

/// [`read_header`] of a file of `file_len` bytes read through `read_at` (a read at an
/// offset into a buffer: the bytes read, short only at the end of the file).
pub(crate) fn read_header_with(file_len: u64, read_at: &ReadAt<'_>, path: &Path) -> Result<Header> {
    let ctx = |e: Error| e.with_path(path);
    let mut buf = HostBuffer::new(file_len.min(FIRST_READ) as usize)?;
    let n = read_at(0, &mut buf).map_err(ctx)?;
    let header_len = header_len_of(&buf[..n]).map_err(ctx)?;
    check_header_len(header_len, file_len).map_err(ctx)?;
    let need = 8 + header_len as usize;
    if need <= n {
        return parse_header(&buf[..n], file_len).map_err(ctx);
    }
    if header_len <= PARSE_WHOLE_MAX {
        buf = HostBuffer::new(need)?;
        let got = read_at(0, &mut buf).map_err(ctx)?;
        if got < need {
            return Err(ctx(Error::new(
                ErrorKind::Corrupt,
                "the file shrank while its header was read",
            )));
        }
        return parse_header(&buf[..need], file_len).map_err(ctx);
    }
    let reader = FileReader {
        read_at,
        buf,
        filled: n,
        at: 8,
        pos: 0,
    };
    parse_header_from(reader, header_len, file_len).map_err(ctx)
}

/// A read of a file at an offset into a buffer (see [`read_header_with`]).
pub(crate) type ReadAt<'a> = dyn Fn(u64, &mut [u8]) -> Result<usize> + 'a;

/// Reads a file from an offset on, a buffer at a time.
struct FileReader<'a> {
    read_at: &'a ReadAt<'a>,
    buf: HostBuffer,
    /// Bytes of `buf` holding the file from `pos`.
    filled: usize,
    /// Next byte of `buf` to hand out.
    at: usize,
    /// File offset of `buf[0]`.
    pos: u64,
}

impl std::io::Read for FileReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.filled {
            self.pos += self.filled as u64;
            self.at = 0;
            self.filled = (self.read_at)(self.pos, &mut self.buf).map_err(std::io::Error::other)?;
            if self.filled == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file shrank while its header was read",
                ));
            }
        }
        let n = out.len().min(self.filled - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
