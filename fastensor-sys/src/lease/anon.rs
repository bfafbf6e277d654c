//! Moving the memory a lease guards out of the file's mapping: into anonymous memory at
//! the same addresses.

use crate::populate::copy_out;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

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
    let pieces = len.div_ceil(PIECE);
    let done: Vec<AtomicBool> = (0..pieces).map(|_| AtomicBool::new(false)).collect();
    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<io::Error>> = Mutex::new(None);
    let work = || loop {
        if failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            return;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= pieces {
            return;
        }
        let at = i * PIECE;
        match move_piece(fresh + at, range.start + at, PIECE.min(len - at)) {
            Ok(()) => done[i].store(true, Ordering::Release),
            Err(e) => {
                failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                return;
            }
        }
    };
    // Helpers of this call's own, not the I/O pool's: threads made here inherit the signal
    // mask of the thread answering breaks, and must not outlive the call.
    std::thread::scope(|s| {
        for _ in 1..THREADS.min(pieces) {
            let _ = std::thread::Builder::new().spawn_scoped(s, work);
        }
        work();
    });
    for (i, moved) in done.iter().enumerate() {
        if !moved.load(Ordering::Acquire) {
            let at = i * PIECE;
            // SAFETY: a piece of the new mapping that was not moved: still this call's
            // alone (a moved piece's old addresses may hold another mapping by now, and
            // are never unmapped here).
            unsafe { libc::munmap((fresh + at) as *mut libc::c_void, PIECE.min(len - at)) };
        }
    }
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Moves the `n` bytes at `to` (memory of the caller's mapping) into the piece of fresh
/// anonymous memory at `piece` (not moved yet, referred to by this call alone): faulted in,
/// filled with the bytes at `to` through the kernel, then `mremap`ed over `to`.
fn move_piece(piece: usize, to: usize, n: usize) -> io::Result<()> {
    // Faulted in first, in one call (cheaper than a fault per page during the copy).
    populate_write(piece, n)?;
    // SAFETY: `piece .. piece + n` is memory of the fresh mapping that only this call
    // refers to.
    let dst = unsafe { std::slice::from_raw_parts_mut(piece as *mut u8, n) };
    copy_out(to as *const u8, dst)?;
    // SAFETY: moves the piece over `to .. to + n`, memory of the caller's mapping whose
    // contents it now holds; `MREMAP_FIXED` unmaps what was there in the same step, so no
    // access to the range ever finds it unmapped.
    let p = unsafe {
        libc::mremap(
            piece as *mut libc::c_void,
            n,
            n,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            to as *mut libc::c_void,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
