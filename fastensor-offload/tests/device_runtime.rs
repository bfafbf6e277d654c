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

/// The producer's work failed (a device fault): waiting for it says so.
#[derive(Debug)]
struct Faulted;

impl DeviceEvent for Faulted {
    fn is_done(&self) -> Result<bool> {
        Err(fastensor_core::Error::new(
            ErrorKind::Io,
            "the device faulted",
        ))
    }

    fn wait(&self) -> Result<()> {
        self.is_done().map(drop)
    }
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
    source_after(data, returned, Box::new(Passed))
}

/// "Device memory" holding `data`, produced by the work `after` names.
fn source_after(
    data: &[u8],
    returned: &Arc<AtomicUsize>,
    after: Box<dyn DeviceEvent>,
) -> DeviceSource {
    let lent = Lent {
        bytes: data.into(),
        ordinal: 0,
        returned: returned.clone(),
    };
    DeviceSource::new(Box::new(lent), Some(after))
}

fn store(dir: &std::path::Path, runtime: Option<Arc<dyn DeviceRuntime>>) -> OffloadStore {
    store_with(dir, runtime, |c| c)
}

fn store_with(
    dir: &std::path::Path,
    runtime: Option<Arc<dyn DeviceRuntime>>,
    set: impl FnOnce(OffloadConfig) -> OffloadConfig,
) -> OffloadStore {
    // Room for one of the largest tensors: the others are read back from the swap file.
    let mut config = set(OffloadConfig::new(dir, 400_000)
        .small_threshold(0)
        .device_path(DevicePath::Auto));
    config.device_runtime = runtime;
    OffloadStore::new(&fastensor_posix::PosixBackend, config).unwrap()
}

/// A store of the host runtime that keeps up to `limit` bytes of GPU tensors on their device.
fn keeping(dir: &std::path::Path, limit: u64) -> OffloadStore {
    store_with(dir, Some(Arc::new(HostRuntime)), |c| {
        c.device_write_behind(limit)
    })
}

/// Copies the tensor of `h` into "device memory" and returns it.
fn get_device(store: &OffloadStore, h: &fastensor_offload::Handle) -> Result<Vec<u8>> {
    let mut dest = vec![0u8; h.len() as usize];
    let range = DeviceRange::new(dest.as_mut_ptr() as u64, dest.len(), 0);
    // SAFETY: `dest` is host memory standing in for device memory, alive and unused until
    // the (synchronous) copy has passed.
    let dest_ref = unsafe { DeviceDest::new(range, store.copy_stream(0)?) };
    store.get_into_device(h, &dest_ref)?;
    Ok(dest)
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

#[test]
fn the_last_gpu_tensors_put_stay_on_their_device_until_later_puts_pass_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = keeping(dir.path(), 250_000);
    let returned = Arc::new(AtomicUsize::new(0));
    let n = 100_000;
    let mut hs = Vec::new();
    for i in 0..5u64 {
        hs.push(
            store
                .put_device(source(&bytes(n, i), &returned), format!("t{i}"))
                .unwrap(),
        );
        // Two fit under the limit; each put beyond copies out the oldest kept.
        let kept = (i as usize + 1).min(2);
        assert_eq!(
            returned.load(Ordering::SeqCst),
            i as usize + 1 - kept,
            "after put {i}"
        );
        assert_eq!(store.stats().device_unwritten_bytes, (kept * n) as u64);
    }
    assert!(
        !store.is_written(&hs[4]),
        "kept on its device, never written"
    );
    let s = store.stats();
    assert_eq!(s.peak_device_unwritten_bytes, 2 * n as u64, "{s:?}");
    assert_eq!(
        s.bytes_to_host,
        3 * n as u64,
        "only the older ones were copied out: {s:?}"
    );

    // Backward takes the newest from its own memory, with no write or read.
    assert!(get_device(&store, &hs[4]).unwrap() == bytes(n, 4));
    assert_eq!(
        returned.load(Ordering::SeqCst),
        4,
        "given back once copied in"
    );
    // The caller used the other one in place: discarding it gives its memory back.
    store.discard(&hs[3]);
    assert_eq!(returned.load(Ordering::SeqCst), 5);
    let s = store.stats();
    assert_eq!(s.device_unwritten_bytes, 0, "{s:?}");
    assert_eq!(s.bytes_never_written, 2 * n as u64, "{s:?}");
    for i in (0..3).rev() {
        assert!(
            get_device(&store, &hs[i]).unwrap() == bytes(n, i as u64),
            "t{i}"
        );
    }
    assert_eq!(store.stats().bytes_written, 3 * n as u64);
}

#[test]
fn a_gpu_tensor_kept_on_its_device_is_written_by_flush_and_given_back_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), Some(Arc::new(HostRuntime)));
    let returned = Arc::new(AtomicUsize::new(0));
    let kept = store
        .put_device(source(&bytes(5000, 1), &returned), "kept")
        .unwrap();
    let dropped = store
        .put_device(source(&bytes(5000, 2), &returned), "dropped")
        .unwrap();
    assert_eq!(
        returned.load(Ordering::SeqCst),
        0,
        "both within the default limit"
    );
    drop(dropped);
    assert_eq!(
        returned.load(Ordering::SeqCst),
        1,
        "a dropped handle gives its memory back"
    );
    store.flush();
    assert_eq!(
        returned.load(Ordering::SeqCst),
        2,
        "flush copies out what is kept"
    );
    assert!(store.is_written(&kept));
    assert!(store.get(&kept).unwrap()[..] == bytes(5000, 1)[..]);

    let at_once = keeping(dir.path(), 0);
    let h = at_once
        .put_device(source(&bytes(5000, 3), &returned), "t")
        .unwrap();
    assert_eq!(returned.load(Ordering::SeqCst), 3, "copied out by its put");
    assert!(at_once.get(&h).unwrap()[..] == bytes(5000, 3)[..]);
}

#[test]
fn a_kept_gpu_tensor_whose_copy_out_fails_keeps_the_failure_and_the_next_put_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = keeping(dir.path(), 6000);
    let returned = Arc::new(AtomicUsize::new(0));
    let faulted = source_after(&bytes(5000, 1), &returned, Box::new(Faulted));
    let bad = store.put_device(faulted, "faulted").unwrap();
    // This put passes the limit: the faulted tensor is copied out, and its copy fails.
    let good = store
        .put_device(source(&bytes(5000, 2), &returned), "good")
        .unwrap();
    let e = store.get(&bad).unwrap_err();
    assert!(e.to_string().contains("`faulted`"), "{e}");
    assert!(e.to_string().contains("copy out of device memory"), "{e}");
    let e = store
        .put_device(source(&bytes(5000, 3), &returned), "next")
        .unwrap_err();
    assert!(e.to_string().contains("`next` was not stored"), "{e}");
    assert!(get_device(&store, &good).unwrap() == bytes(5000, 2));
}
