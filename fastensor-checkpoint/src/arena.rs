//! The memory a checkpoint is loaded into.

use crate::{Error, ErrorKind, HostBuffer, Result};
use fastensor_core::debug_fields;
use fastensor_sys::filemap::{FileMap, Protection};
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
/// the arena (removing or renaming over the path changes nothing). What another program
/// writing the file in place or truncating it does is the arena's [`Placement`]: with a
/// read lease ([`Placement::Leased`]) the pages of the loaded tensors are moved into memory
/// of the process before that program's call goes on, and keep their bytes; without one
/// ([`Placement::Unprotected`], opt-in) the change shows through pages not yet written and
/// a truncated page raises `SIGBUS` when read. Bytes of the mapping outside the loaded
/// tensors (and the header's page) are not guarded.
pub struct Arena {
    mem: Memory,
}

enum Memory {
    Owned(HostBuffer),
    Mapped(FileMap),
}

/// Where a checkpoint's bytes live, and what a change another program makes to its file
/// does to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Memory of the arena's own, read into: the file is not involved.
    Read,
    /// The file mapped copy-on-write under a read lease: the tensors share the page
    /// cache's pages until someone opens the file for writing or truncates it, which waits
    /// until their pages are moved into memory of the process.
    Leased,
    /// The file was mapped under a lease that was broken since: the tensors' pages were
    /// moved into memory of the process; the file is not involved any more.
    Moved,
    /// The file mapped with no lease (opt-in, where none could be had): the file
    /// rewritten in place shows through pages not yet written, and a truncated page raises
    /// `SIGBUS` when read.
    Unprotected,
}

impl Placement {
    /// Its name: `read`, `leased`, `moved` or `unprotected`.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Read => "read",
            Placement::Leased => "leased",
            Placement::Moved => "moved",
            Placement::Unprotected => "unprotected",
        }
    }
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
    pub(crate) fn mapped(map: FileMap) -> Arena {
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

    /// Where the arena's bytes live now (see [`Placement`]).
    pub fn placement(&self) -> Placement {
        match &self.mem {
            Memory::Owned(_) => Placement::Read,
            Memory::Mapped(m) => match m.protection() {
                Protection::Leased => Placement::Leased,
                Protection::Moved => Placement::Moved,
                Protection::Unprotected => Placement::Unprotected,
            },
        }
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

debug_fields!(Arena, "Arena", |s| { ptr: s.as_ptr(), len: s.len(), placement: s.placement() });
