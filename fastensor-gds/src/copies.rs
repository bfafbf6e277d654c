//! Stream-ordered copies between GPU memory and pinned host memory, for offload: a copy out
//! of device memory starts after the work of the stream that produced it (an event that
//! stream recorded, waited for by a copy stream of ours), a copy into device memory runs on
//! the caller's stream, and each reports its end by an event. The host never synchronizes a
//! device for them; it may wait for one copy's event (an I/O thread before it writes what
//! came out).
//!
//! Pinned memory comes from a [`PinnedPool`] that reuses its blocks copy after copy, within a
//! budget of its own; a block used by a copy into device memory goes back to the pool only
//! once that copy's event has passed.
//!
//! Who owns what: device memory to copy out is lent as a [`DeviceBytes`] value, held (and
//! so kept allocated by its owner) until the copy's event has passed, then dropped; pinned
//! blocks belong to the pool and are lent to one copy or one holder at a time.
//!
//! The values that cross to the offload store ([`DeviceSource`], [`DeviceDest`],
//! [`StreamRef`], [`PinnedStats`], the [`DeviceBytes`] contract) are
//! [`fastensor_core::device_copies`]'s, re-exported here; [`CudaRuntime`] and
//! [`CopyEngine`] implement that module's traits for CUDA ([`CudaRuntime::shared`] is what
//! `OffloadConfig::device_runtime` takes).

use crate::cuda::{self, device_error, Event, PinnedBuffer, Stream};
use crate::DeviceBuffer;
use cudarc::driver::{result, sys};
use fastensor_core::device_copies::{
    DeviceCopies, DeviceEvent, DeviceMemory, DeviceRuntime, OutgoingCopy, PinnedBytes,
};
use fastensor_core::{DeviceSlice, DeviceSliceMut, Error, ErrorKind, Result};
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

pub use fastensor_core::device_copies::{
    DeviceBytes, DeviceDest, DeviceSource, PinnedStats, StreamRef,
};

/// Driver entry points this module needs beyond those every backend needs.
const SYMBOLS: [&str; 2] = ["cuStreamWaitEvent", "cuEventQuery"];

/// Makes `stream`'s GPU context current and blocks the calling thread until the work queued
/// on the stream has passed.
pub fn synchronize(stream: StreamRef) -> Result<()> {
    cuda::require()?.bind(stream.ordinal())?;
    // SAFETY: the stream is alive (the contract of `StreamRef::from_raw`).
    unsafe { result::stream::synchronize(raw_stream(stream)) }
        .map_err(|e| device_error("cuStreamSynchronize failed", e))
}

/// The CUDA handle of `stream`.
fn raw_stream(stream: StreamRef) -> sys::CUstream {
    stream.handle() as sys::CUstream
}

/// The end of some queued device work (an event recorded after it).
#[derive(Debug)]
pub struct Done {
    event: Event,
}

impl Done {
    /// Marks the current end of `stream`'s queue (an event recorded there).
    pub fn record(stream: StreamRef) -> Result<Done> {
        cuda::require()?.bind(stream.ordinal())?;
        Done::at(raw_stream(stream))
    }

    /// Records an event at the current end of `stream`'s queue.
    fn at(stream: sys::CUstream) -> Result<Done> {
        let event = Event::new()?;
        // SAFETY: the event was just made in the current context and `stream` is a live
        // stream of that context (the callers' contracts).
        unsafe { result::event::record(event.raw(), stream) }
            .map_err(|e| device_error("cuEventRecord failed", e))?;
        Ok(Done { event })
    }

    /// Whether the work has passed (`cuEventQuery`); a failure of that work is an error.
    pub fn is_done(&self) -> Result<bool> {
        // SAFETY: the event is alive (owned here).
        match unsafe { result::event::query(self.event.raw()) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(device_error("cuEventQuery failed", e)),
        }
    }

    /// Blocks the calling thread until the work has passed; its failure is an error.
    pub fn wait(&self) -> Result<()> {
        cuda::require()?;
        self.event.synchronize()
    }

