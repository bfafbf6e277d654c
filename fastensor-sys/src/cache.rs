//! The page cache: what of a file it holds, dropping it, asking it to read ahead, and each
//! device's readahead window.

use fastensor_core::{Error, Result};
use std::fs::File;
use std::path::Path;

/// Drops the page cache of `file`'s bytes (after writing back dirty pages), so the next read
/// comes from the device.
pub fn evict_page_cache(file: &File) -> std::io::Result<()> {
    rustix::fs::fdatasync(file)?;
    rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed)?;
    Ok(())
}

/// Asks the kernel to start reading every range `(offset, len)` of `file` into the page cache
/// (`POSIX_FADV_WILLNEED`) and returns without waiting, so that the reads of a batch through
/// the page cache reach the device together instead of one after another (and a mapping's
/// page faults find their pages instead of each reading a whole readahead window around
/// itself). Ranges that continue the one before are asked for as one. Advice only: a
/// failure is ignored (the reads that follow still read the bytes).
pub fn will_need(file: &File, ranges: impl IntoIterator<Item = (u64, u64)>) {
    let advise = |(offset, len): (u64, u64)| {
        if let Some(len) = std::num::NonZeroU64::new(len) {
            let _ = rustix::fs::fadvise(file, offset, Some(len), rustix::fs::Advice::WillNeed);
        }
    };
    let mut pending: Option<(u64, u64)> = None;
    for (offset, len) in ranges {
        match &mut pending {
            Some((start, l)) if *start + *l == offset => *l += len,
            _ => {
                if let Some(p) = pending.replace((offset, len)) {
                    advise(p);
                }
            }
        }
    }
    if let Some(p) = pending {
        advise(p);
    }
}

/// The readahead window, in bytes, of the device whose number is `device` (`major:minor`,
/// as [`file_location`](crate::file_location) gives it): the `read_ahead_kb` of its backing device (the disk, for a
/// partition). `None` where sysfs does not tell (no sysfs, a file system with no backing
/// device such as tmpfs).
pub fn read_ahead_bytes(device: &str) -> Option<u64> {
    if device.is_empty() || device.contains('/') {
        return None;
    }
    [
        format!("/sys/class/bdi/{device}/read_ahead_kb"),
        format!("/sys/dev/block/{device}/queue/read_ahead_kb"),
        format!("/sys/dev/block/{device}/../queue/read_ahead_kb"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok())
    .map(|kb| kb.saturating_mul(1024))
    .filter(|&bytes| bytes > 0)
}

/// Drops the page cache of the file at `path`.
pub fn evict_path(path: &Path) -> Result<()> {
    let file = File::open(path).map_err(|e| Error::io(e, "cannot open").with_path(path))?;
    evict_page_cache(&file).map_err(|e| Error::io(e, "cannot drop the page cache").with_path(path))
}

/// How many of the pages under `offset..offset + len` are in the page cache, as
/// `(cached, pages)`, found without reading anything and without starting readahead: the
/// `cachestat` system call (Linux 6.5), or `mincore` over a temporary mapping on older
/// kernels. `None` when neither works (or `len` is 0).
pub fn cached_pages(file: &File, offset: u64, len: u64) -> Option<(u64, u64)> {
    if len == 0 {
        return None;
    }
    let page = page_size();
    let first = offset / page;
    let end = offset.checked_add(len)?.div_ceil(page);
    let pages = end - first;
    let cached = cachestat(file, first * page, pages * page).or_else(|| {
        mincore_pages(
            file,
            first * page,
            usize::try_from(pages * page).ok()?,
            page,
        )
    })?;
    Some((cached.min(pages), pages))
}

/// Whether the page holding `offset` can be read from the page cache without waiting: a
/// one-byte `preadv2(RWF_NOWAIT)`, which fails with `EAGAIN` on a page still being read from
/// the device (readahead in flight: [`cached_pages`] counts such a page as cached). Meant for
/// a page known to be present: on a missing one the call would start a readahead. `None`
/// when the kernel cannot tell.
pub fn page_ready(file: &File, offset: u64) -> Option<bool> {
    let mut byte = [0u8; 1];
    match rustix::io::preadv2(
        file,
        &mut [std::io::IoSliceMut::new(&mut byte)],
        offset,
        rustix::io::ReadWriteFlags::NOWAIT,
    ) {
        Ok(_) => Some(true),
        Err(rustix::io::Errno::AGAIN) => Some(false),
        Err(_) => None,
    }
}

/// The kernel's page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the running system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// Cached pages of a page-aligned range through `cachestat(2)`; `None` where the kernel
/// lacks it.
fn cachestat(file: &File, offset: u64, len: u64) -> Option<u64> {
    #[cfg(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    ))]
    {
        use std::os::fd::AsRawFd;
        /// `cachestat`'s number in the unified system call table.
        const SYS_CACHESTAT: libc::c_long = 451;
        #[repr(C)]
        struct Range {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Stat {
            nr_cache: u64,
            nr_dirty: u64,
            nr_writeback: u64,
            nr_evicted: u64,
            nr_recently_evicted: u64,
        }
        let range = Range { off: offset, len };
        let mut stat = Stat::default();
        // SAFETY: the descriptor is open for the lifetime of `file`; `range` and `stat` are
        // live, properly laid out (`repr(C)`, the kernel's structs) and `stat` is writable.
        let rc = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                file.as_raw_fd(),
                &range as *const Range,
                &mut stat as *mut Stat,
                0u32,
            )
        };
        (rc == 0).then_some(stat.nr_cache)
    }
    #[cfg(not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )))]
    {
        let _ = (file, offset, len);
        None
    }
}

/// Cached pages of a page-aligned range through `mincore(2)` over a read-only mapping of
/// it (mapping a file reads nothing).
pub(crate) fn mincore_pages(file: &File, offset: u64, len: usize, page: u64) -> Option<u64> {
    // SAFETY: a private read-only mapping that is never read through; the file changing
    // under it cannot cause undefined behaviour because no byte of it is accessed.
    let map = unsafe {
        memmap2::MmapOptions::new()
            .offset(offset)
            .len(len)
            .map(file)
            .ok()?
    };
    let mut vec = vec![0u8; len.div_ceil(page as usize)];
    // SAFETY: the mapping covers `len` bytes from its page-aligned start; `vec` holds one
    // byte per page of it, as mincore requires.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    (rc == 0).then(|| vec.iter().filter(|&&b| b & 1 == 1).count() as u64)
}
