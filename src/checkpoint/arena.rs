//! The memory a checkpoint is loaded into.

use crate::{Error, ErrorKind, HostBuffer, Result};
use std::fmt;
use std::ops::{Deref, DerefMut};

/// Page-aligned, zero-initialised memory holding a loaded checkpoint's bytes.
///
/// It is a [`HostBuffer`]: from 1 MiB on an anonymous mapping whose pages the kernel zeroes
/// lazily as the reads fill them (an aligned heap allocation is zeroed up front by the CPU,
/// which costs as much time as reading the data from a fast disk), and from 2 MiB on backed
/// by transparent huge pages, which lets direct reads fill it in 4 MiB device requests (see
/// [`HostBuffer`] for what faulting it in costs).
pub struct Arena {
    buf: HostBuffer,
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
        Ok(Arena { buf })
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
        &self.buf
    }
}

impl DerefMut for Arena {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("ptr", &self.as_ptr())
            .field("len", &self.len())
            .finish()
    }
}
