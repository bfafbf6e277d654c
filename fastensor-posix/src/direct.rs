//! `posix-direct`: `O_DIRECT` transfers split into chunks issued in parallel by a few threads.
//!
//! * A destination or source whose address meets the file's memory alignment is transferred
//!   with no copy; otherwise the aligned middle goes through page-aligned bounce buffers.
//! * Unaligned heads and tails of **reads** go through an aligned bounce block.
//! * Unaligned heads and tails of **writes** go through a second, buffered descriptor of the
//!   same file. A read-modify-write of the partial block would rewrite bytes outside the
//!   requested range, and two threads writing neighbouring ranges of one block could lose
//!   each other's bytes; the page cache merges such partial-block writes byte-exactly, and the
//!   kernel flushes and invalidates cached pages around every direct transfer of the range,
//!   so both descriptors stay coherent. The file ends exactly where the write ends.

use crate::sys;
use fastensor_core::align::{align_down, align_up, is_aligned, split, DirectAlignment};
use fastensor_core::knobs::Knob;
use fastensor_core::{
    knobs, parallel, unsupported_memory, Backend, BackendFile, Capabilities, Error, ErrorKind,
    HostBuffer, KnobSpec, Knobs, MemMut, MemRef, OpenMode, ReadRequest, Result, SharedBackend,
};
use fastensor_core::{readable_len, write_end};
use fastensor_sys::fork::ForkMutex;
use fastensor_sys::local::LocalFile;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The name of the `O_DIRECT` backend.
pub const POSIX_DIRECT: &str = "posix-direct";

/// Settings of the `O_DIRECT` backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectConfig {
    /// Bytes per request; rounded up to the file's alignment. Default 4 MiB.
    pub chunk_size: usize,
    /// Threads issuing requests of one transfer, the caller's included. Default 4.
    pub threads: usize,
    /// Allocate the blocks of a write that extends the file before writing them, so the
    /// chunks are overwrites that the file system can run in parallel. Default on.
    pub preallocate: bool,
}

impl Default for DirectConfig {
    fn default() -> Self {
        DirectConfig {
            chunk_size: 4 << 20,
            threads: 4,
            preallocate: true,
        }
    }
}

/// `O_DIRECT` backend with parallel chunks.
#[derive(Debug, Clone, Default)]
pub struct DirectBackend {
    config: DirectConfig,
    /// Bounce buffers shared by every file of the backend (and its clones).
    bounce: Arc<BouncePool>,
}