    /// Makes later work on `stream` wait for this work (`cuStreamWaitEvent`).
    fn order(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: event and stream are alive and of the current context.
        unsafe {
            result::stream::wait_event(
                stream,
                self.event.raw(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| device_error("cuStreamWaitEvent failed", e))
    }
}

#[derive(Default)]
struct PoolState {
    /// Idle blocks by (length, order returned).
    idle: BTreeMap<(usize, u64), PinnedBuffer>,
    /// Memory lent to copies into device memory (pinned blocks, device buffers), with the
    /// end of their copy.
    in_flight: VecDeque<(Box<dyn Send>, Done)>,
    next_seq: u64,
    stats: PinnedStats,
}

impl std::fmt::Debug for PoolState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolState")
            .field("stats", &self.stats)
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct PoolShared {
    ordinal: u32,
    state: Mutex<PoolState>,
    returned: Condvar,
}

impl PoolShared {
    /// Makes the pool's GPU context current on this thread, for `cuMemFreeHost`.
    fn bind(&self) {
        if let Ok(driver) = cuda::driver() {
            let _ = driver.bind(self.ordinal);
        }
    }
}

impl Drop for PoolShared {
    fn drop(&mut self) {
        if !self.state.get_mut().idle.is_empty() {
            self.bind();
            self.state.get_mut().idle.clear();
        }
    }
}

/// Pinned host blocks of one GPU's context, reused within a budget. Clones share the pool.
#[derive(Debug, Clone)]
pub struct PinnedPool {
    shared: Arc<PoolShared>,
}

/// A block of a [`PinnedPool`] (its first [`PinnedBlock::len`] bytes in use); back to the
/// pool when dropped.
#[derive(Debug)]
pub struct PinnedBlock {
    buf: Option<PinnedBuffer>,
    len: usize,
    pool: Arc<PoolShared>,
}

impl PinnedBlock {
    /// Bytes in use.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a block of no bytes in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the block can hold (its length rounded up to whole pages at least).
    pub fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    /// Sets the bytes in use (at most [`PinnedBlock::capacity`]).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// The whole block's bytes (at least [`PinnedBlock::len`]).
    fn whole(&mut self) -> &mut PinnedBuffer {
        self.buf
            .as_mut()
            .expect("a block holds its buffer until dropped")
    }
}

impl std::ops::Deref for PinnedBlock {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.as_ref().expect("held until dropped")[..self.len]
    }
}

impl std::ops::DerefMut for PinnedBlock {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.whole()[..len]
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let mut st = self.pool.state.lock();
            let seq = st.next_seq;
            st.next_seq += 1;
            st.stats.lent -= 1;
            st.idle.insert((buf.len(), seq), buf);
            drop(st);
            self.pool.returned.notify_all();
        }
    }
}

/// Page size blocks are rounded to.
const PAGE: usize = 4096;

impl PinnedPool {
    /// An empty pool of GPU `ordinal`'s context holding at most `budget` bytes.
    pub fn new(ordinal: u32, budget: u64) -> PinnedPool {
        PinnedPool {
            shared: Arc::new(PoolShared {
                ordinal,
                state: Mutex::new(PoolState {
                    stats: PinnedStats {
                        budget,
                        ..Default::default()
                    },
                    ..Default::default()
                }),
                returned: Condvar::new(),
            }),
        }
    }

