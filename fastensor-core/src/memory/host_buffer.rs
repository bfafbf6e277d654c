//! The page-aligned [`HostBuffer`].

use super::{MemMut, MemRef, PAGE_ALIGN};
use crate::{Error, ErrorKind, Result};
use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A zero-initialised host buffer whose start is aligned to [`PAGE_ALIGN`] (or more), so
/// direct I/O can read into it and write from it with no copy.
pub struct HostBuffer {
    /// The aligned start.
    ptr: NonNull<u8>,
    len: usize,
    /// The allocation and the alignment asked for; `None` for an empty buffer.
    alloc: Option<(Allocation, usize)>,
}

/// Where a [`HostBuffer`]'s bytes come from.
#[derive(Clone, Copy)]
enum Allocation {
    /// The global allocator (small buffers): its start and layout.
    Heap(NonNull<u8>, Layout),
    /// An anonymous mapping of its own (large buffers): its start and length.
    Mapped(NonNull<u8>, usize),
}

/// From this size on, a buffer is an anonymous mapping of its own: the kernel hands out
/// fresh zero pages lazily (an aligned zeroed heap allocation clears memory with `memset`,
/// which costs as much as filling the buffer from a fast disk).
const LAZY_ZERO_THRESHOLD: usize = 1 << 20;

/// The size of a transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// From this size on, a mapped buffer starts on a [`HUGE_PAGE`] boundary and asks for
/// transparent huge pages (`MADV_HUGEPAGE`) over the whole huge pages it spans; a tail shorter
/// than a huge page keeps 4 KiB pages (a huge page there would make a buffer of 2 MiB + 4 KiB
/// hold 4 MiB, and zero it). Physically contiguous 2 MiB pieces let the block
/// layer build direct-I/O requests of up to `max_sectors_kb` instead of the few hundred KiB
/// that `max_segments` scattered 4 KiB pages allow, and take fewer page faults to fault in
/// (figures: `docs/lab/io-paths.md`, "Memory for direct I/O: huge pages"). Where huge
/// pages are disabled the hint is ignored.
const HUGE_PAGE_THRESHOLD: usize = HUGE_PAGE;

