//! `cuda-staged`: file <-> GPU through pinned host bounce buffers.
//!
//! Reads take the best host path (`O_DIRECT` into page-locked buffers from `cuMemHostAlloc`,
//! or the page cache where the file system refuses direct I/O) and copy each buffer to the
//! GPU with `cuMemcpyHtoDAsync` on a stream. Each worker thread ("lane") keeps two or more
//! buffers in flight, so the disk fills one while PCIe drains another; several lanes read
//! different chunks at once. Writes run the reverse pipeline (`cuMemcpyDtoHAsync` of the
//! next chunk while the previous one is written with `O_DIRECT`). Unaligned heads and tails
//! of writes go through a buffered descriptor, as in `posix-direct`: bytes outside the range
//! are never rewritten.
//!
//! Host memory is refused (`host_memory: false`): for host buffers this backend would be
//! `posix-direct` under another name, and the selector should compare distinct paths.

use crate::cuda::{self, device_error, Event, PinnedBuffer, Stream};
use crate::device_buffer;
use cudarc::driver::result;
use fastensor_core::align::{align_down, align_up, split};
use fastensor_core::{
    parallel, Availability, Backend, BackendFile, Capabilities, DeviceSliceMut, Error, ErrorKind,
    MemMut, MemRef, OpenMode, Result,
};
use fastensor_sys as sys;
use fastensor_sys::local::LocalFile;
use parking_lot::Mutex;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// The name of the host-staged CUDA backend.
pub const CUDA_STAGED: &str = "cuda-staged";

/// Settings of the `cuda-staged` backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedConfig {
    /// Bytes per pinned bounce buffer (one disk request, one copy). Default 8 MiB.
    pub buffer_size: usize,
    /// Bounce buffers in flight per lane, at least 2. Default 2.
    pub buffers: usize,
    /// Lanes (threads) per transfer, each with its own stream and buffers. Default 2.
    pub threads: usize,
    /// Read and write the file with `O_DIRECT` where the file system allows. Default on.
    pub direct: bool,
}

impl Default for StagedConfig {
    fn default() -> Self {
        StagedConfig {
            buffer_size: 8 << 20,
            buffers: 2,
            threads: 2,
            direct: true,
        }
    }
}

/// Host-staged CUDA backend. Clones share their pool of pinned buffers.
#[derive(Debug, Clone, Default)]
pub struct StagedBackend {
    config: StagedConfig,
    lanes: Arc<Mutex<Vec<Lane>>>,
}

