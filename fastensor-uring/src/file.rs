//! An open file of the `uring` backend: turns reads and writes (single or batched) into ring
//! ops and runs them on a ring of the file's pool.
//!
//! * Reads: whole aligned blocks go straight into the caller's memory when its address meets
//!   the file's memory alignment (zero copy); otherwise, and for the partial blocks at either
//!   end, an aligned span of the ring's staging area (a registered buffer) is read and the
//!   wanted bytes copied out. Reads stop at the end of the file (as every backend does).
//! * Writes: whole aligned blocks are written from the caller's memory or, when unaligned,
//!   from a staging span. Partial blocks at either end go through a second, **buffered**
//!   descriptor of the same file, as `posix-direct` does: a read-modify-write of the block
//!   would rewrite bytes outside the requested range (and race with neighbouring writes),
//!   while the page cache merges partial writes byte-exactly and the kernel keeps both
//!   descriptors coherent around direct transfers. The file ends exactly where the write ends.

use crate::config::UringConfig;
use crate::engine::{self, Buf, Ctx, Op, Target};
use crate::ring::RingPool;
use crate::URING;
use fastensor_core::align::{align_down, align_up, is_aligned, split, DirectAlignment};
use fastensor_core::{readable_len, write_end};
use fastensor_core::{
    unsupported_memory, BackendFile, Error, ErrorKind, MemMut, MemRef, ReadRequest, Result,
    WriteRequest,
};
use fastensor_sys as sys;
use fastensor_sys::local::LocalFile;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// An open file of the `uring` backend.
#[derive(Debug)]
pub(crate) struct UringFile {
    // Dropped first: the rings hold registrations of the descriptors below.
    rings: RingPool,
    /// The `O_DIRECT` descriptor, its path and the file's known length.
    local: LocalFile,
    _buffered: File,
    align: DirectAlignment,
    /// Offset alignment used for splitting (the file's, at least a page).
    block: u64,
    chunk: usize,
    queue_depth: usize,
    preallocate: bool,
}

impl UringFile {
    /// Wraps the two descriptors of `path` and sets up the first ring, so that a refused
    /// io_uring shows at open time.
    pub(crate) fn new(
        direct: File,
        buffered: File,
        align: DirectAlignment,
        config: &UringConfig,
        path: PathBuf,
    ) -> Result<Self> {
        // Split at page granularity at least: a direct write must never share a page with a
        // buffered partial-block write running at the same time, or the kernel fails to
        // invalidate the page around the direct write and reports EIO on the next fsync.
        let page = sys::page_size();
        let block = align.offset.max(page);
        let unit = align.memory.max(block);
        let rings = RingPool::new(
            config.clone(),
            [direct.as_raw_fd(), buffered.as_raw_fd()],
            unit,
        );
        let file = UringFile {
            rings,
            local: LocalFile::new(URING, direct, path),
            _buffered: buffered,
            align,
            block,
            chunk: config.effective_chunk(unit),
            queue_depth: config.effective_queue_depth() as usize,
            preallocate: config.preallocate,
        };
        drop(file.lease()?);
        Ok(file)
    }

