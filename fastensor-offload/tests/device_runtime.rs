//! GPU tensors through a device runtime that is not CUDA: the store knows the device
//! library only by the traits of `fastensor_core::device_copies`. Here "device memory" is
//! host memory and every copy is a synchronous `memcpy`, enough to run the staged path
//! (copy out into a pinned block, write, read back into a block, copy in) without a GPU; and
//! without a runtime, GPU tensors are refused as unsupported.

use fastensor_core::device_copies::{
    DeviceBytes, DeviceCopies, DeviceDest, DeviceEvent, DeviceMemory, DeviceRuntime, DeviceSource,
    OutgoingCopy, PinnedBytes, PinnedStats, StreamRef,
};
use fastensor_core::{
    DeviceRange, DeviceSlice, DeviceSliceMut, ErrorKind, HostBuffer, Result, PAGE_ALIGN,
};
use fastensor_offload::{DevicePath, OffloadConfig, OffloadStore};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Host memory standing in for device memory of GPU `ordinal`; counts its returns.
struct Lent {
    bytes: Box<[u8]>,
    ordinal: u32,
    returned: Arc<AtomicUsize>,
}

// SAFETY: the bytes are owned by the value: allocated, fixed and written by no one while it
// lives.
unsafe impl DeviceBytes for Lent {
    fn range(&self) -> DeviceRange {
        DeviceRange::new(self.bytes.as_ptr() as u64, self.bytes.len(), self.ordinal)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.returned.fetch_add(1, Ordering::SeqCst);
    }
}

/// Reads `len` bytes of "device memory" at `ptr` (host memory in this test).
///
/// # Safety
/// `ptr..ptr + len` must be readable host memory, unchanged for the returned lifetime.
unsafe fn host_bytes<'a>(ptr: u64, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
}

/// Writes `src` to "device memory" at `ptr`.
///
/// # Safety
/// `ptr..ptr + src.len()` must be host memory nobody else uses meanwhile.
unsafe fn write_host(ptr: u64, src: &[u8]) {
    if src.is_empty() {
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr as *mut u8, src.len()) }
}

#[derive(Debug, Default)]
struct HostRuntime;

#[derive(Debug)]
struct HostCopies {
    ordinal: u32,
    allocations: AtomicU64,
}

#[derive(Debug)]
struct Block {
    buf: HostBuffer,
    len: usize,
}

#[derive(Debug)]
struct Memory {
    buf: HostBuffer,
    ordinal: u32,
}

#[derive(Debug)]
struct Passed;

#[derive(Debug)]
struct Outgoing {
    block: Box<dyn PinnedBytes>,
}

impl DeviceEvent for Passed {
    fn is_done(&self) -> Result<bool> {
        Ok(true)
    }

    fn wait(&self) -> Result<()> {
        Ok(())
    }
}

impl PinnedBytes for Block {
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    fn capacity(&self) -> usize {
        self.buf.len()
    }

    fn set_len(&mut self, len: usize) {
        self.len = len.min(self.buf.len());
    }
}

impl DeviceMemory for Memory {
    fn device_slice(&self) -> DeviceSlice<'_> {
        // SAFETY: the buffer is owned by self, fixed, and written by no one while borrowed.
        unsafe { DeviceSlice::from_raw(self.buf.as_ptr() as u64, self.buf.len(), self.ordinal) }
    }

    fn device_slice_mut(&mut self) -> DeviceSliceMut<'_> {
        let len = self.buf.len();
        // SAFETY: as above, and the exclusive borrow of self rules out other access.
        unsafe { DeviceSliceMut::from_raw(self.buf.as_mut_ptr() as u64, len, self.ordinal) }
    }
}

impl OutgoingCopy for Outgoing {
    fn finish(self: Box<Self>) -> Result<Box<dyn PinnedBytes>> {
        Ok(self.block)
    }
}

impl DeviceRuntime for HostRuntime {
    fn copies(&self, ordinal: u32, _pinned_budget: u64) -> Result<Arc<dyn DeviceCopies>> {
        Ok(Arc::new(HostCopies {
            ordinal,
            allocations: AtomicU64::new(0),
        }))
    }

    fn alloc(&self, len: usize, ordinal: u32) -> Result<Box<dyn DeviceMemory>> {
        let mut buf = HostBuffer::new(len.max(1))?;
        buf.truncate(len);
        Ok(Box::new(Memory { buf, ordinal }))
    }

    fn copy_to_host(&self, src: DeviceSlice<'_>, dst: &mut [u8]) -> Result<()> {
        assert!(dst.len() <= src.len());
        // SAFETY: every device slice in this test is host memory, valid while it is borrowed.
        dst.copy_from_slice(unsafe { host_bytes(src.ptr(), dst.len()) });
        Ok(())
    }

    fn writes_device_memory_directly(&self) -> bool {
        false
    }
}

impl DeviceCopies for HostCopies {
    fn ordinal(&self) -> u32 {
        self.ordinal
    }

    fn stream(&self) -> StreamRef {
        // SAFETY: this library has no streams: the handle is never used as one.
        unsafe { StreamRef::from_raw(0, self.ordinal) }
    }

    fn record(&self) -> Result<Box<dyn DeviceEvent>> {
        Ok(Box::new(Passed))
    }

    fn take_pinned(&self, len: usize, _wait: Duration) -> Result<Box<dyn PinnedBytes>> {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        let buf = HostBuffer::new(len.max(1).div_ceil(PAGE_ALIGN) * PAGE_ALIGN)?;
        Ok(Box::new(Block { buf, len }))
    }

