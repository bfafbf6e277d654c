//! Memory the conformance suite transfers to and from. Host memory is built in; a backend
//! crate for device memory provides its own [`TestMemory`] (fill on host, copy to the device,
//! round trip, copy back, compare).

use fastensor_core::{HostBuffer, MemMut, MemRef, MemoryKind};

/// A buffer the suite can fill and inspect from the host.
pub trait TestBuffer: Send {
    /// Copies `data` (exactly the buffer's length) into the buffer.
    fn upload(&mut self, data: &[u8]);
    /// Copies the buffer's bytes out to the host.
    fn download(&self) -> Vec<u8>;
    /// The buffer as a transfer source.
    fn as_mem(&self) -> MemRef<'_>;
    /// The buffer as a transfer destination.
    fn as_mem_mut(&mut self) -> MemMut<'_>;
}

/// Allocates test buffers of one memory kind.
pub trait TestMemory: Send + Sync {
    /// The kind of memory allocated.
    fn kind(&self) -> MemoryKind;
    /// A buffer of `len` bytes whose address is `misalign` bytes past a page boundary.
    fn alloc(&self, len: usize, misalign: usize) -> Box<dyn TestBuffer>;
}

/// Page-aligned host memory, optionally misaligned on purpose.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostMemory;

struct HostTestBuffer {
    buf: HostBuffer,
    start: usize,
    len: usize,
}

impl TestBuffer for HostTestBuffer {
    fn upload(&mut self, data: &[u8]) {
        self.buf[self.start..self.start + self.len].copy_from_slice(data);
    }
    fn download(&self) -> Vec<u8> {
        self.buf[self.start..self.start + self.len].to_vec()
    }
    fn as_mem(&self) -> MemRef<'_> {
        MemRef::Host(&self.buf[self.start..self.start + self.len])
    }
    fn as_mem_mut(&mut self) -> MemMut<'_> {
        MemMut::Host(&mut self.buf[self.start..self.start + self.len])
    }
}

impl TestMemory for HostMemory {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn alloc(&self, len: usize, misalign: usize) -> Box<dyn TestBuffer> {
        let buf = HostBuffer::new(len + misalign).expect("allocating a test buffer");
        Box::new(HostTestBuffer {
            buf,
            start: misalign,
            len,
        })
    }
}