// SAFETY: HostBuffer owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for HostBuffer {}
// SAFETY: shared access only reads through &self, like Vec<u8>.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// A zeroed buffer of `len` bytes aligned to [`PAGE_ALIGN`].
    pub fn new(len: usize) -> Result<Self> {
        Self::with_alignment(len, PAGE_ALIGN)
    }

    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two).
    pub fn with_alignment(len: usize, align: usize) -> Result<Self> {
        if !align.is_power_of_two() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("buffer alignment {align} is not a power of two"),
            ));
        }
        if len == 0 {
            // A dangling but aligned pointer: valid for zero-length slices.
            let ptr = NonNull::new(align as *mut u8).expect("align is non-zero");
            return Ok(HostBuffer {
                ptr,
                len,
                alloc: None,
            });
        }
        let too_large = || {
            Error::new(
                ErrorKind::InvalidInput,
                format!("cannot allocate {len} bytes aligned to {align}"),
            )
        };
        if len >= LAZY_ZERO_THRESHOLD {
            return Self::mapped(len, align);
        }
        let layout = Layout::from_size_align(len, align).map_err(|_| too_large())?;
        // SAFETY: layout has a non-zero size (len > 0).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::new(
                ErrorKind::OutOfMemory,
                format!("cannot allocate a host buffer of {len} bytes"),
            )
        })?;
        Ok(HostBuffer {
            ptr,
            len,
            alloc: Some((Allocation::Heap(ptr, layout), align)),
        })
    }

    /// A large buffer in an anonymous mapping of its own, aligned to `align` (and to a huge
    /// page from [`HUGE_PAGE_THRESHOLD`] on, with the huge-page hint).
    fn mapped(len: usize, align: usize) -> Result<Self> {
        let huge = len >= HUGE_PAGE_THRESHOLD;
        let start_align = if huge { align.max(HUGE_PAGE) } else { align };
        let map_len = len
            .checked_next_multiple_of(PAGE_ALIGN)
            .and_then(|b| b.checked_add(start_align.saturating_sub(PAGE_ALIGN)))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!("cannot allocate {len} bytes aligned to {align}"),
                )
            })?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let raw = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                map_len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }
        .map_err(|e| {
            Error::new(
                ErrorKind::OutOfMemory,
                format!("cannot map a host buffer of {len} bytes: {e}"),
            )
        })?;
        let base = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| Error::new(ErrorKind::OutOfMemory, "mmap returned a null mapping"))?;
        let offset = (start_align - (raw as usize) % start_align) % start_align;
        // SAFETY: mmap returns page-aligned memory, so offset <= start_align - PAGE_ALIGN and
        // base + offset .. + len lies inside the map_len bytes mapped.
        let ptr = unsafe { NonNull::new_unchecked(base.as_ptr().add(offset)) };
        // The slack on either side of the aligned start goes back: the buffer's mapping is
        // exactly its pages, so no huge page can form outside them.
        let body = len.next_multiple_of(PAGE_ALIGN);
        let after = map_len - offset - body;
        // SAFETY: base..ptr and ptr + body..base + map_len are page-aligned parts of the
        // mapping made above that no one else refers to; unmapping them leaves the buffer's
        // own pages mapped. A failure leaves them mapped (and unmapped with the rest later
        // only as far as `body` goes), which wastes address space, not memory in use.
        unsafe {
            if offset > 0 {
                let _ = rustix::mm::munmap(base.as_ptr().cast(), offset);
            }
            if after > 0 {
                let _ = rustix::mm::munmap(ptr.as_ptr().add(body).cast(), after);
            }
        }
        if huge {
            let whole = len - len % HUGE_PAGE;
            // SAFETY: ptr..ptr + whole lies inside the mapping made above, which this buffer
            // owns; the advice changes how pages are backed, never their contents. A refusal
            // (huge pages disabled) leaves ordinary pages, which is fine.
            let _ = unsafe {
                rustix::mm::madvise(
                    ptr.as_ptr().cast(),
                    whole,
                    rustix::mm::Advice::LinuxHugepage,
                )
            };
        }
        Ok(HostBuffer {
            ptr,
            len,
            alloc: Some((Allocation::Mapped(ptr, body), align)),
        })
    }

    /// A zeroed buffer of `len` bytes (page-aligned) in an anonymous mapping of its own,
    /// whatever its size: its pages are faulted in on first use, and the mapping can be
    /// moved into another mapping whole ([`HostBuffer::take_pages`]) or split
    /// ([`HostBuffer::split_off`]). From 2 MiB (a huge page) on it starts on a huge page
    /// and asks for transparent huge pages, as large buffers do.
    pub fn mapped_pages(len: usize) -> Result<Self> {
        if len == 0 {
            return Self::new(0);
        }
        Self::mapped(len, PAGE_ALIGN)
    }

    /// The bytes this buffer maps (its length rounded up to whole pages) when it is an
    /// anonymous mapping of its own, else `None`.
    pub fn mapped_len(&self) -> Option<usize> {
        match self.alloc {
            Some((Allocation::Mapped(_, body), _)) => Some(body),
            _ => None,
        }
    }

    /// The buffer at the whole length of its mapping (undoes [`HostBuffer::truncate`]); other
    /// buffers come back as they are.
    pub fn whole(mut self) -> HostBuffer {
        if let Some(body) = self.mapped_len() {
            self.len = body;
        }
        self
    }

    /// Splits a buffer that is a mapping of its own at byte `at` (a multiple of
    /// [`PAGE_ALIGN`] inside the mapping): this buffer keeps the pages before `at`, the
    /// buffer returned owns the ones from `at` on. Nothing is unmapped or moved. `None` (and
    /// nothing changed) for other buffers or positions.
    pub fn split_off(&mut self, at: usize) -> Option<HostBuffer> {
        let body = self.mapped_len()?;
        if at == 0 || at >= body || !at.is_multiple_of(PAGE_ALIGN) {
            return None;
        }
        // SAFETY: `at < body`, so the pointer stays inside this buffer's own mapping.
        let tail = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(at)) };
        self.alloc = Some((Allocation::Mapped(self.ptr, at), PAGE_ALIGN));
        self.len = self.len.min(at);
        Some(HostBuffer {
            ptr: tail,
            len: body - at,
            alloc: Some((Allocation::Mapped(tail, body - at), PAGE_ALIGN)),
        })
    }

    /// Moves the pages at the start of `src` into this buffer from byte `at` on (`mremap`):
    /// the memory changes address with its physical pages and contents, so nothing is
    /// copied or faulted in again, and this buffer's pages there are dropped. As many pages
    /// move as fit before the end of this buffer's mapping. Returns the rest of `src` (its
    /// pages that did not move) as a buffer of its own, or `None` when all moved. Both must
    /// be mappings of their own ([`HostBuffer::mapped_len`]) and `at` a multiple of
    /// [`PAGE_ALIGN`] inside this one; otherwise, or when the kernel refuses (too many
    /// mappings, say), `src` comes back whole as the error.
    pub fn take_pages(
        &mut self,
        at: usize,
        src: HostBuffer,
    ) -> std::result::Result<Option<HostBuffer>, HostBuffer> {
        let (Some(room), Some(have)) = (self.mapped_len(), src.mapped_len()) else {
            return Err(src);
        };
        if !at.is_multiple_of(PAGE_ALIGN) || at >= room {
            return Err(src);
        }
        let n = have.min(room - at);
        // SAFETY: `src.ptr..+n` is the start of `src`'s own mapping and `self.ptr + at..+n`
        // lies inside this buffer's own mapping (n <= room - at); both are page-aligned
        // with a page-multiple length, and both buffers are held exclusively here (`src` by
        // value, `self` by `&mut`), so no reference into either range is in use. The moved
        // pages leave `src`'s range unmapped: `src` gives up that part below.
        let moved = unsafe {
            rustix::mm::mremap_fixed(
                src.ptr.as_ptr().cast(),
                n,
                n,
                rustix::mm::MremapFlags::MAYMOVE,
                self.ptr.as_ptr().add(at).cast(),
            )
        };
        if moved.is_err() {
            return Err(src);
        }
        let rest = have - n;
        let base = src.ptr;
        std::mem::forget(src);
        if rest == 0 {
            return Ok(None);
        }
        // SAFETY: base + n..base + have is the part of `src`'s mapping that did not move:
        // still mapped, and owned by no one since `src` was forgotten.
        let ptr = unsafe { NonNull::new_unchecked(base.as_ptr().add(n)) };
        Ok(Some(HostBuffer {
            ptr,
            len: rest,
            alloc: Some((Allocation::Mapped(ptr, rest), PAGE_ALIGN)),
        }))
    }

    /// Shortens the buffer to its first `len` bytes (no more than it holds); its memory
    /// stays whole (a mapping keeps all its pages, [`HostBuffer::mapped_len`]).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Result<Self> {
        let mut buf = Self::new(data.len())?;
        buf.copy_from_slice(data);
        Ok(buf)
    }

    /// Where the bytes start (no reference to them is made: the memory may be in use
    /// elsewhere through pointers the caller handed out).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer as a transfer source.
    pub fn as_mem(&self) -> MemRef<'_> {
        MemRef::Host(self)
    }

    /// The buffer as a transfer destination.
    pub fn as_mem_mut(&mut self) -> MemMut<'_> {
        MemMut::Host(self)
    }
}

