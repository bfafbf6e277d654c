//! The memory a checkpoint is loaded into.

use crate::{Error, ErrorKind, HostBuffer, Result};
use std::ops::{Deref, DerefMut};

/// Page-aligned memory holding a loaded checkpoint's bytes: either memory of its own, or
/// a copy-on-write mapping of the checkpoint file.
///
/// Memory of its own is a [`HostBuffer`] the reads fill: from 1 MiB on an anonymous mapping
/// whose pages the kernel zeroes lazily as the reads fill them, from 2 MiB on backed by
/// transparent huge pages, which lets direct reads fill it in 4 MiB device requests (see
/// [`HostBuffer`] for what faulting it in costs).
///
/// A mapped arena is a private mapping of the whole file (`MAP_PRIVATE`): its pages are the
/// page cache's until written, then copies of their own; the file's inode lives as long as
/// the arena (removing or renaming over the path changes nothing). Writing the file in
/// place, or truncating it, while the arena lives shows through in pages not yet written
/// (a truncated page raises `SIGBUS` when read): files saved by this crate are never
/// written in place.
pub struct Arena {
    mem: Memory,
}

enum Memory {
    Owned(HostBuffer),
    Mapped(memmap2::MmapMut),
}

impl Arena {
    /// `len` zero bytes, aligned to the page size.
    pub fn new(len: usize) -> Result<Arena> {
        let buf = HostBuffer::new(len).map_err(|e| {
            Error::new(
                ErrorKind::OutOfMemory,
                format!("cannot map {len} bytes of memory for a checkpoint"),
            )
            .with_source(e)
        })?;
        Ok(Arena {
            mem: Memory::Owned(buf),
        })
    }

    /// An arena over a private mapping of a whole checkpoint file (offsets in the arena are
    /// offsets in the file).
    pub(crate) fn mapped(map: memmap2::MmapMut) -> Arena {
        Arena {
            mem: Memory::Mapped(map),
        }
    }

    /// Where the arena's memory starts (no reference to its bytes is made).
    pub fn base_ptr(&self) -> *const u8 {
        match &self.mem {
            Memory::Owned(b) => b.as_ptr(),
            Memory::Mapped(m) => m.as_ptr(),
        }
    }

    /// Whether the arena maps the checkpoint file (see [`Arena`]) rather than holding
    /// memory of its own.
    pub fn is_mapped(&self) -> bool {
        matches!(self.mem, Memory::Mapped(_))
    }
}

/// Faults in fresh memory: writes one byte of every 4 KiB page of `mem` (where the kernel
/// backs a page only when it is first touched, so that a read into it does not stall on the
/// faults).
pub(crate) fn fault_in(mem: &mut [u8]) {
    for i in (0..mem.len()).step_by(4096) {
        mem[i] = 0;
    }
    // The stores must happen even when nothing reads the memory afterwards.
    std::hint::black_box(mem);
}

impl Deref for Arena {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.mem {
            Memory::Owned(b) => b,
            Memory::Mapped(m) => m,
        }
    }
}

impl DerefMut for Arena {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            Memory::Owned(b) => b,
            Memory::Mapped(m) => m,
        }
    }
}

debug_fields!(Arena, "Arena", |s| { ptr: s.as_ptr(), len: s.len(), mapped: s.is_mapped() });
