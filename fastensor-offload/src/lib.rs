//! Feature-map (activation) offload: tensors go to one swap file on an SSD while compute
//! goes on, and come back ahead of the `get` that needs them.
//!
//! An [`OffloadStore`] keeps, under a memory budget, the tensors handed to
//! [`OffloadStore::put`] while background I/O threads write them to a preallocated swap
//! file opened through a [`FileOpener`](fastensor_core::FileOpener)'s
//! [`open_swap`](fastensor_core::FileOpener::open_swap): the facade's `Engine`, which tags
//! the transfers `Offload` and picks the fastest backend for each, or any one backend.
//! [`OffloadStore::get`] returns a tensor, from memory when it is still there (being
//! written, or prefetched), and prefetches the tensors expected next: by default in backward
//! order (last in, first out), or in the order given to [`OffloadStore::hint_order`].
//!
//! ```no_run
//! use fastensor_core::HostBuffer;
//! use fastensor_offload::{OffloadConfig, OffloadStore};
//! # fn main() -> fastensor_core::Result<()> {
//! // `fastensor::Engine::new()?` in a program: it chooses the backend per transfer.
//! let opener = fastensor_posix::PosixBackend;
//! let store = OffloadStore::new(&opener, OffloadConfig::new("/scratch", 256 << 20))?;
//! let mut handles = Vec::new();
//! for layer in 0..32 {
//!     let activation = HostBuffer::new(64 << 20)?; // forward pass output
//!     handles.push(store.put(activation, format!("layer{layer}"))?);
//! }
//! while let Some(h) = handles.pop() {
//!     let activation = store.get(&h)?; // backward pass; the next ones are prefetched
//!     drop(h); // frees its space in the swap file
//!     # let _ = activation;
//! }
//! println!("{:?}", store.stats());
//! # Ok(()) }
//! ```
//!
//! [`OffloadStore::put`] takes a [`HostBuffer`](fastensor_core::HostBuffer) it then owns, or a
//! [`Payload::foreign`]: memory owned elsewhere (a framework's tensor), written in place and
//! given back once written.
//!
//! Memory: the budget bounds every byte the store holds; buffers of reads back come from a
//! [`HostPool`] (page-aligned blocks moved, not faulted, between sizes), which a caller can
//! share with the framework that allocates the tensors (see [`OffloadConfig::pool`]).
//!
//! GPU tensors ([`OffloadStore::put_device`], [`OffloadStore::get_into_device`]) go through
//! the device library the store is given ([`OffloadConfig::device_runtime`]), by the
//! contract of [`fastensor_core::device_copies`]: this crate knows no CUDA
//! (`fastensor-gds` implements the contract).

#![deny(missing_docs)]

mod allocator;
mod codec;
mod device;
mod packing;
mod payload;
mod pool;
mod schedule;
mod shared;
mod state;
mod store;
mod swap;
mod worker;

pub use allocator::{round_up, Extent, ExtentAllocator, EXTENT_ALIGN};
pub use device::DevicePath;
pub use payload::{ForeignBytes, Payload};
pub use pool::{HostPool, PoolStats};
pub use schedule::Schedule;
pub use shared::PINNED_WAIT;
pub use store::{Handle, OffloadStore};

use fastensor_core::device_copies::DeviceRuntime;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The defaults of offload, in one table: [`OffloadConfig::new`] takes them, and so does
/// Python's `fastensor.torch.offload` (read through the native module), so that the two
/// never differ.
pub mod defaults {
    /// The memory budget of an offload that names none (bytes): 1 GiB.
    pub const BUDGET: u64 = 1 << 30;
    /// Tensors smaller than this (bytes) stay in memory and never touch the swap file: 1 MiB
    /// (offloading less frees little memory, and costs a request each way).
    pub const SMALL_THRESHOLD: usize = 1 << 20;
    /// The prefetch depth that stands for "as many tensors as the budget holds" (the
    /// default: the budget, not a count, bounds what is read ahead).
    pub const PREFETCH_AS_BUDGET_HOLDS: usize = 1 << 20;
    /// Background I/O threads.
    pub const IO_THREADS: usize = 2;
    /// Whether chunks that are mostly zeros or two-valued are packed into bitmaps.
    pub const PACK: bool = true;
    /// Python: torch's CPU allocations of at least this many bytes come from the host pool
    /// while an offload block's graphs live.
    pub const POOL_MIN_BYTES: usize = 256 << 10;
}

