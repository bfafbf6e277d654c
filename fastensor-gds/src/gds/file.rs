//! An open file of the `gds` backend: parallel cuFile pieces, buffered heads and tails of
//! writes, buffer registration, batches.

use super::batch::{self, BatchTarget};
use super::GDS;
use crate::cufile::{CuFile, FileHandle, OpError};
use crate::{cuda, device_buffer};
use fastensor_core::align::split;
use fastensor_core::{
    parallel, unsupported_memory, BackendFile, Error, ErrorKind, MemMut, MemRef, ReadRequest,
    Result, WriteRequest,
};
use fastensor_sys as sys;
use fastensor_sys::local::LocalFile;
use std::fs::File;

/// An open file of the `gds` backend. `handle` is declared first: it is deregistered before
/// the descriptor closes.
#[derive(Debug)]
pub(super) struct GdsFile {
    pub(super) handle: FileHandle,
    /// The `O_DIRECT` descriptor, its path and the file's known length.
    pub(super) local: LocalFile,
    pub(super) buffered: File,
    pub(super) cufile: &'static CuFile,
    pub(super) align: u64,
    pub(super) chunk: usize,
    pub(super) threads: usize,
    pub(super) register: bool,
    pub(super) batch: Option<usize>,
    pub(super) writable: bool,
}

/// A device range resolved for cuFile: the base to pass and the offset of the range in it.
#[derive(Debug, Clone, Copy)]
struct Target {
    base: u64,
    offset: u64,
    ordinal: u32,
}

impl GdsFile {
    /// A failed cuFile call: [`ErrorKind::Device`] when cuFile or the CUDA driver failed
    /// (a `CUfileOpError`), else the operating system's error.
    fn err(&self, e: std::io::Error, what: &str, offset: u64) -> Error {
        if OpError::of(&e).is_some() {
            let err = Error::new(ErrorKind::Device, what).with_source(e);
            return self.local.about(err).with_offset(offset);
        }
        self.local.err(e, what, offset)
    }

    /// Makes GPU `ordinal`'s context current on this thread.
    fn bind(&self, ordinal: u32) -> Result<()> {
        cuda::require()
            .and_then(|d| d.bind(ordinal))
            .map_err(|e| self.local.about(e))
    }

    /// cuFileRead returned no bytes at `offset`: the end of the file when it shrank, else a
    /// failure of cuFile.
    fn nothing_read(&self, offset: u64) -> Error {
        let error = match self.len() {
            Ok(len) if len > offset => Error::new(
                ErrorKind::Io,
                format!("cuFileRead returned no bytes before the end of the {len}-byte file"),
            ),
            _ => Error::new(ErrorKind::UnexpectedEof, "the file shrank during the read"),
        };
        error
            .with_backend(GDS)
            .with_path(self.local.path())
            .with_offset(offset)
    }

    /// Binds the GPU's context and resolves `ptr..ptr + len`, registering its allocation
    /// with cuFile when it is a [`DeviceBuffer`](crate::DeviceBuffer) used before.
    fn target(&self, ptr: u64, len: usize, ordinal: u32) -> Result<Target> {
        self.bind(ordinal)?;
        let plain = Target {
            base: ptr,
            offset: 0,
            ordinal,
        };
        if !self.register {
            return Ok(plain);
        }
        let mut table = device_buffer::ALLOCATIONS.lock();
        let Some((&base, alloc)) = table.range_mut(..=ptr).next_back() else {
            return Ok(plain);
        };
        if ptr + len as u64 > base + alloc.len as u64 {
            return Ok(plain);
        }
        alloc.uses = alloc.uses.saturating_add(1);
        if !alloc.registered && alloc.uses >= 2 {
            alloc.registered = self.cufile.register_buffer(base, alloc.len).is_ok();
        }
        Ok(if alloc.registered {
            Target {
                base,
                offset: ptr - base,
                ordinal,
            }
        } else {
            plain
        })
    }

    /// Reads exactly `len` bytes at `offset` into `t` (+ `skip`), in parallel pieces.
    fn read_exact(&self, t: Target, skip: u64, offset: u64, len: usize) -> Result<()> {
        self.transfer(false, t, skip, offset, len)
    }

    /// Writes `len` bytes from `t` (+ `skip`) at the aligned `offset`, in parallel pieces.
    fn write_direct(&self, t: Target, skip: u64, offset: u64, len: usize) -> Result<()> {
        self.transfer(true, t, skip, offset, len)
    }

