//! Device memory for the conformance suite: [`DeviceMemory`] implements the testkit's
//! [`TestMemory`] (fill on the host, copy to the GPU, run the transfer, copy back, compare).

use crate::DeviceBuffer;
use fastensor_core::{MemMut, MemRef, MemoryKind};
use fastensor_testkit::test_memory::{TestBuffer, TestMemory};

/// GPU memory on one device for the conformance suite. Allocation failures panic (the suite
/// reports a panicking check as failed); only use it when the backend is available.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceMemory {
    /// The GPU ordinal.
    pub ordinal: u32,
}

struct DeviceTestBuffer {
    buf: DeviceBuffer,
    start: usize,
    len: usize,
}

impl TestBuffer for DeviceTestBuffer {
    fn upload(&mut self, data: &[u8]) {
        assert_eq!(data.len(), self.len, "upload of the wrong length");
        self.buf
            .copy_from_host(self.start, data)
            .unwrap_or_else(|e| panic!("copying to the GPU: {e}"));
    }

    fn download(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        self.buf
            .copy_to_host(self.start, &mut out)
            .unwrap_or_else(|e| panic!("copying from the GPU: {e}"));
        out
    }

    fn as_mem(&self) -> MemRef<'_> {
        MemRef::Device(self.buf.slice(self.start, self.len))
    }

    fn as_mem_mut(&mut self) -> MemMut<'_> {
        MemMut::Device(self.buf.slice_mut(self.start, self.len))
    }
}

impl TestMemory for DeviceMemory {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device {
            ordinal: self.ordinal,
        }
    }

    fn alloc(&self, len: usize, misalign: usize) -> Box<dyn TestBuffer> {
        let buf = DeviceBuffer::new(len + misalign, self.ordinal)
            .unwrap_or_else(|e| panic!("allocating {len} bytes of GPU memory: {e}"));
        Box::new(DeviceTestBuffer {
            buf,
            start: misalign,
            len,
        })
    }
}