    /// A block of at least `len` bytes (its first `len` in use; stale contents): an idle
    /// one up to an eighth larger, else a new one within the budget (idle blocks of other
    /// sizes are freed to make room). With no room, waits for blocks lent to copies into
    /// device memory to come back, then for any block to come back (`wait` at most; then
    /// an [`ErrorKind::OutOfMemory`] error). A block larger than the budget is refused.
    pub fn take(&self, len: usize, wait: Duration) -> Result<PinnedBlock> {
        let want = len.max(1).div_ceil(PAGE) * PAGE;
        let s = &self.shared;
        let mut st = s.state.lock();
        if want as u64 > st.stats.budget {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{len} bytes exceed the pinned memory budget ({} bytes)",
                    st.stats.budget
                ),
            ));
        }
        let deadline = std::time::Instant::now() + wait;
        loop {
            reap(&mut st, false)?;
            let most = want + want / 8;
            let fit = st
                .idle
                .range((want, 0)..=(most, u64::MAX))
                .next()
                .map(|(&k, _)| k);
            if let Some(key) = fit {
                let buf = st.idle.remove(&key).expect("found above");
                st.stats.lent += 1;
                return Ok(PinnedBlock {
                    buf: Some(buf),
                    len,
                    pool: s.clone(),
                });
            }
            // Room for a new block: idle blocks of other sizes go first.
            if st.stats.held_bytes + want as u64 > st.stats.budget && !st.idle.is_empty() {
                s.bind();
            }
            while st.stats.held_bytes + want as u64 > st.stats.budget {
                let Some((&key, _)) = st.idle.iter().next() else {
                    break;
                };
                let buf = st.idle.remove(&key).expect("found above");
                st.stats.held_bytes -= buf.len() as u64;
            }
            if st.stats.held_bytes + want as u64 <= st.stats.budget {
                cuda::require()?.bind(s.ordinal)?;
                let buf = PinnedBuffer::new(want)?;
                st.stats.allocations += 1;
                st.stats.held_bytes += want as u64;
                st.stats.peak_held_bytes = st.stats.peak_held_bytes.max(st.stats.held_bytes);
                st.stats.lent += 1;
                return Ok(PinnedBlock {
                    buf: Some(buf),
                    len,
                    pool: s.clone(),
                });
            }
            if !st.in_flight.is_empty() {
                reap(&mut st, true)?;
                continue;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    ErrorKind::OutOfMemory,
                    format!(
                        "no pinned memory for {len} bytes: the budget ({} bytes) is lent out",
                        st.stats.budget
                    ),
                ));
            }
            s.returned.wait_for(&mut st, deadline - now);
        }
    }

    /// Keeps `held` (memory a copy reads) until `done` has passed, then drops it. A `take`
    /// waiting for a block is woken: it may now wait for this copy instead of its timeout.
    fn hold_until(&self, held: Box<dyn Send>, done: Done) {
        self.shared.state.lock().in_flight.push_back((held, done));
        self.shared.returned.notify_all();
    }

    /// Takes back the blocks whose copies have passed; returns whether any is still out.
    pub fn reap(&self) -> Result<bool> {
        let mut st = self.shared.state.lock();
        reap(&mut st, false)?;
        Ok(!st.in_flight.is_empty())
    }

    /// The counters now.
    pub fn stats(&self) -> PinnedStats {
        self.shared.state.lock().stats.clone()
    }

    /// Waits for every copy still holding memory lent by the pool, then frees the idle
    /// blocks (blocks lent out elsewhere are freed when they come back).
    fn drain(&self) {
        let mut st = self.shared.state.lock();
        while !st.in_flight.is_empty() {
            let _ = reap(&mut st, true);
        }
        let idle = std::mem::take(&mut st.idle);
        st.stats.held_bytes -= idle.values().map(|b| b.len() as u64).sum::<u64>();
        drop(st);
        if !idle.is_empty() {
            self.shared.bind();
        }
        drop(idle);
    }
}

/// Takes back the blocks whose copies into device memory have passed, in order; with
/// `block`, waits for the oldest first. A failed copy is returned as an error (its block
/// taken back all the same).
fn reap(st: &mut parking_lot::MutexGuard<'_, PoolState>, block: bool) -> Result<()> {
    use parking_lot::MutexGuard;
    if block {
        if let Some((blk, done)) = st.in_flight.pop_front() {
            // The lock is released while waiting, and while the block goes back.
            MutexGuard::unlocked(st, || {
                let r = done.wait();
                drop(blk);
                r
            })?;
        }
    }
    while let Some((_, done)) = st.in_flight.front() {
        let passed = done.is_done();
        if matches!(passed, Ok(false)) {
            break;
        }
        let (blk, _) = st.in_flight.pop_front().expect("front exists");
        MutexGuard::unlocked(st, || drop(blk));
        passed?;
    }
    Ok(())
}

/// A copy out of device memory under way: the memory it reads (held until the copy has
/// passed) and the pinned block it fills.
pub struct Outgoing {
    src: Option<DeviceSource>,
    block: Option<PinnedBlock>,
    done: Done,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("len", &self.block.as_ref().map(|b| b.len()))
            .finish_non_exhaustive()
    }
}

impl Outgoing {
    /// Whether the copy has passed (without waiting).
    pub fn is_done(&self) -> Result<bool> {
        self.done.is_done()
    }

    /// Waits for the copy, gives the device memory back to its owner, and returns the
    /// block holding its bytes.
    pub fn finish(mut self) -> Result<PinnedBlock> {
        let r = self.done.wait();
        self.src = None;
        r?;
        Ok(self.block.take().expect("held until finished"))
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        if self.src.is_some() || self.block.is_some() {
            // Neither the device memory nor the block may be given back while the copy can
            // still touch them.
            let _ = self.done.wait();
        }
    }
}

