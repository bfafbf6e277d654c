//! The memory a checkpoint is loaded into.

use crate::{Error, ErrorKind, Result};
use std::fmt;
use std::ops::{Deref, DerefMut};

/// Page-aligned, zero-initialised memory holding a loaded checkpoint's bytes.
///
/// It is an anonymous memory map rather than a heap allocation: its pages are zeroed lazily
/// by the kernel as the reads fill them, whereas an aligned heap allocation is zeroed up
/// front by the CPU (`alloc_zeroed` with 4096-byte alignment is `memset`), which costs as
/// much time as reading the data from a fast disk.
pub struct Arena {
    map: Option<memmap2::MmapMut>,
}

impl Arena {
    /// `len` zero bytes, aligned to the page size.
    pub fn new(len: usize) -> Result<Arena> {
        if len == 0 {
            return Ok(Arena { map: None });
        }
        let map = memmap2::MmapMut::map_anon(len).map_err(|e| {
            Error::new(
                ErrorKind::OutOfMemory,
                format!("cannot map {len} bytes of memory for a checkpoint"),
            )
            .with_source(e)
        })?;
        Ok(Arena { map: Some(map) })
    }
}

impl Deref for Arena {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl DerefMut for Arena {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or(&mut [])
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
