//! Memory kinds, the page-aligned [`HostBuffer`], and the borrowed views ([`MemRef`],
//! [`MemMut`]) through which every transfer names its source or destination, in host or
//! device memory alike.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

mod host_buffer;

pub use host_buffer::HostBuffer;

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

/// Where a range of device memory lies: its address, length and GPU. [`DeviceSlice`] and
/// [`DeviceSliceMut`] dereference to it; it gives no access to the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRange {
    ptr: u64,
    len: usize,
    ordinal: u32,
}

impl DeviceRange {
    /// The range of `len` bytes at device address `ptr` on GPU `ordinal` (a description
    /// only: it gives no access to the memory).
    pub fn new(ptr: u64, len: usize, ordinal: u32) -> Self {
        DeviceRange { ptr, len, ordinal }
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
    fn sub(&self, start: usize, len: usize) -> DeviceRange {
        assert!(
            start.checked_add(len).is_some_and(|e| e <= self.len),
            "device slice out of range"
        );
        DeviceRange {
            ptr: self.ptr + start as u64,
            len,
            ordinal: self.ordinal,
        }
    }
}

/// A borrowed range of device memory that a transfer may read.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSlice<'a> {
    range: DeviceRange,
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
            range: DeviceRange { ptr, len, ordinal },
            _borrow: PhantomData,
        }
    }

    /// The sub-range `start..start + len`. Panics when it is out of bounds.
    pub fn slice(&self, start: usize, len: usize) -> DeviceSlice<'a> {
        DeviceSlice {
            range: self.range.sub(start, len),
            _borrow: PhantomData,
        }
    }
}

impl Deref for DeviceSlice<'_> {
    type Target = DeviceRange;

    fn deref(&self) -> &DeviceRange {
        &self.range
    }
}

/// A borrowed range of device memory that a transfer may write.
#[derive(Debug)]
pub struct DeviceSliceMut<'a> {
    range: DeviceRange,
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
            range: DeviceRange { ptr, len, ordinal },
            _borrow: PhantomData,
        }
    }

    /// Splits into `[0, mid)` and `[mid, len)`. Panics when `mid > len`.
    pub fn split_at(self, mid: usize) -> (DeviceSliceMut<'a>, DeviceSliceMut<'a>) {
        assert!(mid <= self.range.len, "device split out of range");
        let a = DeviceSliceMut {
            range: self.range.sub(0, mid),
            _borrow: PhantomData,
        };
        let b = DeviceSliceMut {
            range: self.range.sub(mid, self.range.len - mid),
            _borrow: PhantomData,
        };
        (a, b)
    }

    /// Reborrows for a shorter lifetime.
    pub fn reborrow(&mut self) -> DeviceSliceMut<'_> {
        DeviceSliceMut {
            range: self.range,
            _borrow: PhantomData,
        }
    }
}

impl Deref for DeviceSliceMut<'_> {
    type Target = DeviceRange;

    fn deref(&self) -> &DeviceRange {
        &self.range
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
    /// The same memory, read-only, for as long as this borrow lasts.
    pub fn view(&self) -> MemRef<'_> {
        match self {
            MemMut::Host(s) => MemRef::Host(s),
            MemMut::Device(d) => MemRef::Device(DeviceSlice {
                range: d.range,
                _borrow: PhantomData,
            }),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.view().len()
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the bytes live.
    pub fn kind(&self) -> MemoryKind {
        self.view().kind()
    }

    /// The address of the first byte (a host pointer or a device address).
    pub fn addr(&self) -> u64 {
        self.view().addr()
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