    fn lease(&self) -> Result<crate::ring::RingLease<'_>> {
        self.rings.take().map_err(|e| {
            let reason = crate::probe::setup_failure_reason(&e, None);
            Error::new(ErrorKind::Unavailable, reason)
                .with_source(e)
                .with_backend(URING)
                .with_path(self.local.path())
        })
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            path: self.local.path(),
            block: self.block,
            queue_depth: self.queue_depth,
        }
    }

    /// Adds the ops reading `len` bytes (already clipped to the file) at `offset` into `dst`.
    fn plan_read(&self, offset: u64, dst: *mut u8, len: usize, ops: &mut Vec<Op>) {
        if len == 0 {
            return;
        }
        let block = self.block;
        let s = split(offset, len as u64, block);
        let [head, middle, tail] = s.lens();
        let mid_ptr = dst.wrapping_add(head);
        let zero_copy = is_aligned(mid_ptr as u64, self.align.memory);
        let span_start = align_down(offset, block);
        let span = (align_up(offset + len as u64, block) - span_start) as usize;
        if !(zero_copy && head == 0 && tail == 0) && span <= self.chunk {
            // Small and not zero-copy: one staged read of the covering blocks.
            let skip = (offset - span_start) as usize;
            let buf = Buf::StagedRead {
                dst,
                skip,
                copy_len: len,
            };
            ops.push(Op::read(span_start, span, buf, skip + len));
            return;
        }
        if head > 0 {
            let start = align_down(s.head.start, block);
            let skip = (s.head.start - start) as usize;
            let buf = Buf::StagedRead {
                dst,
                skip,
                copy_len: head,
            };
            ops.push(Op::read(start, block as usize, buf, skip + head));
        }
        let mut done = 0;
        while done < middle {
            let n = self.chunk.min(middle - done);
            let p = mid_ptr.wrapping_add(done);
            let buf = if zero_copy {
                Buf::Caller(p)
            } else {
                Buf::StagedRead {
                    dst: p,
                    skip: 0,
                    copy_len: n,
                }
            };
            ops.push(Op::read(s.middle.start + done as u64, n, buf, n));
            done += n;
        }
        if tail > 0 {
            let p = mid_ptr.wrapping_add(middle);
            let buf = Buf::StagedRead {
                dst: p,
                skip: 0,
                copy_len: tail,
            };
            ops.push(Op::read(s.tail.start, block as usize, buf, tail));
        }
    }

    /// Adds the ops writing `src` at `offset`, after allocating the extension of the file when
    /// that lets the chunks run as parallel overwrites.
    fn plan_write(&self, offset: u64, src: &[u8], ops: &mut Vec<Op>) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        write_end(offset, src.len(), URING, self.local.path())?;
        let s = split(offset, src.len() as u64, self.block);
        let [head, middle, tail] = s.lens();
        let base = src.as_ptr();
        if head > 0 {
            let buf = Buf::Caller(base.cast_mut());
            ops.push(Op::write(Target::Buffered, s.head.start, head, buf));
        }
        if middle > 0 {
            self.preallocate(s.middle.start, s.middle.end)?;
            let mid_ptr = base.wrapping_add(head);
            let zero_copy = is_aligned(mid_ptr as u64, self.align.memory);
            let mut done = 0;
            while done < middle {
                let n = self.chunk.min(middle - done);
                let p = mid_ptr.wrapping_add(done);
                let buf = if zero_copy {
                    Buf::Caller(p.cast_mut())
                } else {
                    Buf::StagedWrite { src: p }
                };
                ops.push(Op::write(
                    Target::Direct,
                    s.middle.start + done as u64,
                    n,
                    buf,
                ));
                done += n;
            }
        }
        if tail > 0 {
            let buf = Buf::Caller(base.wrapping_add(head + middle).cast_mut());
            ops.push(Op::write(Target::Buffered, s.tail.start, tail, buf));
        }
        Ok(())
    }

    /// Allocates `[offset, end)` where it lies past the current end of the file.
    fn preallocate(&self, offset: u64, end: u64) -> Result<()> {
        if !self.preallocate || end - offset < 2 * self.chunk as u64 {
            return Ok(());
        }
        sys::allocate_past_end(self.local.file(), offset, end, URING, self.local.path())
    }

    /// Runs `ops` on a ring of the pool.
    ///
    /// # Safety
    /// As [`engine::run`]: every op's memory stays valid, and unaliased where written, for
    /// the whole call.
    unsafe fn run(&self, ops: &mut [Op]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut ring = self.lease()?;
        // SAFETY: forwarded from this function's contract.
        unsafe { engine::run(&mut ring, ops, self.ctx()) }
    }
}

impl BackendFile for UringFile {
    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let buf = dst.host_for(URING, self.local.path())?;
        let dst = buf.as_mut_ptr();
        self.local.read_clamped(offset, buf.len(), |len| {
            let mut ops = Vec::new();
            self.plan_read(offset, dst, len, &mut ops);
            // SAFETY: the ops point into `buf` (exclusively borrowed for this call, `len
            // <= buf.len()`), and `run` reaps every op before returning.
            unsafe { self.run(&mut ops) }
        })
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let buf = src.host_for(URING, self.local.path())?;
        let mut ops = Vec::new();
        self.plan_write(offset, buf, &mut ops)?;
        // SAFETY: the ops only read `buf`, borrowed for this call, and `run` reaps every op
        // before returning.
        unsafe { self.run(&mut ops)? };
        if !buf.is_empty() {
            self.local.wrote(offset + buf.len() as u64);
        }
        Ok(())
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        if let Some(r) = requests.iter().find(|r| !matches!(r.dst, MemMut::Host(_))) {
            return Err(unsupported_memory(URING, r.dst.kind(), self.local.path()));
        }
        let end = requests
            .iter()
            .filter(|r| !r.dst.is_empty())
            .map(|r| r.offset.saturating_add(r.dst.len() as u64))
            .max()
            .unwrap_or(0);
        self.local.read_with(end, |file_len| {
            let mut ops = Vec::with_capacity(requests.len());
            for req in requests.iter_mut() {
                let MemMut::Host(buf) = &mut req.dst else {
                    unreachable!("checked above")
                };
                let len = readable_len(req.offset, buf.len(), file_len);
                self.plan_read(req.offset, buf.as_mut_ptr(), len, &mut ops);
                req.done = len;
            }
            // SAFETY: the ops point into the requests' destinations, disjoint `&mut`
            // slices borrowed for this call, and `run` reaps every op before returning.
            let res = unsafe { self.run(&mut ops) };
            if res.is_err() {
                for req in requests.iter_mut() {
                    req.done = 0;
                }
            }
            res
        })
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        let mut ops = Vec::with_capacity(requests.len());
        for req in requests {
            let buf = req.src.host_for(URING, self.local.path())?;
            self.plan_write(req.offset, buf, &mut ops)?;
        }
        // SAFETY: the ops only read the requests' sources, borrowed for this call, and `run`
        // reaps every op before returning.
        unsafe { self.run(&mut ops)? };
        for req in requests.iter().filter(|r| !r.src.is_empty()) {
            self.local.wrote(req.offset + req.src.len() as u64);
        }
        Ok(())
    }

    // `sync` is the direct descriptor's fdatasync: both descriptors share one inode, so it
    // writes back the buffered partial blocks and the size, and flushes the device cache
    // for the direct writes.
    fastensor_sys::local_file_methods!(local);
}