/// The copies of one GPU: a stream of its own for copies out, and a pinned pool.
#[derive(Debug)]
pub struct CopyEngine {
    ordinal: u32,
    out: Mutex<Stream>,
    pool: PinnedPool,
}

impl Drop for CopyEngine {
    fn drop(&mut self) {
        // Memory held by copies into device memory goes when they have passed; the pool's
        // idle blocks with it.
        self.pool.drain();
    }
}

impl CopyEngine {
    /// The copies of GPU `ordinal`, with at most `pinned_budget` bytes of pinned memory.
    /// Fails with [`ErrorKind::Unavailable`] without CUDA, and with
    /// [`ErrorKind::Unsupported`] where the driver lacks what ordered copies need.
    pub fn new(ordinal: u32, pinned_budget: u64) -> Result<CopyEngine> {
        let driver = cuda::require()?;
        let missing = cuda::missing_symbols(&SYMBOLS);
        if !missing.is_empty() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "the CUDA driver lacks {}: copies cannot be ordered after the stream that \
                     produced the memory",
                    missing.join(", ")
                ),
            ));
        }
        driver.bind(ordinal)?;
        Ok(CopyEngine {
            ordinal,
            out: Mutex::new(Stream::new()?),
            pool: PinnedPool::new(ordinal, pinned_budget),
        })
    }

    /// The GPU.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The pinned pool.
    pub fn pool(&self) -> &PinnedPool {
        &self.pool
    }

    /// The stream copies out of device memory run on: work a producer orders before it
    /// (DLPack's stream handshake, or [`Done::record`] on it) precedes them. It lives as
    /// long as the engine.
    pub fn stream(&self) -> StreamRef {
        let raw = self.out.lock().raw() as usize;
        // SAFETY: the stream is of this GPU's primary context (made in `new` with it
        // current), alive while the engine lives.
        unsafe { StreamRef::from_raw(raw, self.ordinal) }
    }

    /// Starts copying `src` into `block` (which must hold its length) on the copy stream,
    /// after `src`'s producer work has passed; returns at once.
    pub fn copy_out(&self, src: DeviceSource, mut block: PinnedBlock) -> Result<Outgoing> {
        let range = src.range();
        self.same_gpu(range.ordinal())?;
        if block.len() < range.len() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "a pinned block of {} bytes cannot hold {} bytes",
                    block.len(),
                    range.len()
                ),
            ));
        }
        cuda::require()?.bind(self.ordinal)?;
        let out = self.out.lock();
        if let Some(after) = src.after() {
            cuda_event(after)?.order(out.raw())?;
        }
        if !range.is_empty() {
            let dst = &mut block.whole()[..range.len()];
            // SAFETY: `range` is live device memory of this GPU (DeviceBytes' contract, held
            // by the Outgoing returned until the copy has passed) and `dst` lies in a pinned
            // block held by it as well; the stream is alive.
            unsafe { result::memcpy_dtoh_async(dst, range.ptr(), out.raw()) }
                .map_err(|e| device_error("cuMemcpyDtoHAsync failed", e))?;
        }
        let done = Done::at(out.raw())?;
        Ok(Outgoing {
            src: Some(src),
            block: Some(block),
            done,
        })
    }

    /// Starts copying the bytes of `block` into `dest` on its stream (after the work
    /// queued there), and records the copy's end there; `block` goes back to the pool once
    /// the copy has passed. Returns at once.
    pub fn copy_in(&self, block: PinnedBlock, dest: &DeviceDest) -> Result<()> {
        let (dst, stream) = (dest.range(), dest.stream());
        self.check_dest(dest, block.len())?;
        if !dst.is_empty() {
            // SAFETY: DeviceDest's contract for `dst`; the source is the block, held until
            // the copy has passed (`hold_until` below).
            unsafe {
                result::memcpy_htod_async(dst.ptr(), &block[..dst.len()], raw_stream(stream))
            }
            .map_err(|e| device_error("cuMemcpyHtoDAsync failed", e))?;
        }
        let done = Done::at(raw_stream(stream))?;
        self.pool.hold_until(Box::new(block), done);
        Ok(())
    }

    /// Starts copying the first bytes of `buf` (device memory of this GPU) into `dest` on
    /// its stream; `buf` is freed once the copy has passed. Returns at once.
    pub fn copy_device(&self, buf: DeviceBuffer, dest: &DeviceDest) -> Result<()> {
        self.same_gpu(buf.ordinal())?;
        self.check_dest(dest, buf.len())?;
        let done = self.device_to_device(buf.ptr(), dest, None)?;
        self.pool.hold_until(Box::new(buf), done);
        Ok(())
    }

    /// Starts copying the memory of `src` into `dest` on its stream, after `src`'s producer
    /// work; `src` is held until the copy has passed. Returns at once.
    pub fn copy_source(&self, src: std::sync::Arc<DeviceSource>, dest: &DeviceDest) -> Result<()> {
        let r = src.range();
        self.same_gpu(r.ordinal())?;
        self.check_dest(dest, r.len())?;
        let after = src.after().map(cuda_event).transpose()?;
        let done = self.device_to_device(r.ptr(), dest, after)?;
        self.pool.hold_until(Box::new(src), done);
        Ok(())
    }

    /// Queues a device-to-device copy into `dest` on its stream after `after`; the end.
    fn device_to_device(&self, src: u64, dest: &DeviceDest, after: Option<&Done>) -> Result<Done> {
        let (dst, stream) = (dest.range(), dest.stream());
        cuda::require()?.bind(self.ordinal)?;
        if let Some(after) = after {
            after.order(raw_stream(stream))?;
        }
        if !dst.is_empty() {
            // SAFETY: DeviceDest's contract for `dst`; `src` is device memory of this GPU
            // held by the caller until the copy has passed (its callers hand it to
            // `hold_until`), at least `dst.len()` bytes long (checked by the callers).
            unsafe { result::memcpy_dtod_async(dst.ptr(), src, dst.len(), raw_stream(stream)) }
                .map_err(|e| device_error("cuMemcpyDtoDAsync failed", e))?;
        }
        Done::at(raw_stream(stream))
    }

    /// `dest` is of this GPU, on a stream of it, and at most `have` bytes long.
    fn check_dest(&self, dest: &DeviceDest, have: usize) -> Result<()> {
        self.same_gpu(dest.stream().ordinal())?;
        self.same_gpu(dest.range().ordinal())?;
        if dest.range().len() > have {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{have} bytes cannot fill {} bytes of device memory",
                    dest.range().len()
                ),
            ));
        }
        Ok(())
    }

    fn same_gpu(&self, ordinal: u32) -> Result<()> {
        if ordinal == self.ordinal {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "memory of GPU {ordinal} given to the copies of GPU {}",
                    self.ordinal
                ),
            ))
        }
    }
}

