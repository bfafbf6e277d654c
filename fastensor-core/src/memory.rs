//! Memory kinds, the page-aligned [`HostBuffer`], and the borrowed views ([`MemRef`],
//! [`MemMut`]) through which every transfer names its source or destination, in host or
//! device memory alike.

use crate::{Error, ErrorKind, Result};
use std::alloc::{self, Layout};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The alignment of a [`HostBuffer`]: one page, which `O_DIRECT` accepts on every common
/// Linux file system.
pub const PAGE_ALIGN: usize = 4096;

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryKind {
    /// Ordinary (pageable or pinned) host memory.
    Host,
    /// GPU device memory on the GPU with this ordinal.
    Device {
        /// The CUDA device ordinal.
        ordinal: u32,
    },
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryKind::Host => f.write_str("host"),
            MemoryKind::Device { ordinal } => write!(f, "device:{ordinal}"),
        }
    }
}

/// A zero-initialised host buffer whose start is aligned to [`PAGE_ALIGN`] (or more), so
/// direct I/O can read into it and write from it with no copy.
pub struct HostBuffer {
    /// The aligned start.
    ptr: NonNull<u8>,
    len: usize,
    /// The allocation (its start `base`, its layout) and the alignment asked for; `None`
    /// for an empty buffer.
    alloc: Option<(NonNull<u8>, Layout, usize)>,
}

/// From this size on, buffers are over-allocated with the allocator's natural alignment and
/// aligned by hand: `calloc` then takes fresh zero pages from the kernel instead of clearing
/// memory with `memset`, which an aligned zeroed allocation always does (and which costs as
/// much as filling the buffer from a fast disk).
const LAZY_ZERO_THRESHOLD: usize = 1 << 20;

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
        let (layout, pad) = if len >= LAZY_ZERO_THRESHOLD {
            let size = len.checked_add(align - 1).ok_or_else(too_large)?;
            let natural = std::mem::align_of::<u128>();
            (
                Layout::from_size_align(size, natural).map_err(|_| too_large())?,
                true,
            )
        } else {
            (
                Layout::from_size_align(len, align).map_err(|_| too_large())?,
                false,
            )
        };
        // SAFETY: layout has a non-zero size (len > 0).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let base = NonNull::new(raw).ok_or_else(|| {
            Error::new(
                ErrorKind::OutOfMemory,
                format!("cannot allocate a host buffer of {len} bytes"),
            )
        })?;
        let offset = if pad {
            (align - (raw as usize) % align) % align
        } else {
            0
        };
        // SAFETY: offset < align and the allocation holds len + align - 1 bytes when padded
        // (offset 0 otherwise), so base + offset .. + len stays inside it.
        let ptr = unsafe { NonNull::new_unchecked(raw.add(offset)) };
        Ok(HostBuffer {
            ptr,
            len,
            alloc: Some((base, layout, align)),
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Result<Self> {
        let mut buf = Self::new(data.len())?;
        buf.copy_from_slice(data);
        Ok(buf)
    }

    /// Length in bytes.
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
        if let Some((base, layout, _)) = self.alloc {
            // SAFETY: base was returned by alloc_zeroed with exactly this layout.
            unsafe { alloc::dealloc(base.as_ptr(), layout) }
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
        let align = self.alloc.map_or(PAGE_ALIGN, |(_, _, a)| a);
        let mut copy = HostBuffer::with_alignment(self.len, align)
            .unwrap_or_else(|e| panic!("cloning a host buffer: {e}"));
        copy.copy_from_slice(self);
        copy
    }
}

/// A borrowed range of device memory that a transfer may read.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSlice<'a> {
    ptr: u64,
    len: usize,
    ordinal: u32,
    _borrow: PhantomData<&'a [u8]>,
}

impl<'a> DeviceSlice<'a> {
    /// Wraps a device pointer.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be device memory allocated on GPU `ordinal` that stays valid,
    /// at a fixed address, and is not written by anyone else for the whole lifetime `'a`.
    pub unsafe fn from_raw(ptr: u64, len: usize, ordinal: u32) -> Self {
        DeviceSlice {
            ptr,
            len,
            ordinal,
            _borrow: PhantomData,
        }
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The sub-range `start..start + len`. Panics when it is out of bounds.
    pub fn slice(&self, start: usize, len: usize) -> DeviceSlice<'a> {
        assert!(
            start.checked_add(len).is_some_and(|e| e <= self.len),
            "device slice out of range"
        );
        DeviceSlice {
            ptr: self.ptr + start as u64,
            len,
            ordinal: self.ordinal,
            _borrow: PhantomData,
        }
    }
}

/// A borrowed range of device memory that a transfer may write.
#[derive(Debug)]
pub struct DeviceSliceMut<'a> {
    ptr: u64,
    len: usize,
    ordinal: u32,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> DeviceSliceMut<'a> {
    /// Wraps a device pointer for writing.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be device memory allocated on GPU `ordinal` that stays valid,
    /// at a fixed address, and is neither read nor written by anyone else for the whole
    /// lifetime `'a`.
    pub unsafe fn from_raw(ptr: u64, len: usize, ordinal: u32) -> Self {
        DeviceSliceMut {
            ptr,
            len,
            ordinal,
            _borrow: PhantomData,
        }
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Splits into `[0, mid)` and `[mid, len)`. Panics when `mid > len`.
    pub fn split_at(self, mid: usize) -> (DeviceSliceMut<'a>, DeviceSliceMut<'a>) {
        assert!(mid <= self.len, "device split out of range");
        let a = DeviceSliceMut {
            ptr: self.ptr,
            len: mid,
            ordinal: self.ordinal,
            _borrow: PhantomData,
        };
        let b = DeviceSliceMut {
            ptr: self.ptr + mid as u64,
            len: self.len - mid,
            ordinal: self.ordinal,
            _borrow: PhantomData,
        };
        (a, b)
    }

    /// Reborrows for a shorter lifetime.
    pub fn reborrow(&mut self) -> DeviceSliceMut<'_> {
        DeviceSliceMut {
            ptr: self.ptr,
            len: self.len,
            ordinal: self.ordinal,
            _borrow: PhantomData,
        }
    }
}

