//! Settings of the io_uring backend.

/// Settings of the [`UringBackend`](crate::UringBackend).
///
/// The defaults keep 16 requests of 2 MiB in flight from the submitting thread alone, which
/// saturates a typical SSD with one core (measured with `examples/uring_vs_direct.rs`: larger
/// requests cost less CPU per GiB, 16 of them keep the device busy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UringConfig {
    /// Requests in flight per ring (the ring's submission queue size). At least 1; the
    /// kernel rounds the ring up to a power of two. Default 16.
    pub queue_depth: u32,
    /// Bytes per request of a large transfer; rounded up to the file's alignment and at most
    /// 1 GiB. Default 2 MiB.
    pub chunk_size: usize,
    /// Let a kernel thread poll the submission queue (`IORING_SETUP_SQPOLL`), so submitting
    /// needs no system call while the thread is awake. Costs a busy kernel thread per ring.
    /// Default off.
    pub sqpoll: bool,
    /// How long (milliseconds) the SQPOLL thread spins idle before it sleeps. Default 100.
    pub sqpoll_idle_ms: u32,
    /// Bytes of the page-aligned staging area of each ring, used for unaligned buffers and
    /// for partial blocks at either end of a read. At least one chunk. Default 4 MiB.
    pub staging_size: usize,
    /// Register the staging area with the ring (fixed buffers: `READ_FIXED`/`WRITE_FIXED`,
    /// no page pinning per request). Falls back to plain reads and writes when the kernel
    /// refuses (for example `RLIMIT_MEMLOCK`). Default on.
    pub register_buffers: bool,
    /// Register the file's descriptors with each ring (no descriptor lookup per request).
    /// Default on.
    pub register_files: bool,
    /// Allocate the blocks of a large write that extends the file before writing them, so the
    /// chunks are overwrites the file system can run in parallel. Default on.
    pub preallocate: bool,
    /// Rings kept per open file for reuse by later transfers (threads transferring at once
    /// each use their own ring). Default 4.
    pub max_idle_rings: usize,
}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig {
            queue_depth: 16,
            chunk_size: 2 << 20,
            sqpoll: false,
            sqpoll_idle_ms: 100,
            staging_size: 4 << 20,
            register_buffers: true,
            register_files: true,
            preallocate: true,
            max_idle_rings: 4,
        }
    }
}

impl UringConfig {
    /// The largest request the backend issues (the kernel's limit on one read is just
    /// under 2 GiB).
    pub const MAX_CHUNK: usize = 1 << 30;

    /// The queue depth actually used: at least 1, at most 4096.
    pub(crate) fn effective_queue_depth(&self) -> u32 {
        self.queue_depth.clamp(1, 4096)
    }

    /// The chunk size rounded up to `block` (a power of two), within `block..=MAX_CHUNK`.
    pub(crate) fn effective_chunk(&self, block: u64) -> usize {
        let block = block as usize;
        let chunk = self.chunk_size.clamp(block, Self::MAX_CHUNK);
        chunk.div_ceil(block) * block
    }

    /// The staging size: at least one chunk and two blocks, a multiple of `block`.
    pub(crate) fn effective_staging(&self, block: u64) -> usize {
        let blk = block as usize;
        let size = self
            .staging_size
            .max(self.effective_chunk(block))
            .max(2 * blk);
        size.div_ceil(blk) * blk
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_values_are_sane() {
        let c = UringConfig {
            queue_depth: 0,
            chunk_size: 1000,
            staging_size: 0,
            ..UringConfig::default()
        };
        assert_eq!(c.effective_queue_depth(), 1);
        assert_eq!(c.effective_chunk(4096), 4096);
        assert_eq!(c.effective_staging(4096), 8192);
        let d = UringConfig::default();
        assert_eq!(d.effective_chunk(4096), 2 << 20);
        assert_eq!(d.effective_staging(4096), 4 << 20);
    }
}