    fn copy_out(
        &self,
        src: DeviceSource,
        mut block: Box<dyn PinnedBytes>,
    ) -> Result<Box<dyn OutgoingCopy>> {
        src.wait_ready()?;
        let n = src.range().len();
        // SAFETY: DeviceBytes' contract (host memory here), borrowed from `src`.
        block.bytes_mut()[..n].copy_from_slice(unsafe { host_bytes(src.range().ptr(), n) });
        drop(src); // copied: the memory goes back to its owner
        Ok(Box::new(Outgoing { block }))
    }

    fn copy_in(&self, block: Box<dyn PinnedBytes>, dest: &DeviceDest) -> Result<()> {
        let n = dest.range().len();
        // SAFETY: DeviceDest's contract: memory the copy may write (host memory here).
        unsafe { write_host(dest.range().ptr(), &block.bytes()[..n]) };
        Ok(())
    }

    fn copy_device(&self, buf: Box<dyn DeviceMemory>, dest: &DeviceDest) -> Result<()> {
        let n = dest.range().len();
        let src = buf.device_slice();
        // SAFETY: `src` is borrowed from `buf`; DeviceDest's contract for the destination.
        unsafe { write_host(dest.range().ptr(), host_bytes(src.ptr(), n)) };
        Ok(())
    }

    fn copy_source(&self, src: Arc<DeviceSource>, dest: &DeviceDest) -> Result<()> {
        src.wait_ready()?;
        let n = dest.range().len();
        // SAFETY: DeviceBytes' contract for `src`; DeviceDest's for the destination.
        unsafe { write_host(dest.range().ptr(), host_bytes(src.range().ptr(), n)) };
        Ok(())
    }

    fn pinned_stats(&self) -> PinnedStats {
        PinnedStats {
            allocations: self.allocations.load(Ordering::Relaxed),
            ..PinnedStats::default()
        }
    }
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    (0..n)
        .map(|i| ((i as u64).wrapping_mul(31).wrapping_add(seed * 7) % 251) as u8)
        .collect()
}

fn source(data: &[u8], returned: &Arc<AtomicUsize>) -> DeviceSource {
    let lent = Lent {
        bytes: data.into(),
        ordinal: 0,
        returned: returned.clone(),
    };
    DeviceSource::new(Box::new(lent), Some(Box::new(Passed)))
}

fn store(dir: &std::path::Path, runtime: Option<Arc<dyn DeviceRuntime>>) -> OffloadStore {
    // Room for one of the largest tensors: the others are read back from the swap file.
    let mut config = OffloadConfig::new(dir, 400_000)
        .small_threshold(0)
        .device_path(DevicePath::Auto);
    config.device_runtime = runtime;
    OffloadStore::new(&fastensor_posix::PosixBackend, config).unwrap()
}

#[test]
fn gpu_tensors_go_through_the_device_runtime_the_store_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), Some(Arc::new(HostRuntime)));
    let returned = Arc::new(AtomicUsize::new(0));
    let sizes = [1usize, 4095, 4097, 65_537, 300_000, 300_001];
    let hs: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            store
                .put_device(source(&bytes(n, i as u64), &returned), format!("t{i}"))
                .unwrap()
        })
        .collect();
    store.flush();
    assert_eq!(returned.load(Ordering::SeqCst), sizes.len(), "copied out");
    for (i, h) in hs.iter().enumerate().rev() {
        let want = bytes(sizes[i], i as u64);
        if i % 2 == 0 {
            let mut dest = vec![0u8; sizes[i]];
            let range = DeviceRange::new(dest.as_mut_ptr() as u64, dest.len(), 0);
            // SAFETY: `dest` is host memory standing in for device memory, alive and unused
            // until the (synchronous) copy has passed.
            let dest_ref = unsafe { DeviceDest::new(range, store.copy_stream(0).unwrap()) };
            store.get_into_device(h, &dest_ref).unwrap();
            assert!(dest == want, "tensor {i} differs");
        } else {
            assert!(store.get(h).unwrap()[..] == want[..], "tensor {i} differs");
        }
    }
    let s = store.stats();
    assert_eq!((s.device_puts, s.device_gets), (6, 3), "{s:?}");
    assert!(
        s.bytes_written >= sizes.iter().sum::<usize>() as u64,
        "{s:?}"
    );
    assert!(s.bytes_read > 0, "read back into pinned blocks: {s:?}");
    assert!(s.peak_held_bytes <= 400_000, "{s:?}");
    assert!(store.pinned_stats(0).unwrap().allocations > 0);
    assert!(store.pinned_stats(1).is_none());
}

#[test]
fn without_a_device_runtime_gpu_tensors_are_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), None);
    let returned = Arc::new(AtomicUsize::new(0));
    let e = store
        .put_device(source(&bytes(5000, 1), &returned), "g")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("device runtime"), "{e}");
    assert_eq!(
        returned.load(Ordering::SeqCst),
        1,
        "its memory was given back"
    );
    assert_eq!(
        store.copy_stream(0).unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    let h = store.put(HostBuffer::new(8192).unwrap(), "host").unwrap();
    let mut dest = vec![0u8; 8192];
    let range = DeviceRange::new(dest.as_mut_ptr() as u64, dest.len(), 0);
    // SAFETY: never used: the store has no runtime to copy with.
    let d = unsafe { DeviceDest::new(range, StreamRef::from_raw(0, 0)) };
    let e = store.get_into_device(&h, &d).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(store.get(&h).is_ok(), "the host tensor is still there");
    assert!(store.pinned_stats(0).is_none());
}
