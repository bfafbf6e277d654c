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

use crate::cuda::{self, device_error, Event, PinnedBuffer, Stream};
use crate::DeviceBuffer;
use cudarc::driver::{result, sys};
use fastensor_core::{DeviceRange, DeviceSlice, Error, ErrorKind, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// Driver entry points this module needs beyond those every backend needs.
const SYMBOLS: [&str; 2] = ["cuStreamWaitEvent", "cuEventQuery"];

/// Device memory owned elsewhere (a framework's tensor), lent for a copy out of it.
///
/// # Safety
/// [`DeviceBytes::range`] must name device memory that stays allocated, at a fixed address,
/// for as long as the value lives, and that nobody writes once the work the copy is ordered
/// after has passed. Dropping the value gives the memory back to its owner.
pub unsafe trait DeviceBytes: Send + Sync {
    /// The memory: address, length, GPU.
    fn range(&self) -> DeviceRange;
}

/// Device memory to copy out of (or write from), and the work it must wait for.
pub struct DeviceSource {
    bytes: Box<dyn DeviceBytes>,
    after: Option<Done>,
}

impl std::fmt::Debug for DeviceSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSource")
            .field("range", &self.bytes.range())
            .finish_non_exhaustive()
    }
}

impl DeviceSource {
    /// The memory of `bytes`, ready once `after` (the producer's work) has passed (`None`:
    /// ready now, or ordered by its owner with the streams that will read it).
    pub fn new(bytes: Box<dyn DeviceBytes>, after: Option<Done>) -> Self {
        DeviceSource { bytes, after }
    }

    /// The memory.
    pub fn range(&self) -> DeviceRange {
        self.bytes.range()
    }

    /// The memory as a transfer source (an engine write of device memory).
    pub fn slice(&self) -> DeviceSlice<'_> {
        let r = self.bytes.range();
        // SAFETY: DeviceBytes' contract: the memory stays allocated, fixed and unwritten
        // while `bytes` lives, which the borrow of self guarantees.
        unsafe { DeviceSlice::from_raw(r.ptr(), r.len(), r.ordinal()) }
    }

    /// Blocks the calling thread until the producer's work has passed.
    pub fn wait_ready(&self) -> Result<()> {
        match &self.after {
            Some(done) => done.wait(),
            None => Ok(()),
        }
    }
}

/// Device memory a copy may fill, on the stream whose later work reads it.
#[derive(Debug, Clone, Copy)]
pub struct DeviceDest {
    range: DeviceRange,
    stream: StreamRef,
}

impl DeviceDest {
    /// `range`, filled by copies queued on `stream`.
    ///
    /// # Safety
    /// `range` must be device memory of `stream`'s GPU that the stream's later work may
    /// write, and stay allocated until the copies queued now on `stream` have passed (memory
    /// a stream-ordered allocator handed out for `stream` qualifies).
    pub unsafe fn new(range: DeviceRange, stream: StreamRef) -> Self {
        DeviceDest { range, stream }
    }

    /// The memory.
    pub fn range(&self) -> DeviceRange {
        self.range
    }

    /// The stream.
    pub fn stream(&self) -> StreamRef {
        self.stream
    }
}

/// A stream owned elsewhere (a framework's current stream), named by its handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRef {
    raw: usize,
    ordinal: u32,
}

impl StreamRef {
    /// The stream of handle `raw` on GPU `ordinal` (0: the default stream).
    ///
    /// # Safety
    /// `raw` must be a stream of GPU `ordinal`'s primary context, alive while the value is
    /// used.
    pub unsafe fn from_raw(raw: usize, ordinal: u32) -> Self {
        StreamRef { raw, ordinal }
    }

    /// The GPU.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The stream's handle (what DLPack's stream handshake takes).
    pub fn handle(&self) -> usize {
        self.raw
    }

    /// Blocks the calling thread until the work queued on the stream has passed.
    pub fn synchronize(&self) -> Result<()> {
        cuda::require()?.bind(self.ordinal)?;
        // SAFETY: the stream is alive (the contract of `from_raw`).
        unsafe { result::stream::synchronize(self.raw()) }
            .map_err(|e| device_error("cuStreamSynchronize failed", e))
    }

    fn raw(&self) -> sys::CUstream {
        self.raw as sys::CUstream
    }
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
        Done::at(stream.raw())
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

/// Counters of a [`PinnedPool`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinnedStats {
    /// The most pinned bytes the pool may hold.
    pub budget: u64,
    /// Pinned bytes held now (lent and idle).
    pub held_bytes: u64,
    /// The most it held at once.
    pub peak_held_bytes: u64,
    /// Blocks allocated (`cuMemHostAlloc` calls) since the pool was made.
    pub allocations: u64,
    /// Blocks lent.
    pub lent: u64,
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
    /// (DLPack's stream handshake, or [`Done::record`] on it) precedes them.
    pub fn stream(&self) -> StreamRef {
        StreamRef {
            raw: self.out.lock().raw() as usize,
            ordinal: self.ordinal,
        }
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
        if let Some(after) = &src.after {
            after.order(out.raw())?;
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
            unsafe { result::memcpy_htod_async(dst.ptr(), &block[..dst.len()], stream.raw()) }
                .map_err(|e| device_error("cuMemcpyHtoDAsync failed", e))?;
        }
        let done = Done::at(stream.raw())?;
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
        let done = self.device_to_device(r.ptr(), dest, src.after.as_ref())?;
        self.pool.hold_until(Box::new(src), done);
        Ok(())
    }

    /// Queues a device-to-device copy into `dest` on its stream after `after`; the end.
    fn device_to_device(&self, src: u64, dest: &DeviceDest, after: Option<&Done>) -> Result<Done> {
        let (dst, stream) = (dest.range(), dest.stream());
        cuda::require()?.bind(self.ordinal)?;
        if let Some(after) = after {
            after.order(stream.raw())?;
        }
        if !dst.is_empty() {
            // SAFETY: DeviceDest's contract for `dst`; `src` is device memory of this GPU
            // held by the caller until the copy has passed (its callers hand it to
            // `hold_until`), at least `dst.len()` bytes long (checked by the callers).
            unsafe { result::memcpy_dtod_async(dst.ptr(), src, dst.len(), stream.raw()) }
                .map_err(|e| device_error("cuMemcpyDtoDAsync failed", e))?;
        }
        Done::at(stream.raw())
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
