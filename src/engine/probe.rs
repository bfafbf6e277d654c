//! Cheap facts about a transfer before it runs: page-cache residency, and the real clock.

use fastensor_core::CacheState;
use fastensor_select::{Clock, ClockReading};
use std::fs::File;
use std::time::{Duration, Instant};

/// Whether the bytes of `offset..offset + len` are in the page cache: `Cached` when every
/// page is, `Cold` when any page must come from the device. Asked without reading anything
/// (`cachestat`, or `mincore` on older kernels), so the question starts no readahead that
/// would compete with a direct read of the same bytes. Pages still being read ahead count
/// as present there, so a range found present is confirmed by a one-byte non-blocking read
/// of its last page (the one most likely still in flight; present, so this read starts no
/// readahead of its own): without it, a stream read through the page cache found the pages
/// its own readahead had asked for "cached", and stayed keyed cached while it read from the
/// device. `Unknown` without the POSIX helpers.
pub(crate) fn cache_state(file: &File, offset: u64, len: usize) -> CacheState {
    #[cfg(feature = "posix")]
    return match fastensor_posix::sys::cached_pages(file, offset, len as u64) {
        Some((cached, pages)) if cached >= pages => {
            let last = offset + (len.max(1) - 1) as u64;
            match fastensor_posix::sys::page_ready(file, last) {
                Some(false) => CacheState::Cold,
                _ => CacheState::Cached,
            }
        }
        Some(_) => CacheState::Cold,
        None => CacheState::Unknown,
    };
    #[cfg(not(feature = "posix"))]
    {
        let _ = (file, offset, len);
        CacheState::Unknown
    }
}

/// The real clock: monotonic wall time and the process's CPU time (all threads, so the
/// helper threads of parallel backends count).
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose wall time starts now.
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn wall(&self) -> Duration {
        self.origin.elapsed()
    }

    fn now(&self) -> ClockReading {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        ClockReading {
            wall: self.origin.elapsed(),
            cpu: Duration::new(
                ts.tv_sec.max(0) as u64,
                ts.tv_nsec.clamp(0, 999_999_999) as u32,
            ),
        }
    }
}

/// Drops the page cache of the file at `path` (after writing back its dirty pages), so the
/// next read of it comes from the device.
pub fn evict(path: &std::path::Path) -> fastensor_core::Result<()> {
    let err = |e: std::io::Error| {
        fastensor_core::Error::io(e, "cannot drop the page cache").with_path(path)
    };
    let file = File::open(path).map_err(err)?;
    rustix::fs::fdatasync(&file).map_err(|e| err(e.into()))?;
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).map_err(|e| err(e.into()))?;
    Ok(())
}