impl Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes owned by self, or
        // dangling-but-aligned with len 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        match self.alloc {
            Some((Allocation::Heap(base, layout), _)) => {
                // SAFETY: base was returned by alloc_zeroed with exactly this layout.
                unsafe { alloc::dealloc(base.as_ptr(), layout) }
            }
            Some((Allocation::Mapped(base, map_len), _)) => {
                // SAFETY: base..base + map_len is the mapping this buffer made and owns; no
                // borrow of it outlives self.
                let _ = unsafe { rustix::mm::munmap(base.as_ptr().cast(), map_len) };
            }
            None => {}
        }
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl Clone for HostBuffer {
    fn clone(&self) -> Self {
        let align = self.alloc.map_or(PAGE_ALIGN, |(_, a)| a);
        let mut copy = HostBuffer::with_alignment(self.len, align)
            .unwrap_or_else(|e| panic!("cloning a host buffer: {e}"));
        copy.copy_from_slice(self);
        copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffer_is_page_aligned_and_zeroed() {
        for len in [0, 1, 4095, 4096, (1 << 20) - 1, 1 << 20, (8 << 20) + 3] {
            let buf = HostBuffer::new(len).unwrap();
            assert_eq!(buf.as_ptr() as usize % PAGE_ALIGN, 0);
            assert_eq!(buf.len(), len);
            assert!(buf.iter().all(|&b| b == 0));
        }
        assert!(HostBuffer::with_alignment(10, 3).is_err());
        let big = HostBuffer::with_alignment(3 << 20, 1 << 16).unwrap();
        assert_eq!(big.as_ptr() as usize % (1 << 16), 0);
        assert!(big.iter().step_by(4093).all(|&b| b == 0));
        let copy = big.clone();
        assert_eq!(copy.as_ptr() as usize % (1 << 16), 0);
    }

    /// Resident bytes of the mappings that overlap `[start, start + len)` (`/proc/self/smaps`).
    fn resident_bytes(start: usize, len: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut total = 0;
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a < start + len && start < b;
                    continue;
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("Rss:") {
                    total += kb
                        .trim()
                        .trim_end_matches(" kB")
                        .trim()
                        .parse::<u64>()
                        .unwrap()
                        << 10;
                }
            }
        }
        total
    }

    #[test]
    fn pages_move_between_mapped_buffers_and_split_in_place() {
        const P: usize = PAGE_ALIGN;
        let mut src = HostBuffer::mapped_pages(5 * P).unwrap();
        src.fill(7);
        let mut dst = HostBuffer::mapped_pages(3 * P).unwrap();
        // Two pages fit from byte P on: they move with their bytes; three stay in `rest`.
        let rest = dst.take_pages(P, src).unwrap().unwrap();
        assert_eq!(rest.len(), 3 * P);
        assert!(rest.iter().all(|&b| b == 7));
        assert!(dst[..P].iter().all(|&b| b == 0));
        assert!(dst[P..].iter().all(|&b| b == 7));
        // Refused where it cannot be done: the source comes back whole.
        let heap = HostBuffer::new(100).unwrap();
        assert_eq!(dst.take_pages(0, heap).unwrap_err().len(), 100);
        let rest = dst.take_pages(3 * P, rest).unwrap_err();
        // A split keeps both halves' bytes; `whole` undoes a truncation.
        let mut head = rest;
        let tail = head.split_off(P).unwrap();
        assert_eq!((head.len(), tail.len()), (P, 2 * P));
        assert!(head.split_off(3).is_none());
        head.truncate(10);
        assert_eq!(head.len(), 10);
        assert_eq!(head.whole().len(), P);
        assert!(tail.iter().all(|&b| b == 7));
    }

    #[test]
    fn large_buffers_start_on_a_huge_page_and_hold_their_bytes() {
        for len in [HUGE_PAGE, HUGE_PAGE + 1, (5 << 20) + 4096, 16 << 20] {
            let mut buf = HostBuffer::new(len).unwrap();
            assert_eq!(buf.as_ptr() as usize % HUGE_PAGE, 0, "len {len}");
            assert!(buf.iter().step_by(4095).all(|&b| b == 0));
            // Every byte, including the last, is writable and reads back.
            for (i, b) in buf.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            assert!(buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
            let copy = buf.clone();
            assert_eq!(&copy[..], &buf[..]);
        }
        // A tail shorter than a huge page stays in 4 KiB pages: a buffer just over a huge
        // page, written whole, holds one huge page and its tail, not two huge pages.
        let mut over = HostBuffer::new(HUGE_PAGE + PAGE_ALIGN).unwrap();
        over.fill(1);
        let held = resident_bytes(over.as_ptr() as usize, over.len());
        assert!(
            held <= (HUGE_PAGE + PAGE_ALIGN) as u64,
            "{held} bytes resident"
        );
        // A larger alignment than a huge page is honoured too.
        let wide = HostBuffer::with_alignment(3 << 20, 8 << 20).unwrap();
        assert_eq!(wide.as_ptr() as usize % (8 << 20), 0);
        // Buffers between the mapping threshold and a huge page keep page alignment.
        let mid = HostBuffer::new(LAZY_ZERO_THRESHOLD + 5).unwrap();
        assert_eq!(mid.as_ptr() as usize % PAGE_ALIGN, 0);
        assert!(mid.iter().all(|&b| b == 0));
    }
}