/// Queues a copy of `src` into the start of `dst` on `stream` (`cuMemcpyHtoDAsync`) and
/// returns at once.
///
/// # Safety
/// `src` and `dst` must stay allocated and unchanged by the host until the stream has passed
/// the copy (synchronize it, or wait for an event recorded after it); `src` must be pinned
/// memory (a pageable source makes the driver copy synchronously).
pub unsafe fn upload_async(dst: &mut DeviceBuffer, src: &[u8], stream: &Stream) -> Result<()> {
    if src.len() > dst.len() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "{} bytes do not fit in {} bytes of device memory",
                src.len(),
                dst.len()
            ),
        ));
    }
    cuda::require()?.bind(dst.ordinal())?;
    // SAFETY: the caller's contract: both stay valid until the stream passed the copy.
    unsafe { result::memcpy_htod_async(dst.ptr(), src, stream.raw()) }
        .map_err(|e| device_error("cuMemcpyHtoDAsync failed", e))
}

/// `event` as an event of this crate's (CUDA's), or an error: an event of another device
/// library cannot order a CUDA stream.
fn cuda_event(event: &dyn DeviceEvent) -> Result<&Done> {
    (event as &dyn Any).downcast_ref::<Done>().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidInput,
            "an event of another device library given to CUDA copies",
        )
    })
}

/// `block` as a block of a [`PinnedPool`], or an error.
fn pinned_block(block: Box<dyn PinnedBytes>) -> Result<PinnedBlock> {
    let block: Box<dyn Any + Send + Sync> = block;
    block.downcast::<PinnedBlock>().map(|b| *b).map_err(|_| {
        Error::new(
            ErrorKind::InvalidInput,
            "host memory of another device library given to CUDA copies",
        )
    })
}

impl DeviceEvent for Done {
    fn is_done(&self) -> Result<bool> {
        Done::is_done(self)
    }