/// Settings of an [`OffloadStore`].
#[derive(Debug, Clone)]
pub struct OffloadConfig {
    /// The directory of the swap file (on the SSD).
    pub dir: PathBuf,
    /// Most bytes the store holds in memory: tensors being written, kept after their write,
    /// being read back, or read back ahead of use. `put` waits rather than exceed it; a
    /// tensor larger than the budget is written through, never held. Small tensors are not
    /// counted.
    pub budget: u64,
    /// How many of the tensors expected next are kept coming back (budget permitting).
    pub prefetch_depth: usize,
    /// Tensors smaller than this (bytes) stay in memory and never touch the file.
    pub small_threshold: usize,
    /// Background I/O threads.
    pub io_threads: usize,
    /// Bytes preallocated in the swap file at creation (it grows when needed).
    pub initial_capacity: u64,
    /// Use this backend for the swap file instead of letting the engine choose. Without
    /// it the engine chooses among the backends that bypass the page cache (where there is
    /// one): a cached copy of the swap file would hold the memory offload frees.
    pub pin: Option<String>,
    /// Where reads back take their buffers; `None`: a pool of the store's own. Share one
    /// pool with whatever else allocates such memory in the process (the framework's
    /// tensors) so that memory freed by one serves the other.
    pub pool: Option<Arc<HostPool>>,
    /// Most bytes of GPU memory the store holds: GPU tensors written straight from device
    /// memory (the direct path) until written, and read back into device memory ahead of
    /// use. GPU tensors staged through pinned memory count against `budget` instead (their
    /// pinned blocks). Default: `budget`.
    pub device_budget: u64,
    /// How GPU tensors reach the swap file.
    pub device_path: DevicePath,
    /// The device library GPU tensors go through (`fastensor_gds::copies::CudaRuntime`
    /// for CUDA); `None` (default): the opener's
    /// ([`FileOpener::device_runtime`](fastensor_core::FileOpener::device_runtime): the
    /// facade's `Engine` built with its `gds` feature has CUDA's), and where it has none
    /// [`OffloadStore::put_device`] and [`OffloadStore::get_into_device`] are
    /// [`ErrorKind::Unsupported`](fastensor_core::ErrorKind::Unsupported).
    pub device_runtime: Option<Arc<dyn DeviceRuntime>>,
    /// Most bytes of host tensors left in memory unwritten, the last ones put (within the
    /// budget): backward takes them first, so they never touch the disk. Older ones are
    /// written, oldest first, and a put that needs their room starts their writes. `None`
    /// (default): the budget less room for the writes in flight, the smaller of half the
    /// budget and four times the largest tensor put so far; `Some(0)`: every tensor is
    /// written as soon as it is put.
    pub write_behind: Option<u64>,
    /// Most bytes of GPU tensors left in their own device memory unwritten, per GPU, the
    /// last ones put: backward takes them first, with no copy at all. Older ones are copied
    /// out and written, oldest first, by the put that passes the limit (on its thread,
    /// waiting for room as any put does). The store holds such a tensor as it was lent (its
    /// memory stays the caller's and is counted in no budget of the store's). A tensor
    /// larger than its path's budget is never kept. `None` (default): the budget;
    /// `Some(0)`: every GPU tensor is copied out as soon as it is put.
    pub device_write_behind: Option<u64>,
    /// Pack host tensors' chunks that are mostly zeros or two-valued (dropout masks, boolean
    /// masks, all-zero blocks) into a bitmap on their way to the swap file, and unpack them
    /// on the way back, bit for bit: fewer bytes cross to the disk. Other chunks cost a
    /// glance at their first 4 KiB and go as they are. Default on.
    pub pack: bool,
}