impl StagedBackend {
    /// A backend with these settings.
    pub fn new(config: StagedConfig) -> Self {
        StagedBackend {
            config,
            lanes: Arc::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &StagedConfig {
        &self.config
    }
}

impl Backend for StagedBackend {
    fn name(&self) -> &str {
        CUDA_STAGED
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            offset_alignment: 4096,
            queue_depth: (self.config.threads.max(1) * self.config.buffers.max(2)) as u32,
            bypasses_page_cache: self.config.direct,
            ..Capabilities::local()
        }
        .on_device()
    }

    fn detail(&self) -> Option<String> {
        cuda::driver().ok().map(|_| crate::gpus())
    }

    fn probe(&self) -> Availability {
        match cuda::driver() {
            Ok(_) => Availability::Available,
            Err(reason) => Availability::Unavailable { reason },
        }
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        cuda::driver().map_err(|reason| {
            Error::new(ErrorKind::Unavailable, reason)
                .with_backend(CUDA_STAGED)
                .with_path(path)
        })?;
        let direct = match self.config.direct {
            true => match sys::open_direct_pair(path, mode, CUDA_STAGED) {
                Ok(pair) => Some(pair),
                Err(e) if e.kind() == ErrorKind::Unsupported => None,
                Err(e) => return Err(e),
            },
            false => None,
        };
        let (file, buffered, align) = match direct {
            Some((direct, buffered, align)) => (direct, buffered, align.offset.max(4096)),
            None => {
                let f = sys::open_file(path, mode, false, CUDA_STAGED)?;
                let b = f
                    .try_clone()
                    .map_err(|e| Error::io(e, "cannot duplicate the descriptor").with_path(path))?;
                (f, b, 1)
            }
        };
        let chunk = align_up(self.config.buffer_size.max(1) as u64, align.max(4096)) as usize;
        Ok(Box::new(StagedFile {
            local: LocalFile::new(CUDA_STAGED, file, path.to_path_buf()),
            buffered,
            align,
            chunk,
            buffers: self.config.buffers.max(2),
            threads: self.config.threads.max(1),
            lanes: self.lanes.clone(),
            writable: mode.writable(),
        }))
    }
}

/// One worker's stream, bounce buffers and their completion events, on one GPU.
#[derive(Debug)]
struct Lane {
    ordinal: u32,
    stream: Stream,
    events: Vec<Event>,
    bufs: Vec<PinnedBuffer>,
}

impl Lane {
    fn new(ordinal: u32, chunk: usize, buffers: usize) -> Result<Self> {
        cuda::require()?.bind(ordinal)?;
        Ok(Lane {
            ordinal,
            stream: Stream::new()?,
            events: (0..buffers).map(|_| Event::new()).collect::<Result<_>>()?,
            bufs: (0..buffers)
                .map(|_| PinnedBuffer::new(chunk))
                .collect::<Result<_>>()?,
        })
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // The stream and events belong to this GPU's context.
        if let Ok(d) = cuda::driver() {
            let _ = d.bind(self.ordinal);
        }
    }
}

/// An open file of the `cuda-staged` backend.
#[derive(Debug)]
struct StagedFile {
    /// The descriptor transfers go through (`O_DIRECT` where configured and possible), its
    /// path and the file's known length.
    local: LocalFile,
    buffered: File,
    align: u64,
    chunk: usize,
    buffers: usize,
    threads: usize,
    lanes: Arc<Mutex<Vec<Lane>>>,
    writable: bool,
}

impl StagedFile {
    fn take_lane(&self, ordinal: u32) -> Result<Lane> {
        {
            let mut pool = self.lanes.lock();
            if let Some(i) = pool.iter().position(|l| {
                l.ordinal == ordinal
                    && l.bufs.len() == self.buffers
                    && l.bufs[0].len() >= self.chunk
            }) {
                return Ok(pool.swap_remove(i));
            }
        }
        Lane::new(ordinal, self.chunk, self.buffers)
    }

    fn give_lane(&self, lane: Lane) {
        let mut pool = self.lanes.lock();
        if pool.len() < 2 * self.threads {
            pool.push(lane);
        }
    }

    /// Runs `work` on each lane's share of `chunks` (chunk `i` goes to lane `i % lanes`),
    /// always draining the lane's stream before its buffers go back to the pool. Errors name
    /// this backend and file.
    fn run_lanes(
        &self,
        ordinal: u32,
        chunks: Vec<(u64, usize)>,
        work: impl Fn(&mut Lane, &[(u64, usize)]) -> Result<()> + Sync,
    ) -> Result<()> {
        let lanes = self.threads.min(chunks.len()).max(1);
        let shares: Vec<Vec<(u64, usize)>> = (0..lanes)
            .map(|w| chunks.iter().skip(w).step_by(lanes).copied().collect())
            .collect();
        parallel::for_each(shares, lanes, |share| {
            cuda::require()?.bind(ordinal)?;
            let mut lane = self.take_lane(ordinal)?;
            let res = work(&mut lane, &share);
            let drained = lane.stream.synchronize();
            if drained.is_ok() {
                self.give_lane(lane);
            }
            res.and(drained)
        })
        .map_err(|e| self.local.about(e))
    }