/// The source of a write: host bytes or device memory.
#[derive(Debug, Clone, Copy)]
pub enum MemRef<'a> {
    /// Host memory.
    Host(&'a [u8]),
    /// Device memory.
    Device(DeviceSlice<'a>),
}

impl<'a> MemRef<'a> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            MemRef::Host(s) => s.len(),
            MemRef::Device(d) => d.len(),
        }
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the bytes live.
    pub fn kind(&self) -> MemoryKind {
        match self {
            MemRef::Host(_) => MemoryKind::Host,
            MemRef::Device(d) => MemoryKind::Device {
                ordinal: d.ordinal(),
            },
        }
    }

    /// The address of the first byte (a host pointer or a device address), for alignment checks.
    pub fn addr(&self) -> u64 {
        match self {
            MemRef::Host(s) => s.as_ptr() as u64,
            MemRef::Device(d) => d.ptr(),
        }
    }

    /// The sub-range `start..start + len`. Panics when out of bounds.
    pub fn slice(&self, start: usize, len: usize) -> MemRef<'a> {
        match self {
            MemRef::Host(s) => MemRef::Host(&s[start..start + len]),
            MemRef::Device(d) => MemRef::Device(d.slice(start, len)),
        }
    }
}

impl<'a> From<&'a [u8]> for MemRef<'a> {
    fn from(s: &'a [u8]) -> Self {
        MemRef::Host(s)
    }
}

impl<'a> From<&'a Vec<u8>> for MemRef<'a> {
    fn from(s: &'a Vec<u8>) -> Self {
        MemRef::Host(s)
    }
}

impl<'a> From<&'a HostBuffer> for MemRef<'a> {
    fn from(s: &'a HostBuffer) -> Self {
        MemRef::Host(s)
    }
}

/// The destination of a read: host bytes or device memory.
#[derive(Debug)]
pub enum MemMut<'a> {
    /// Host memory.
    Host(&'a mut [u8]),
    /// Device memory.
    Device(DeviceSliceMut<'a>),
}

impl<'a> MemMut<'a> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            MemMut::Host(s) => s.len(),
            MemMut::Device(d) => d.len(),
        }
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the bytes live.
    pub fn kind(&self) -> MemoryKind {
        match self {
            MemMut::Host(_) => MemoryKind::Host,
            MemMut::Device(d) => MemoryKind::Device {
                ordinal: d.ordinal(),
            },
        }
    }

    /// The address of the first byte (a host pointer or a device address).
    pub fn addr(&self) -> u64 {
        match self {
            MemMut::Host(s) => s.as_ptr() as u64,
            MemMut::Device(d) => d.ptr(),
        }
    }

    /// Reborrows for a shorter lifetime.
    pub fn reborrow(&mut self) -> MemMut<'_> {
        match self {
            MemMut::Host(s) => MemMut::Host(s),
            MemMut::Device(d) => MemMut::Device(d.reborrow()),
        }
    }

    /// Splits into `[0, mid)` and `[mid, len)`. Panics when `mid > len`.
    pub fn split_at(self, mid: usize) -> (MemMut<'a>, MemMut<'a>) {
        match self {
            MemMut::Host(s) => {
                let (a, b) = s.split_at_mut(mid);
                (MemMut::Host(a), MemMut::Host(b))
            }
            MemMut::Device(d) => {
                let (a, b) = d.split_at(mid);
                (MemMut::Device(a), MemMut::Device(b))
            }
        }
    }

    /// The first `len` bytes. Panics when `len` exceeds the length.
    pub fn truncate(self, len: usize) -> MemMut<'a> {
        self.split_at(len).0
    }

    /// Splits into consecutive pieces of `chunk` bytes (the last may be shorter).
    pub fn chunks(self, chunk: usize) -> Vec<MemMut<'a>> {
        assert!(chunk > 0, "chunk size must be positive");
        let mut out = Vec::with_capacity(self.len().div_ceil(chunk));
        let mut rest = self;
        while rest.len() > chunk {
            let (a, b) = rest.split_at(chunk);
            out.push(a);
            rest = b;
        }
        if !rest.is_empty() {
            out.push(rest);
        }
        out
    }
}

impl<'a> From<&'a mut [u8]> for MemMut<'a> {
    fn from(s: &'a mut [u8]) -> Self {
        MemMut::Host(s)
    }
}

impl<'a> From<&'a mut Vec<u8>> for MemMut<'a> {
    fn from(s: &'a mut Vec<u8>) -> Self {
        MemMut::Host(s)
    }
}

impl<'a> From<&'a mut HostBuffer> for MemMut<'a> {
    fn from(s: &'a mut HostBuffer) -> Self {
        MemMut::Host(s)
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

    #[test]
    fn chunks_cover_the_buffer_in_order() {
        let mut v = vec![0u8; 10];
        let parts = MemMut::from(&mut v[..]).chunks(4);
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            vec![4, 4, 2]
        );
        for (i, p) in parts.into_iter().enumerate() {
            if let MemMut::Host(s) = p {
                s.fill(i as u8 + 1);
            }
        }
        assert_eq!(v, [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]);
    }
}