impl OffloadConfig {
    /// A swap file in `dir` and a memory budget of `budget` bytes; the rest from
    /// [`defaults`]: prefetch as many tensors as the budget holds, small threshold 1 MiB,
    /// 2 I/O threads, packing on; nothing preallocated, no pinned backend.
    pub fn new(dir: impl Into<PathBuf>, budget: u64) -> Self {
        OffloadConfig {
            dir: dir.into(),
            budget,
            prefetch_depth: defaults::PREFETCH_AS_BUDGET_HOLDS,
            small_threshold: defaults::SMALL_THRESHOLD,
            io_threads: defaults::IO_THREADS,
            initial_capacity: 0,
            pin: None,
            pool: None,
            device_budget: budget,
            device_path: DevicePath::Auto,
            device_runtime: None,
            write_behind: None,
            device_write_behind: None,
            pack: defaults::PACK,
        }
    }

    /// The unwritten bytes allowed ([`OffloadConfig::write_behind`], at most the budget)
    /// once the largest tensor put has `largest` bytes.
    pub(crate) fn write_behind_bytes(&self, largest: u64) -> u64 {
        let in_flight = (self.budget / 2).min(largest.saturating_mul(4));
        self.write_behind
            .unwrap_or(self.budget - in_flight)
            .min(self.budget)
    }

    /// Sets [`OffloadConfig::write_behind`].
    pub fn write_behind(mut self, bytes: u64) -> Self {
        self.write_behind = Some(bytes);
        self
    }

    /// The bytes of GPU tensors each GPU may keep unwritten
    /// ([`OffloadConfig::device_write_behind`]).
    pub(crate) fn device_write_behind_bytes(&self) -> u64 {
        self.device_write_behind.unwrap_or(self.budget)
    }

    /// Sets [`OffloadConfig::device_write_behind`].
    pub fn device_write_behind(mut self, bytes: u64) -> Self {
        self.device_write_behind = Some(bytes);
        self
    }

    /// Sets [`OffloadConfig::pack`].
    pub fn pack(mut self, on: bool) -> Self {
        self.pack = on;
        self
    }

    /// Sets [`OffloadConfig::prefetch_depth`].
    pub fn prefetch_depth(mut self, depth: usize) -> Self {
        self.prefetch_depth = depth;
        self
    }

    /// Sets [`OffloadConfig::small_threshold`].
    pub fn small_threshold(mut self, bytes: usize) -> Self {
        self.small_threshold = bytes;
        self
    }

    /// Sets [`OffloadConfig::io_threads`] (at least 1).
    pub fn io_threads(mut self, n: usize) -> Self {
        self.io_threads = n.max(1);
        self
    }

    /// Sets [`OffloadConfig::initial_capacity`].
    pub fn initial_capacity(mut self, bytes: u64) -> Self {
        self.initial_capacity = bytes;
        self
    }

    /// Sets [`OffloadConfig::pin`].
    pub fn pin(mut self, backend: impl Into<String>) -> Self {
        self.pin = Some(backend.into());
        self
    }

    /// Sets [`OffloadConfig::device_budget`].
    pub fn device_budget(mut self, bytes: u64) -> Self {
        self.device_budget = bytes;
        self
    }

    /// Sets [`OffloadConfig::device_path`].
    pub fn device_path(mut self, path: DevicePath) -> Self {
        self.device_path = path;
        self
    }

    /// Sets [`OffloadConfig::device_runtime`].
    pub fn device_runtime(mut self, runtime: Arc<dyn DeviceRuntime>) -> Self {
        self.device_runtime = Some(runtime);
        self
    }