    /// Fills the first `len` bytes of `d` (within the file) from `offset`: the aligned blocks
    /// around the range are read into the lanes' pinned buffers and only the requested bytes
    /// copied to the device.
    fn read_range(&self, offset: u64, d: &DeviceSliceMut<'_>, len: usize) -> Result<()> {
        let end = offset + len as u64;
        // Read the aligned blocks around the range; copy only the requested bytes.
        let chunks = crate::chunk_ranges(
            align_down(offset, self.align),
            align_up(end, self.align),
            self.chunk,
        );
        let dst_ptr = d.ptr();
        self.run_lanes(d.ordinal(), chunks, |lane, share| {
            for (j, &(at, n)) in share.iter().enumerate() {
                let k = j % lane.bufs.len();
                lane.events[k].synchronize()?; // the copy that last used this buffer is done
                let got = sys::pread_full(self.local.file(), &mut lane.bufs[k][..n], at)
                    .map_err(|e| self.local.err(e, "read failed", at))?;
                let (lo, hi) = (at.max(offset), (at + n as u64).min(end));
                if at + (got as u64) < hi {
                    return Err(Error::new(
                        ErrorKind::UnexpectedEof,
                        "the file shrank during the read",
                    )
                    .with_backend(CUDA_STAGED)
                    .with_path(self.local.path())
                    .with_offset(at + got as u64));
                }
                let piece = &lane.bufs[k][(lo - at) as usize..(hi - at) as usize];
                // SAFETY: the destination range lies in `d` (`len` is within it), whose caller
                // holds it exclusively for the whole transfer; the pinned source stays alive and
                // untouched until the event below completes (run_lanes drains the stream
                // before returning).
                unsafe {
                    result::memcpy_htod_async(dst_ptr + (lo - offset), piece, lane.stream.raw())
                }
                .map_err(|e| device_error("cuMemcpyHtoDAsync failed", e).with_offset(at))?;
                lane.events[k].record(&lane.stream)?;
            }
            Ok(())
        })
    }
}

impl BackendFile for StagedFile {
    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let d = dst.device_for(CUDA_STAGED, self.local.path())?;
        self.local
            .read_clamped(offset, d.len(), |len| self.read_range(offset, &d, len))
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let Some((d, end)) =
            crate::device_write(CUDA_STAGED, self.local.path(), self.writable, offset, src)?
        else {
            return Ok(());
        };
        let s = split(offset, d.len() as u64, self.align);
        let src_ptr = d.ptr();
        if !s.middle.is_empty() {
            let chunks = crate::chunk_ranges(s.middle.start, s.middle.end, self.chunk);
            self.run_lanes(d.ordinal(), chunks, |lane, share| {
                let nb = lane.bufs.len();
                let issue = |lane: &mut Lane, j: usize| -> Result<()> {
                    let (at, n) = share[j];
                    let k = j % nb;
                    // SAFETY: the source range lies in `d`, borrowed for the whole transfer;
                    // the pinned buffer is not read until its event completes.
                    unsafe {
                        result::memcpy_dtoh_async(
                            &mut lane.bufs[k][..n],
                            src_ptr + (at - offset),
                            lane.stream.raw(),
                        )
                    }
                    .map_err(|e| device_error("cuMemcpyDtoHAsync failed", e).with_offset(at))?;
                    lane.events[k].record(&lane.stream)
                };
                for j in 0..share.len().min(nb - 1) {
                    issue(lane, j)?;
                }
                for (j, &(at, n)) in share.iter().enumerate() {
                    if j + nb - 1 < share.len() {
                        issue(lane, j + nb - 1)?; // its buffer's previous write is done
                    }
                    let k = j % nb;
                    lane.events[k].synchronize()?;
                    sys::pwrite_all(self.local.file(), &lane.bufs[k][..n], at)
                        .map_err(|e| self.local.err(e, "write failed", at))?;
                }
                Ok(())
            })?;
        }
        for part in [s.head, s.tail] {
            if part.is_empty() {
                continue;
            }
            let mut host = vec![0u8; (part.end - part.start) as usize];
            device_buffer::copy_to_host(src_ptr + (part.start - offset), d.ordinal(), &mut host)
                .map_err(|e| self.local.about(e.with_offset(part.start)))?;
            sys::pwrite_all(&self.buffered, &host, part.start)
                .map_err(|e| self.local.err(e, "write failed", part.start))?;
        }
        self.local.wrote(end);
        Ok(())
    }

    fastensor_sys::local_file_methods!(local);
}
