//! What the selector knows about a transfer before it happens.

use crate::MemoryKind;
use std::sync::Arc;

/// Which way the bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// File to memory.
    Read,
    /// Memory to file.
    Write,
}

impl Direction {
    /// `"read"` or `"write"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
        }
    }
}

display_as_str!(Direction, as_str);

/// Why the transfer happens; different purposes may prefer different paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Purpose {
    /// Anything else.
    #[default]
    General,
    /// Saving or loading model parameters.
    Checkpoint,
    /// Activation (feature-map) offload and prefetch.
    Offload,
    /// Logs and small records.
    Log,
    /// A benchmark measuring the paths themselves.
    Benchmark,
}

impl Purpose {
    /// True when this purpose's writes count only once they are on the device (a checkpoint
    /// or a log is synced before it is relied on): the engine then measures a write until
    /// its bytes have left the page cache, so a buffered write is not mistaken for a fast
    /// one, and learns the choice for these writes apart from the others.
    pub fn durable_writes(self) -> bool {
        matches!(self, Purpose::Checkpoint | Purpose::Log)
    }
}

/// Whether the bytes of a read are likely in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum CacheState {
    /// Not known.
    #[default]
    Unknown,
    /// Likely resident in the page cache.
    Cached,
    /// Likely on the device only.
    Cold,
}

/// The file system and block device a file lives on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileLocation {
    /// File system type, e.g. `"ext4"`, `"xfs"`, `"tmpfs"` (empty when unknown).
    pub fs_type: String,
    /// The device number (`st_dev`) as `major:minor`, empty when unknown.
    pub device: String,
}

impl FileLocation {
    /// A file on file system `fs_type` of block device `device` (`major:minor`).
    pub fn new(fs_type: impl Into<String>, device: impl Into<String>) -> Self {
        FileLocation {
            fs_type: fs_type.into(),
            device: device.into(),
        }
    }
}

/// Everything known about a transfer before it starts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TransferContext {
    /// Read or write.
    pub direction: Direction,
    /// Bytes to move.
    pub bytes: u64,
    /// Where the memory side lives.
    pub memory: MemoryKind,
    /// Where the file lives (shared: a file's transfers all carry its location, and
    /// cloning a context costs no allocation).
    pub location: Arc<FileLocation>,
    /// Requests in flight on the engine when this one starts (this one included).
    pub in_flight: u32,
    /// Why the transfer happens.
    pub purpose: Purpose,
    /// Page-cache residency of the bytes (reads only).
    pub cache: CacheState,
}

impl TransferContext {
    /// A transfer of `bytes` between host memory and a file at `location`, alone on the
    /// engine (one request in flight), of general purpose, its cache state unknown; set the
    /// fields to say more.
    pub fn host(direction: Direction, bytes: u64, location: FileLocation) -> Self {
        TransferContext {
            direction,
            bytes,
            memory: MemoryKind::Host,
            location: Arc::new(location),
            in_flight: 1,
            purpose: Purpose::General,
            cache: CacheState::Unknown,
        }
    }
}