    /// Moves exactly `len` bytes between file `offset` and `t` (+ `skip`) with cuFile, in
    /// pieces split at multiples of the chunk size and issued in parallel.
    fn transfer(&self, write: bool, t: Target, skip: u64, offset: u64, len: usize) -> Result<()> {
        let what = if write {
            "cuFileWrite failed"
        } else {
            "cuFileRead failed"
        };
        let pieces = crate::chunk_ranges(offset, offset + len as u64, self.chunk);
        parallel::for_each(pieces, self.threads, |(off, n)| {
            self.bind(t.ordinal)?;
            let mut done = 0usize;
            while done < n {
                let at = off + done as u64;
                let buf_offset = t.offset + skip + (at - offset);
                // SAFETY: the range lies in the memory the caller borrowed for this transfer
                // (mutably when reading; pieces are disjoint); its context is current.
                let moved = unsafe {
                    if write {
                        self.handle.write(t.base, n - done, at, buf_offset)
                    } else {
                        self.handle.read(t.base, n - done, at, buf_offset)
                    }
                }
                .map_err(|e| self.err(e, what, at))?;
                if moved == 0 {
                    return Err(if write {
                        self.err(std::io::Error::other("wrote 0 bytes"), what, at)
                    } else {
                        self.nothing_read(at)
                    });
                }
                done += moved;
            }
            Ok(())
        })
    }

    /// Writes a partial block through the page cache (copied from the device first).
    fn write_buffered(&self, src: u64, ordinal: u32, offset: u64, len: usize) -> Result<()> {
        let mut host = vec![0u8; len];
        device_buffer::copy_to_host(src, ordinal, &mut host).map_err(|e| self.local.about(e))?;
        sys::pwrite_all(&self.buffered, &host, offset)
            .map_err(|e| self.err(e, "write failed", offset))
    }

    fn read_each(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        let items: Vec<&mut ReadRequest<'_>> = requests.iter_mut().collect();
        parallel::for_each(items, self.threads, |r| {
            r.done = self.read_at(r.offset, r.dst.reborrow())?;
            Ok(())
        })
    }
}

impl BackendFile for GdsFile {
    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let d = dst.device_for(GDS, self.local.path())?;
        self.local.read_clamped(offset, d.len(), |len| {
            let t = self.target(d.ptr(), len, d.ordinal())?;
            self.read_exact(t, 0, offset, len)
        })
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let Some((d, end)) =
            crate::device_write(GDS, self.local.path(), self.writable, offset, src)?
        else {
            return Ok(());
        };
        let s = split(offset, d.len() as u64, self.align);
        let [head, middle, tail] = s.lens();
        if middle > 0 {
            let t = self.target(d.ptr(), d.len(), d.ordinal())?;
            self.write_direct(t, head as u64, s.middle.start, middle)?;
        }
        if head > 0 {
            self.write_buffered(d.ptr(), d.ordinal(), s.head.start, head)?;
        }
        if tail > 0 {
            let src = d.ptr() + (head + middle) as u64;
            self.write_buffered(src, d.ordinal(), s.tail.start, tail)?;
        }
        self.local.wrote(end);
        Ok(())
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        if let Some(r) = requests
            .iter()
            .find(|r| !matches!(r.dst, MemMut::Device(_)))
        {
            return Err(unsupported_memory(GDS, r.dst.kind(), self.local.path()));
        }
        match self.batch {
            Some(max) if requests.len() > 1 => {
                for group in requests.chunks_mut(max) {
                    if batch::read(self, group).is_err() {
                        // Reads are idempotent: redo the whole group one request at a time.
                        self.read_each(group)?;
                    }
                }
                Ok(())
            }
            _ => self.read_each(requests),
        }
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        parallel::for_each(requests.iter().collect(), self.threads, |r| {
            self.write_at(r.offset, r.src)
        })
    }

    fastensor_sys::local_file_methods!(local);
}

impl BatchTarget for GdsFile {
    fn cufile(&self) -> &'static CuFile {
        self.cufile
    }
    fn handle(&self) -> &FileHandle {
        &self.handle
    }
    fn file_len(&self) -> Result<u64> {
        self.len()
    }
    fn resolve(&self, ptr: u64, len: usize, ordinal: u32) -> Result<(u64, u64)> {
        self.target(ptr, len, ordinal).map(|t| (t.base, t.offset))
    }
    fn finish(&self, base: u64, skip: u64, offset: u64, len: usize, ordinal: u32) -> Result<()> {
        let t = Target {
            base,
            offset: 0,
            ordinal,
        };
        self.read_exact(t, skip, offset, len)
    }
}
