//! A private mapping of a file, and what keeps the memory it hands out from changes to the
//! file: a read lease ([`crate::lease`]), or nothing.

use crate::lease::{Lease, Outcome, Phase};
use std::fs::File;
use std::io;
use std::ops::{Deref, DerefMut, Range};

/// Bytes of a page: the unit guarded memory is rounded out to.
const PAGE: usize = 4096;

/// A private (copy-on-write) mapping of the first bytes of a file, readable and writable:
/// this process's writes stay its own. See [`Protection`] for what a change to the file
/// does to it.
#[derive(Debug)]
pub struct FileMap {
    /// Dropped before the mapping: a break being answered finishes first.
    lease: Option<Lease>,
    map: memmap2::MmapMut,
}

/// What a change another program makes to a mapped file does to the mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// A read lease is held: the guarded memory shares its clean pages with the page cache
    /// until someone opens the file for writing or truncates it; then it is moved into
    /// anonymous memory first, and nothing done to the file reaches it.
    Leased,
    /// The lease was broken, and the guarded memory moved: nothing done to the file
    /// reaches it.
    Moved,
    /// No lease (or the memory could not be moved on a break, or its move ended after the
    /// kernel let the writer go, or this is a `fork` child with no lease of its own for
    /// it): the file rewritten in place
    /// shows through pages this process has not written, and a truncation takes away every
    /// page past the new end (a read of one raises `SIGBUS`).
    Unprotected,
}

impl FileMap {
    /// Maps the first `len` bytes of `file` privately, with no lease.
    pub fn unprotected(file: &File, len: usize) -> io::Result<FileMap> {
        Ok(FileMap {
            lease: None,
            map: map_private(file, len)?,
        })
    }

    /// Maps the first `len` bytes of `file` privately, guarded by `lease` (taken on the
    /// same file): the pages of the mapping holding the bytes at the offsets `guarded`
    /// (rounded out to whole pages) are moved into anonymous memory when the lease is
    /// broken, before the writer goes on. `None` when the lease was broken before the
    /// mapping was guarded: the file may have changed since it was read (read it again).
    pub fn leased(
        file: &File,
        len: usize,
        lease: Lease,
        guarded: &[Range<u64>],
    ) -> io::Result<Option<FileMap>> {
        let map = map_private(file, len)?;
        let base = map.as_ptr() as usize;
        let end = len.div_ceil(PAGE) * PAGE;
        let ranges = guarded
            .iter()
            .filter(|r| r.end > r.start)
            .map(|r| {
                let start = (r.start as usize).min(end) / PAGE * PAGE;
                let stop = (r.end as usize)
                    .div_ceil(PAGE)
                    .saturating_mul(PAGE)
                    .min(end);
                base + start..base + stop
            })
            .filter(|r| r.end > r.start)
            .collect();
        if !lease.guard(ranges) {
            return Ok(None);
        }
        Ok(Some(FileMap {
            lease: Some(lease),
            map,
        }))
    }

    /// What a change to the file does to this mapping now.
    pub fn protection(&self) -> Protection {
        match self.lease.as_ref().map(Lease::phase) {
            Some(Phase::Held) => Protection::Leased,
            Some(Phase::Broken(Outcome::Moved)) => Protection::Moved,
            _ => Protection::Unprotected,
        }
    }
}

/// The first `len` bytes of `file` mapped privately (see [`crate::populate::map_private`]).
fn map_private(file: &File, len: usize) -> io::Result<memmap2::MmapMut> {
    crate::populate::map_private(file, len)
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // The lease goes first: once it is let go, no break touches the mapping.
        drop(self.lease.take());
    }
}

impl Deref for FileMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl DerefMut for FileMap {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }
}