    /// Sets [`OffloadConfig::pool`].
    pub fn pool(mut self, pool: Arc<HostPool>) -> Self {
        self.pool = Some(pool);
        self
    }
}

/// Counters of an [`OffloadStore`], from [`OffloadStore::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OffloadStats {
    /// The memory budget (bytes).
    pub budget_bytes: u64,
    /// Bytes held now: being written, being read back, or prefetched.
    pub held_bytes: u64,
    /// The most bytes ever held at once (resident plus in flight); never above the budget.
    pub peak_held_bytes: u64,
    /// The process's largest resident memory seen by `put` and `get` (bytes, as the kernel
    /// counts it: `/proc/self/statm`); 0 where it cannot be read.
    pub peak_resident_bytes: u64,
    /// The GPU memory budget ([`OffloadConfig::device_budget`], bytes).
    pub device_budget_bytes: u64,
    /// Bytes of GPU tensors kept in their own device memory unwritten now
    /// ([`OffloadConfig::device_write_behind`]), all GPUs together.
    pub device_unwritten_bytes: u64,
    /// The most such bytes at once.
    pub peak_device_unwritten_bytes: u64,
    /// GPU memory held now (the direct path).
    pub device_held_bytes: u64,
    /// The most GPU memory held at once.
    pub peak_device_held_bytes: u64,
    /// GPU tensors put.
    pub device_puts: u64,
    /// GPU tensors copied into the caller's device memory by `get_into_device`.
    pub device_gets: u64,
    /// Bytes copied out of GPU memory into pinned memory (the staged path).
    pub bytes_to_host: u64,
    /// Bytes copied into GPU memory by `get_into_device`.
    pub bytes_to_device: u64,
    /// Time the I/O threads waited for copies out of GPU memory to finish before writing.
    pub stage_wait: Duration,
    /// Bytes of small tensors kept in memory (not counted in the budget).
    pub small_bytes: u64,
    /// The swap file's capacity (bytes).
    pub file_capacity: u64,
    /// Bytes of the swap file allocated to live tensors.
    pub file_allocated: u64,
    /// Tensors put.
    pub puts: u64,
    /// Tensors got.
    pub gets: u64,
    /// Gets answered from memory (small, being written, or prefetched) without waiting.
    pub gets_from_memory: u64,
    /// Gets that waited for a read in flight.
    pub gets_waited: u64,
    /// Gets that read the disk themselves (nothing prefetched).
    pub gets_from_disk: u64,
    /// Bytes of the tensors written to the swap file (as they are in memory).
    pub bytes_written: u64,
    /// Bytes of the tensors read back from the swap file (as they are in memory).
    pub bytes_read: u64,
    /// Bytes that crossed to the swap file: `bytes_written` less what packing saved
    /// ([`OffloadConfig::pack`]).
    pub file_bytes_written: u64,
    /// Bytes that came from the swap file: `bytes_read` less what packing saved.
    pub file_bytes_read: u64,
    /// Prefetch reads issued.
    pub prefetches: u64,
    /// Tensors kept or read back ahead that were dropped from memory to make room.
    pub evictions: u64,
    /// Bytes of tensors that left the store (taken by a get, discarded or dropped) before
    /// they were ever written: the unwritten tails ([`OffloadConfig::write_behind`],
    /// [`OffloadConfig::device_write_behind`]).
    pub bytes_never_written: u64,
    /// Background transfers that failed.
    pub errors: u64,
    /// Tensors larger than the budget, written by `put` itself.
    pub written_through: u64,
    /// Time `put` waited for the budget (backpressure).
    pub put_wait: Duration,
    /// Time `get` waited for I/O (in flight or its own read).
    pub get_stall: Duration,
    /// Time the I/O threads spent writing (summed over threads).
    pub write_time: Duration,
    /// Time spent reading, prefetches and `get`'s own reads (summed over threads).
    pub read_time: Duration,
}