impl DirectBackend {
    /// A backend with these settings.
    pub fn new(config: DirectConfig) -> Self {
        DirectBackend {
            config,
            bounce: Arc::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &DirectConfig {
        &self.config
    }
}

/// The knobs of `posix-direct`.
const KNOBS: &[Knob<DirectConfig>] = &fastensor_core::knob_table![
    "threads", ["1", "2", "4", "8"], "threads issuing the chunks of one transfer", Count(threads);
    "chunk", ["1M", "4M", "16M"], "bytes per request", Size(chunk_size);
    "preallocate", ["true"], "allocate the blocks of an extending write first", Flag(preallocate);
];

impl Backend for DirectBackend {
    fn name(&self) -> &str {
        POSIX_DIRECT
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::direct(self.config.threads.max(1) as u32)
    }

    fn knobs(&self) -> Vec<KnobSpec> {
        knobs::specs(KNOBS, DirectConfig::default())
    }

    fn with_knobs(&self, knobs: &Knobs) -> Result<SharedBackend> {
        let config = knobs::apply(POSIX_DIRECT, KNOBS, &self.config, knobs)?;
        Ok(Arc::new(DirectBackend::new(config)))
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        let (direct, buffered, align) = sys::open_direct_pair(path, mode, POSIX_DIRECT)?;
        Ok(Box::new(DirectFile::new(
            direct,
            buffered,
            align,
            self.config.clone(),
            path.to_path_buf(),
            self.bounce.clone(),
        )))
    }
}

/// Page-aligned bounce buffers kept between transfers, and between files: fresh memory costs
/// its page faults (and the zeroing of its pages) on first use, which a file opened for a
/// short job (an offload swap file, one checkpoint shard) would otherwise pay every time.
/// It keeps at most [`BouncePool::KEEP`] buffers, each at most [`BouncePool::KEEP_BYTES`].
/// Its lock is a [`ForkMutex`]: a child made by `fork` keeps the buffers (plain memory, its
/// own copy) unless a thread of the parent held the lock at the fork, and then starts empty.
#[derive(Debug, Default)]
struct BouncePool {
    buffers: ForkMutex<Vec<HostBuffer>>,
}

impl BouncePool {
    /// The most buffers kept: one per thread of a transfer at the default settings, for two
    /// transfers at once.
    const KEEP: usize = 8;
    /// Larger buffers (a knob's large chunk, a large partial read) are freed after use.
    const KEEP_BYTES: usize = 16 << 20;

    /// A kept buffer of at least `len` bytes whose address is a multiple of `align`, if any.
    fn take(&self, len: usize, align: usize) -> Option<HostBuffer> {
        let mut pool = self.buffers.lock();
        let i = pool
            .iter()
            .position(|b| b.len() >= len && is_aligned(b.as_ptr() as u64, align as u64))?;
        Some(pool.swap_remove(i))
    }

    fn give(&self, buf: HostBuffer) {
        let mut pool = self.buffers.lock();
        if pool.len() < Self::KEEP && buf.len() <= Self::KEEP_BYTES {
            pool.push(buf);
        }
    }
}

/// An open file of the `posix-direct` backend.
#[derive(Debug)]
pub(crate) struct DirectFile {
    /// The `O_DIRECT` descriptor, its path and the file's known length.
    local: LocalFile,
    buffered: File,
    align: DirectAlignment,
    chunk: usize,
    threads: usize,
    preallocate: bool,
    bounce: Arc<BouncePool>,
}

impl DirectFile {
    fn new(
        direct: File,
        buffered: File,
        align: DirectAlignment,
        config: DirectConfig,
        path: PathBuf,
        bounce: Arc<BouncePool>,
    ) -> Self {
        // Split at (kernel) page boundaries at least, even where the device accepts 512-byte
        // direct I/O: a buffered head or tail and a direct write must never share a page, or
        // the kernel cannot invalidate the page around the direct write (EIO, stale data).
        let align = DirectAlignment {
            memory: align.memory,
            offset: align.offset.max(sys::page_size()),
        };
        let chunk = align_up(config.chunk_size.max(1) as u64, align.offset) as usize;
        DirectFile {
            local: LocalFile::new(POSIX_DIRECT, direct, path),
            buffered,
            align,
            chunk,
            threads: config.threads.max(1),
            preallocate: config.preallocate,
            bounce,
        }
    }

    fn eof(&self, offset: u64) -> Error {
        Error::new(ErrorKind::UnexpectedEof, "the file shrank during the read")
            .with_backend(POSIX_DIRECT)
            .with_path(self.local.path())
            .with_offset(offset)
    }

    fn buffer_alignment(&self) -> usize {
        self.align.memory.max(4096) as usize
    }

    /// Takes a bounce buffer of at least `len` bytes from the pool, or makes one.
    fn take_bounce(&self, len: usize) -> Result<HostBuffer> {
        let align = self.buffer_alignment();
        match self.bounce.take(len, align) {
            Some(buf) => Ok(buf),
            None => HostBuffer::with_alignment(len.max(self.chunk), align),
        }
    }

    fn give_bounce(&self, buf: HostBuffer) {
        self.bounce.give(buf);
    }

    /// Reads the bytes `[offset, offset + dst.len())`, all inside one aligned block, through a
    /// bounce block.
    fn read_partial_block(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let block = self.align.offset;
        let start = align_down(offset, block);
        let span = (align_up(offset + dst.len() as u64, block) - start) as usize;
        let mut bounce = self.take_bounce(span)?;
        let n = sys::pread_full(self.local.file(), &mut bounce[..span], start)
            .map_err(|e| self.local.err(e, "direct read failed", start))?;
        let skip = (offset - start) as usize;
        let result = if n < skip + dst.len() {
            Err(self.eof(offset))
        } else {
            dst.copy_from_slice(&bounce[skip..skip + dst.len()]);
            Ok(())
        };
        self.give_bounce(bounce);
        result
    }

    /// Reads whole aligned blocks at `offset` (aligned) into `dst`, in parallel chunks.
    fn read_middle(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let zero_copy = is_aligned(dst.as_ptr() as u64, self.align.memory);
        let pieces = at_offsets(offset, self.chunk, dst.chunks_mut(self.chunk));
        parallel::for_each(pieces, self.threads, |(off, piece)| {
            if zero_copy {
                let n = sys::pread_full(self.local.file(), piece, off)
                    .map_err(|e| self.local.err(e, "direct read failed", off))?;
                if n < piece.len() {
                    return Err(self.eof(off + n as u64));
                }
                return Ok(());
            }
            let mut bounce = self.take_bounce(piece.len())?;
            let res = sys::pread_full(self.local.file(), &mut bounce[..piece.len()], off)
                .map_err(|e| self.local.err(e, "direct read failed", off))
                .and_then(|n| {
                    if n < piece.len() {
                        Err(self.eof(off + n as u64))
                    } else {
                        piece.copy_from_slice(&bounce[..piece.len()]);
                        Ok(())
                    }
                });
            self.give_bounce(bounce);
            res
        })
    }

    /// Writes whole aligned blocks from `src` at `offset` (aligned), in parallel chunks.
    fn write_middle(&self, offset: u64, src: &[u8]) -> Result<()> {
        let zero_copy = is_aligned(src.as_ptr() as u64, self.align.memory);
        let pieces = at_offsets(offset, self.chunk, src.chunks(self.chunk));
        parallel::for_each(pieces, self.threads, |(off, piece)| {
            if zero_copy {
                return sys::pwrite_all(self.local.file(), piece, off)
                    .map_err(|e| self.local.err(e, "direct write failed", off));
            }
            let mut bounce = self.take_bounce(piece.len())?;
            bounce[..piece.len()].copy_from_slice(piece);
            let res = sys::pwrite_all(self.local.file(), &bounce[..piece.len()], off)
                .map_err(|e| self.local.err(e, "direct write failed", off));
            self.give_bounce(bounce);
            res
        })
    }

    /// Allocates `[offset, end)` when it lies past the current end of the file, so parallel
    /// direct writes there are overwrites rather than appends.
    fn preallocate(&self, offset: u64, end: u64) -> Result<()> {
        if !self.preallocate || end - offset < 2 * self.chunk as u64 {
            return Ok(());
        }
        sys::allocate_past_end(
            self.local.file(),
            offset,
            end,
            POSIX_DIRECT,
            self.local.path(),
        )
    }

    /// Fills `dst` from `offset`; the range must lie inside the file (clamped by the caller).
    fn read_within(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let s = split(offset, dst.len() as u64, self.align.offset);
        let [head, middle, tail] = s.cut_mut(dst);
        if !head.is_empty() {
            self.read_partial_block(s.head.start, head)?;
        }
        if !middle.is_empty() {
            self.read_middle(s.middle.start, middle)?;
        }
        if !tail.is_empty() {
            self.read_partial_block(s.tail.start, tail)?;
        }
        Ok(())
    }
}

/// The consecutive `chunk`-byte pieces of a transfer at `offset`, each with its file offset.
fn at_offsets<P>(offset: u64, chunk: usize, pieces: impl Iterator<Item = P>) -> Vec<(u64, P)> {
    pieces
        .enumerate()
        .map(|(i, p)| (offset + (i * chunk) as u64, p))
        .collect()
}

impl BackendFile for DirectFile {
    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let buf = dst.host_for(POSIX_DIRECT, self.local.path())?;
        self.local.read_clamped(offset, buf.len(), |len| {
            self.read_within(offset, &mut buf[..len])
        })
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        // As the default (one request after another), but with at most one `fstat` for the
        // batch, none when it lies within the known length.
        let mut end = 0u64;
        for req in requests.iter() {
            if !matches!(req.dst, MemMut::Host(_)) {
                return Err(unsupported_memory(
                    POSIX_DIRECT,
                    req.dst.kind(),
                    self.local.path(),
                ));
            }
            if !req.dst.is_empty() {
                end = end.max(req.offset.saturating_add(req.dst.len() as u64));
            }
        }
        self.local.read_with(end, |file_len| {
            for req in requests.iter_mut() {
                let MemMut::Host(buf) = &mut req.dst else {
                    unreachable!("checked above")
                };
                let len = readable_len(req.offset, buf.len(), file_len);
                self.read_within(req.offset, &mut buf[..len])?;
                req.done = len;
            }
            Ok(())
        })
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let buf = src.host_for(POSIX_DIRECT, self.local.path())?;
        let end = write_end(offset, buf.len(), POSIX_DIRECT, self.local.path())?;
        if buf.is_empty() {
            return Ok(());
        }
        let s = split(offset, buf.len() as u64, self.align.offset);
        let [head, middle, tail] = s.cut(buf);
        if !middle.is_empty() {
            self.preallocate(s.middle.start, s.middle.end)?;
            self.write_middle(s.middle.start, middle)?;
        }
        if !head.is_empty() {
            sys::pwrite_all(&self.buffered, head, s.head.start)
                .map_err(|e| self.local.err(e, "write failed", s.head.start))?;
        }
        if !tail.is_empty() {
            sys::pwrite_all(&self.buffered, tail, s.tail.start)
                .map_err(|e| self.local.err(e, "write failed", s.tail.start))?;
        }
        self.local.wrote(end);
        Ok(())
    }

    // `sync` is the direct descriptor's fdatasync: both descriptors share one inode, so it
    // writes back the buffered heads and tails and the file size, and flushes the device
    // cache for the direct writes.
    fastensor_sys::local_file_methods!(local);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_opened_later_reuses_the_bounce_buffers_of_one_closed_before() {
        let dir = tempfile::tempdir().unwrap();
        let backend = DirectBackend::new(DirectConfig {
            chunk_size: 1 << 20,
            threads: 1,
            preallocate: false,
        });
        // One byte past a page: the source is unaligned, so the write bounces.
        let data: Vec<u8> = (0..(2 << 20) + 1).map(|i| (i % 251) as u8).collect();
        let src = &data[1..];
        let mut kept = Vec::new();
        for name in ["a", "b"] {
            let path = dir.path().join(name);
            let file = backend.open(&path, OpenMode::Truncate).unwrap();
            file.write_at(0, MemRef::Host(src)).unwrap();
            let mut back = vec![0u8; src.len()];
            assert_eq!(file.read_at(0, MemMut::Host(&mut back)).unwrap(), src.len());
            assert_eq!(back, src);
            drop(file);
            let pool = backend.bounce.buffers.lock();
            kept.push(pool.iter().map(|b| b.as_ptr() as usize).collect::<Vec<_>>());
        }
        assert!(
            !kept[0].is_empty(),
            "the first file's writes went through bounce buffers"
        );
        assert_eq!(kept[0], kept[1], "the second file made new bounce buffers");
    }
}
