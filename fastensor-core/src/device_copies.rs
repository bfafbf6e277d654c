//! Stream-ordered copies between GPU memory and host memory, as a contract: what the offload
//! store needs of a device library (CUDA, through `fastensor-gds`) to keep GPU tensors,
//! named here so that the store and the library meet without knowing each other.
//!
//! - [`DeviceRuntime`]: the library, once per process: device memory of its own
//!   ([`DeviceMemory`]), synchronous copies to the host, whether file I/O moves device memory
//!   itself, and the copies of each GPU.
//! - [`DeviceCopies`]: the copies of one GPU: a copy stream, a pool of pinned host blocks
//!   ([`PinnedBytes`]), copies out of device memory into a block ([`OutgoingCopy`]), and
//!   copies into device memory on the caller's stream.
//! - The values that flow between them: [`DeviceSource`] (device memory lent for a copy
//!   out, [`DeviceBytes`], with the producer's work it waits for, a [`DeviceEvent`]),
//!   [`DeviceDest`] (device memory a copy fills, on a [`StreamRef`]), [`PinnedStats`].
//!
//! The host never synchronizes a device for these copies: a copy out starts after an event
//! of the producer's stream, a copy into device memory runs on the consumer's stream and
//! holds what it reads until its own event has passed. Values made by one library
//! (blocks, device memory, events) are handed back to that library only; another library's
//! value is an [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) error.

use crate::{DeviceRange, DeviceSlice, DeviceSliceMut, Result};
use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A device library's GPU support, as the offload store uses it (`fastensor-gds`
/// implements it for CUDA).
pub trait DeviceRuntime: Send + Sync + fmt::Debug {
    /// The copies of GPU `ordinal`, with a pinned pool of at most `pinned_budget` bytes: a
    /// new value on each call (a caller keeps one per GPU). Fails where the GPU's copies
    /// cannot be set up ([`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) without
    /// the library, [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) where it lacks
    /// what stream-ordered copies need).
    fn copies(&self, ordinal: u32, pinned_budget: u64) -> Result<Arc<dyn DeviceCopies>>;

    /// `len` bytes of new device memory on GPU `ordinal`.
    fn alloc(&self, len: usize, ordinal: u32) -> Result<Box<dyn DeviceMemory>>;

    /// Copies the first `dst.len()` bytes of `src` into `dst` (at most `src.len()`; more is
    /// an [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) error), and returns
    /// once they are there. Orders nothing: `src` must be ready.
    fn copy_to_host(&self, src: DeviceSlice<'_>, dst: &mut [u8]) -> Result<()>;

    /// Whether files on this machine take device memory without a copy through host memory
    /// (GPUDirect Storage, not a compatibility mode that stages through the host).
    fn writes_device_memory_directly(&self) -> bool;
}

/// The copies of one GPU (see the [module documentation](self)).
pub trait DeviceCopies: Send + Sync + fmt::Debug {
    /// The GPU.
    fn ordinal(&self) -> u32;

    /// The stream copies out of device memory run on: work a producer orders before it
    /// (DLPack's stream handshake) precedes them. It lives as long as this value.
    fn stream(&self) -> StreamRef;

    /// The end of the work queued on [`DeviceCopies::stream`] so far.
    fn record(&self) -> Result<Box<dyn DeviceEvent>>;

    /// A block of the GPU's pinned pool of at least `len` bytes (its first `len` in use;
    /// stale contents), waiting at most `wait` for blocks lent out to come back. No room
    /// then is an [`ErrorKind::OutOfMemory`](crate::ErrorKind::OutOfMemory) error; a block
    /// larger than the pool's budget is refused.
    fn take_pinned(&self, len: usize, wait: Duration) -> Result<Box<dyn PinnedBytes>>;

    /// Starts copying `src` into `block` (which must hold its length) on the copy stream,
    /// after `src`'s producer work has passed; returns at once. `src` is held until the copy
    /// has passed ([`OutgoingCopy::finish`]).
    fn copy_out(
        &self,
        src: DeviceSource,
        block: Box<dyn PinnedBytes>,
    ) -> Result<Box<dyn OutgoingCopy>>;