    fn wait(&self) -> Result<()> {
        Done::wait(self)
    }
}

impl PinnedBytes for PinnedBlock {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }

    fn capacity(&self) -> usize {
        PinnedBlock::capacity(self)
    }

    fn set_len(&mut self, len: usize) {
        PinnedBlock::set_len(self, len);
    }
}

impl DeviceMemory for DeviceBuffer {
    fn device_slice(&self) -> DeviceSlice<'_> {
        self.slice(0, self.len())
    }

    fn device_slice_mut(&mut self) -> DeviceSliceMut<'_> {
        let len = self.len();
        self.slice_mut(0, len)
    }
}

impl OutgoingCopy for Outgoing {
    fn finish(self: Box<Self>) -> Result<Box<dyn PinnedBytes>> {
        Outgoing::finish(*self).map(|b| Box::new(b) as Box<dyn PinnedBytes>)
    }
}

impl DeviceCopies for CopyEngine {
    fn ordinal(&self) -> u32 {
        CopyEngine::ordinal(self)
    }

    fn stream(&self) -> StreamRef {
        CopyEngine::stream(self)
    }

    fn record(&self) -> Result<Box<dyn DeviceEvent>> {
        Ok(Box::new(Done::record(CopyEngine::stream(self))?))
    }

    fn take_pinned(&self, len: usize, wait: Duration) -> Result<Box<dyn PinnedBytes>> {
        Ok(Box::new(self.pool.take(len, wait)?))
    }

    fn copy_out(
        &self,
        src: DeviceSource,
        block: Box<dyn PinnedBytes>,
    ) -> Result<Box<dyn OutgoingCopy>> {
        let block = pinned_block(block)?;
        Ok(Box::new(CopyEngine::copy_out(self, src, block)?))
    }

    fn copy_in(&self, block: Box<dyn PinnedBytes>, dest: &DeviceDest) -> Result<()> {
        CopyEngine::copy_in(self, pinned_block(block)?, dest)
    }

    fn copy_device(&self, buf: Box<dyn DeviceMemory>, dest: &DeviceDest) -> Result<()> {
        let buf: Box<dyn Any + Send + Sync> = buf;
        let buf = buf.downcast::<DeviceBuffer>().map_err(|_| {
            Error::new(
                ErrorKind::InvalidInput,
                "device memory of another device library given to CUDA copies",
            )
        })?;
        CopyEngine::copy_device(self, *buf, dest)
    }

    fn copy_source(&self, src: Arc<DeviceSource>, dest: &DeviceDest) -> Result<()> {
        CopyEngine::copy_source(self, src, dest)
    }

    fn pinned_stats(&self) -> PinnedStats {
        self.pool.stats()
    }
}

/// CUDA as the device library of offload's GPU tensors ([`DeviceRuntime`]): device memory
/// in [`DeviceBuffer`]s, the copies of each GPU in a [`CopyEngine`], and files that take
/// device memory directly where cuFile runs in GPUDirect mode (not its compatibility mode).
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaRuntime;

impl CudaRuntime {
    /// CUDA as a shared [`DeviceRuntime`] (what `OffloadConfig::device_runtime` takes).
    pub fn shared() -> Arc<dyn DeviceRuntime> {
        Arc::new(CudaRuntime)
    }
}

impl DeviceRuntime for CudaRuntime {
    fn copies(&self, ordinal: u32, pinned_budget: u64) -> Result<Arc<dyn DeviceCopies>> {
        Ok(Arc::new(CopyEngine::new(ordinal, pinned_budget)?))
    }

    fn alloc(&self, len: usize, ordinal: u32) -> Result<Box<dyn DeviceMemory>> {
        Ok(Box::new(DeviceBuffer::new(len, ordinal)?))
    }

    fn copy_to_host(&self, src: DeviceSlice<'_>, dst: &mut [u8]) -> Result<()> {
        if dst.len() > src.len() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{} bytes of device memory cannot fill {} bytes",
                    src.len(),
                    dst.len()
                ),
            ));
        }
        crate::copy_to_host(src.ptr(), src.ordinal(), dst)
    }

    fn writes_device_memory_directly(&self) -> bool {
        crate::cufile::cufile(None)
            .is_ok_and(|cf| matches!(cf.mode(), crate::cufile::GdsMode::Direct { .. }))
    }
}