/// One of [`OffloadStats`]' figures, as [`OffloadStats::figures`] lists them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Figure {
    /// A count or a number of bytes.
    Count(u64),
    /// A time, in seconds.
    Seconds(f64),
}

impl OffloadStats {
    /// Every figure under its field's name (a time as seconds, its name ending in `_s`),
    /// in the order of the fields: what bindings expose as is, so that a field added here
    /// reaches them with no list of theirs to update.
    pub fn figures(&self) -> Vec<(&'static str, Figure)> {
        // Destructured in full: a new field fails to compile until it is listed.
        let OffloadStats {
            budget_bytes,
            held_bytes,
            peak_held_bytes,
            peak_resident_bytes,
            device_budget_bytes,
            device_unwritten_bytes,
            peak_device_unwritten_bytes,
            device_held_bytes,
            peak_device_held_bytes,
            device_puts,
            device_gets,
            bytes_to_host,
            bytes_to_device,
            stage_wait,
            small_bytes,
            file_capacity,
            file_allocated,
            puts,
            gets,
            gets_from_memory,
            gets_waited,
            gets_from_disk,
            bytes_written,
            bytes_read,
            file_bytes_written,
            file_bytes_read,
            prefetches,
            evictions,
            bytes_never_written,
            errors,
            written_through,
            put_wait,
            get_stall,
            write_time,
            read_time,
        } = self;
        vec![
            ("budget_bytes", Figure::Count(*budget_bytes)),
            ("held_bytes", Figure::Count(*held_bytes)),
            ("peak_held_bytes", Figure::Count(*peak_held_bytes)),
            ("peak_resident_bytes", Figure::Count(*peak_resident_bytes)),
            ("device_budget_bytes", Figure::Count(*device_budget_bytes)),
            (
                "device_unwritten_bytes",
                Figure::Count(*device_unwritten_bytes),
            ),
            (
                "peak_device_unwritten_bytes",
                Figure::Count(*peak_device_unwritten_bytes),
            ),
            ("device_held_bytes", Figure::Count(*device_held_bytes)),
            (
                "peak_device_held_bytes",
                Figure::Count(*peak_device_held_bytes),
            ),
            ("device_puts", Figure::Count(*device_puts)),
            ("device_gets", Figure::Count(*device_gets)),
            ("bytes_to_host", Figure::Count(*bytes_to_host)),
            ("bytes_to_device", Figure::Count(*bytes_to_device)),
            ("stage_wait_s", Figure::Seconds(stage_wait.as_secs_f64())),
            ("small_bytes", Figure::Count(*small_bytes)),
            ("file_capacity", Figure::Count(*file_capacity)),
            ("file_allocated", Figure::Count(*file_allocated)),
            ("puts", Figure::Count(*puts)),
            ("gets", Figure::Count(*gets)),
            ("gets_from_memory", Figure::Count(*gets_from_memory)),
            ("gets_waited", Figure::Count(*gets_waited)),
            ("gets_from_disk", Figure::Count(*gets_from_disk)),
            ("bytes_written", Figure::Count(*bytes_written)),
            ("bytes_read", Figure::Count(*bytes_read)),
            ("file_bytes_written", Figure::Count(*file_bytes_written)),
            ("file_bytes_read", Figure::Count(*file_bytes_read)),
            ("prefetches", Figure::Count(*prefetches)),
            ("evictions", Figure::Count(*evictions)),
            ("bytes_never_written", Figure::Count(*bytes_never_written)),
            ("errors", Figure::Count(*errors)),
            ("written_through", Figure::Count(*written_through)),
            ("put_wait_s", Figure::Seconds(put_wait.as_secs_f64())),
            ("get_stall_s", Figure::Seconds(get_stall.as_secs_f64())),
            ("write_time_s", Figure::Seconds(write_time.as_secs_f64())),
            ("read_time_s", Figure::Seconds(read_time.as_secs_f64())),
        ]
    }
}