    /// Starts copying the bytes of `block` into `dest` on its stream (after the work queued
    /// there); `block` goes back to its pool once the copy has passed. Returns at once.
    fn copy_in(&self, block: Box<dyn PinnedBytes>, dest: &DeviceDest) -> Result<()>;

    /// Starts copying the first bytes of `buf` (device memory of this GPU) into `dest` on
    /// its stream; `buf` is freed once the copy has passed. Returns at once.
    fn copy_device(&self, buf: Box<dyn DeviceMemory>, dest: &DeviceDest) -> Result<()>;

    /// Starts copying the memory of `src` (of this GPU) into `dest` on its stream, after
    /// `src`'s producer work; `src` is held until the copy has passed. Returns at once.
    fn copy_source(&self, src: Arc<DeviceSource>, dest: &DeviceDest) -> Result<()>;

    /// The counters of the GPU's pinned pool.
    fn pinned_stats(&self) -> PinnedStats;
}

/// A block of pinned host memory from a [`DeviceCopies`] pool (its first bytes in use);
/// back to its pool when dropped.
pub trait PinnedBytes: Any + Send + Sync + fmt::Debug {
    /// The bytes in use.
    fn bytes(&self) -> &[u8];

    /// The bytes in use, to write.
    fn bytes_mut(&mut self) -> &mut [u8];

    /// Bytes the block can hold (at least those in use).
    fn capacity(&self) -> usize;

    /// Sets the bytes in use (at most [`PinnedBytes::capacity`]).
    fn set_len(&mut self, len: usize);
}

/// Device memory of a [`DeviceRuntime`]'s own, freed on drop.
pub trait DeviceMemory: Any + Send + Sync + fmt::Debug {
    /// The whole memory as a transfer source.
    fn device_slice(&self) -> DeviceSlice<'_>;

    /// The whole memory as a transfer destination.
    fn device_slice_mut(&mut self) -> DeviceSliceMut<'_>;

    /// Where the memory lies: address, length, GPU.
    fn range(&self) -> DeviceRange {
        *self.device_slice()
    }
}

/// A copy out of device memory into a pinned block, under way ([`DeviceCopies::copy_out`]).
/// Dropped unfinished, it waits for the copy before anything it holds is given back.
pub trait OutgoingCopy: Send + fmt::Debug {
    /// Waits for the copy, gives the device memory back to its owner, and returns the block
    /// holding its bytes.
    fn finish(self: Box<Self>) -> Result<Box<dyn PinnedBytes>>;
}

/// The end of some queued device work (an event recorded after it).
pub trait DeviceEvent: Any + Send + Sync + fmt::Debug {
    /// Whether the work has passed (without waiting); a failure of that work is an error.
    fn is_done(&self) -> Result<bool>;

    /// Blocks the calling thread until the work has passed; its failure is an error.
    fn wait(&self) -> Result<()>;
}

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
    after: Option<Box<dyn DeviceEvent>>,
}

impl fmt::Debug for DeviceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSource")
            .field("range", &self.bytes.range())
            .finish_non_exhaustive()
    }
}

impl DeviceSource {
    /// The memory of `bytes`, ready once `after` (the producer's work) has passed (`None`:
    /// ready now, or ordered by its owner with the streams that will read it).
    pub fn new(bytes: Box<dyn DeviceBytes>, after: Option<Box<dyn DeviceEvent>>) -> Self {
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

    /// The producer's work the memory is ready after (`None`: ready now).
    pub fn after(&self) -> Option<&dyn DeviceEvent> {
        self.after.as_deref()
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
    /// `raw` must be a stream of GPU `ordinal`'s primary context (for CUDA), alive while the
    /// value is used.
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
}

/// Counters of a pool of pinned host memory ([`DeviceCopies::pinned_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinnedStats {
    /// The most pinned bytes the pool may hold.
    pub budget: u64,
    /// Pinned bytes held now (lent and idle).
    pub held_bytes: u64,
    /// The most it held at once.
    pub peak_held_bytes: u64,
    /// Blocks allocated (pinned by the device library) since the pool was made.
    pub allocations: u64,
    /// Blocks lent.
    pub lent: u64,
}
