//! Cheap facts about a transfer before it runs: page-cache residency, and the real clock.

use fastensor_core::CacheState;
use fastensor_core::{Clock, ClockReading};
use std::fs::File;
use std::time::{Duration, Instant};

/// Whether the bytes of `offset..offset + len` are in the page cache: `Cached` when every
/// page is, `Cold` when any page must come from the device. Asked without reading anything
/// (`cachestat`, or `mincore` on older kernels), so the question starts no readahead that
/// would compete with a direct read of the same bytes. Pages still being read ahead count
/// as present there, so a range found present is confirmed by a one-byte non-blocking read
/// of its last page (the one most likely still in flight; present, so this read starts no
/// readahead of its own), so that a stream read through the page cache is not keyed cached
/// while its own readahead is still reading from the device. `Unknown` where the kernel
/// answers neither.
pub(crate) fn cache_state(file: &File, offset: u64, len: usize) -> CacheState {
    match fastensor_sys::cached_pages(file, offset, len as u64) {
        Some((cached, pages)) if cached >= pages => {
            let last = offset + (len.max(1) - 1) as u64;
            match fastensor_sys::page_ready(file, last) {
                Some(false) => CacheState::Cold,
                _ => CacheState::Cached,
            }
        }
        Some(_) => CacheState::Cold,
        None => CacheState::Unknown,
    }
}

/// Whether every byte of `range` is in the page cache, as [`cache_state`] tells; `None` when
/// that cannot be told (the range runs past the end of the file, or no POSIX helpers).
pub(crate) fn cached_range(file: &File, range: std::ops::Range<u64>) -> Option<bool> {
    if range.end > file.metadata().ok()?.len() {
        return None;
    }
    let len = usize::try_from(range.end.checked_sub(range.start)?).ok()?;
    match cache_state(file, range.start, len) {
        CacheState::Cached => Some(true),
        CacheState::Cold => Some(false),
        CacheState::Unknown => None,
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

#[cfg(all(test, feature = "posix"))]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_range_is_cached_not_cached_or_past_the_end() {
        const MIB: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![7u8; (48 * MIB) as usize]).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let f = File::open(&path).unwrap();
        // Read all of it (cached), then drop the pages from 32 MiB on.
        let mut buf = vec![0u8; MIB as usize];
        for i in 0..48 {
            rustix::io::pread(&f, &mut buf, i * MIB).unwrap();
        }
        assert_eq!(cached_range(&f, 47 * MIB..49 * MIB), None);
        let mut dropped = false;
        for _ in 0..5 {
            rustix::fs::fadvise(&f, 32 * MIB, None, rustix::fs::Advice::DontNeed).unwrap();
            if cached_range(&f, 40 * MIB..41 * MIB) == Some(false) {
                dropped = true;
                break;
            }
        }
        // tmpfs and overlay file systems cannot drop their pages.
        let fs = rustix::fs::fstatfs(&f).unwrap().f_type as i64;
        const TMPFS: i64 = 0x0102_1994;
        const OVERLAYFS: i64 = 0x794c_7630;
        if !dropped {
            assert!(
                fs == TMPFS || fs == OVERLAYFS,
                "pages not dropped (fs {fs:#x})"
            );
            return;
        }
        assert_eq!(cached_range(&f, 0..MIB), Some(true));
        assert_eq!(cached_range(&f, 31 * MIB..33 * MIB), Some(false));
    }
}
