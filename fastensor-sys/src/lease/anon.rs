//! Moving the memory a lease guards out of the file's mapping: into anonymous memory at
//! the same addresses.

use crate::populate::copy_out;
use fastensor_core::parallel;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes copied and swapped in at a time: a write of another thread to a piece while it is
/// copied may be lost, so pieces are small.
const PIECE: usize = 2 << 20;

/// Threads that copy (the caller's included).
const THREADS: usize = 4;

/// Moves the memory of `ranges` (page-aligned address ranges of a private file mapping of
/// this process, which the caller keeps mapped for the call) into anonymous memory at the
/// same addresses, with the same contents, readable and writable: the pages no longer
/// belong to the file's mapping, so nothing done to the file reaches them. Returns the
/// bytes moved; on an error the ranges' pieces not moved yet stay as they were.
pub(crate) fn move_ranges(ranges: &[Range<usize>]) -> io::Result<u64> {
    let mut moved = 0;
    for r in ranges.iter().filter(|r| r.end > r.start) {
        move_range(r.clone())?;
        moved += (r.end - r.start) as u64;
    }
    Ok(moved)
}

/// [`move_ranges`] of one range: a fresh anonymous mapping as long as the range, filled
/// [`PIECE`] by piece through the kernel (a page the file lost is an error, not a signal)
/// and each piece `mremap`ed over its place at once (which replaces the old pages
/// atomically; the pieces of one mapping join again into one).
fn move_range(range: Range<usize>) -> io::Result<()> {
    let len = range.end - range.start;
    // SAFETY: a new anonymous mapping at an address the kernel picks; nothing else refers
    // to it.
    let fresh = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if fresh == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let fresh = fresh as usize;
    let pieces: Vec<(usize, usize)> = (0..len).step_by(PIECE).enumerate().collect();
    let done: Vec<AtomicBool> = pieces.iter().map(|_| AtomicBool::new(false)).collect();
    let result = parallel::for_each(pieces.clone(), THREADS, |(i, at)| {
        let n = PIECE.min(len - at);
        let failed = |e: io::Error| fastensor_core::Error::io(e, "cannot move a leased piece");
        // Faulted in first, in one call (cheaper than a fault per page during the copy).
        populate_write(fresh + at, n).map_err(failed)?;
        // SAFETY: `fresh + at .. + n` is a piece of the new mapping not moved yet, which
        // only this call refers to.
        let dst = unsafe { std::slice::from_raw_parts_mut((fresh + at) as *mut u8, n) };
        copy_out((range.start + at) as *const u8, dst).map_err(failed)?;
        // SAFETY: moves the piece over `range.start + at .. + n`, memory of the caller's
        // mapping whose contents it now holds; `MREMAP_FIXED` unmaps what was there in the
        // same step, so no access to the range ever finds it unmapped.
        let p = unsafe {
            libc::mremap(
                (fresh + at) as *mut libc::c_void,
                n,
                n,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                (range.start + at) as *mut libc::c_void,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(failed(io::Error::last_os_error()));
        }
        done[i].store(true, Ordering::Release);
        Ok(())
    });
    for (i, at) in pieces {
        if !done[i].load(Ordering::Acquire) {
            // SAFETY: a piece of the new mapping that was not moved: still this call's
            // alone (a moved piece's old addresses may hold another mapping by now, and
            // are never unmapped here).
            unsafe { libc::munmap((fresh + at) as *mut libc::c_void, PIECE.min(len - at)) };
        }
    }
    result.map_err(|e| io::Error::other(e.to_string()))
}

/// Faults in the `len` bytes of anonymous memory at `addr` (a piece of a mapping made by
/// [`move_range`]), writable (`MADV_POPULATE_WRITE`; where the kernel lacks it, the copy
/// faults the pages in instead).
fn populate_write(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: `madvise` only changes the page tables of the range, which lies within a
    // mapping of this process that only the caller refers to; nothing is read or written.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
    if r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
