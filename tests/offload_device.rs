//! GPU tensors in an offload store, against the CUDA stand-in (`scripts/test` runs this
//! under `fastensor-testkit/cuda-stand-in/run`; without it the tests skip, saying why):
//! bit-exact round trips on the staged and the direct path, copies ordered after the
//! producer's stream, pinned memory reused within its budget, nothing left behind when a
//! store closes mid-flight, faults ending in typed errors, two GPUs. Each test is a child
//! process of its own (the stand-in reads its settings once per process).

#[path = "../fastensor-testkit/cuda-stand-in/tests/common/mod.rs"]
#[macro_use]
mod common;

use fastensor::core::device_copies::DeviceEvent;
use fastensor::core::DeviceRange;
use fastensor::gds::copies::{CudaRuntime, DeviceBytes, DeviceDest, DeviceSource, Done, StreamRef};
use fastensor::gds::cuda::{self, PinnedBuffer, Stream};
use fastensor::gds::DeviceBuffer;
use fastensor::offload::{DevicePath, Handle, OffloadConfig, OffloadStore};
use fastensor::{Engine, ErrorKind, Registry};
use fastensor_testkit::faulty::{Fault, Faulty, Op, When};
use fastensor_testkit::MemoryBackend;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Device memory lent to a store; counts how many of its kind were given back.
struct Lent {
    buf: Arc<DeviceBuffer>,
    returned: Arc<AtomicUsize>,
}

// SAFETY: the buffer is owned by the value: allocated, fixed and written by no one while it
// lives.
unsafe impl DeviceBytes for Lent {
    fn range(&self) -> DeviceRange {
        **self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.returned.fetch_add(1, Ordering::SeqCst);
    }
}

/// A store in a new directory over the machine's engine (every backend compiled in, and
/// its device library: CUDA, with no runtime named in the config), every tensor written
/// (copied out by its put: none kept on its device), `budget` bytes of host and of device
/// memory.
fn store(path: DevicePath, budget: u64) -> (tempfile::TempDir, OffloadStore) {
    let dir = tempfile::tempdir().unwrap();
    let config = OffloadConfig::new(dir.path(), budget)
        .small_threshold(0)
        .device_write_behind(0)
        .device_path(path);
    let store = OffloadStore::new(&Engine::new().unwrap(), config).unwrap();
    (dir, store)
}

/// A stream of GPU `gpu`'s context.
fn stream(gpu: u32) -> fastensor::Result<Stream> {
    cuda::require()?.bind(gpu)?;
    Stream::new()
}

fn stream_ref(s: &Stream, gpu: u32) -> StreamRef {
    // SAFETY: the stream is alive for the test's use of it, on GPU `gpu`'s context.
    unsafe { StreamRef::from_raw(s.raw() as usize, gpu) }
}

/// `buf`, filled by copies on `s`.
fn dest(buf: &DeviceBuffer, s: &Stream) -> DeviceDest {
    // SAFETY: the buffer outlives the copies (the tests synchronize `s` before dropping it).
    unsafe { DeviceDest::new(**buf, stream_ref(s, buf.ordinal())) }
}

/// Puts `bytes`, uploaded to GPU `gpu`, ready at once.
fn put(
    store: &OffloadStore,
    bytes: &[u8],
    gpu: u32,
    label: &str,
    returned: &Arc<AtomicUsize>,
) -> Handle {
    try_put(store, bytes, gpu, label, returned).unwrap()
}

/// As [`put`], or its error.
fn try_put(
    store: &OffloadStore,
    bytes: &[u8],
    gpu: u32,
    label: &str,
    returned: &Arc<AtomicUsize>,
) -> fastensor::Result<Handle> {
    let buf = Arc::new(DeviceBuffer::from_host(bytes, gpu)?);
    let lent = Lent {
        buf,
        returned: returned.clone(),
    };
    store.put_device(DeviceSource::new(Box::new(lent), None), label)
}

/// Gets the tensor back into new memory of GPU `gpu` on a stream, and reads it on the host.
fn get(store: &OffloadStore, h: &Handle, gpu: u32) -> fastensor::Result<Vec<u8>> {
    let s = stream(gpu)?;
    let buf = DeviceBuffer::new(h.len() as usize, gpu)?;
    let r = store.get_into_device(h, &dest(&buf, &s));
    s.synchronize()?;
    r?;
    buf.to_vec()
}

const SIZES: [usize; 7] = [1, 4095, 4097, 65_537, (1 << 20) + 3, 3 << 20, 7];

scenario_test!(
    staged_and_direct_round_trips_are_bit_exact_at_odd_sizes,
    [],
    || {
        for path in [DevicePath::Staged, DevicePath::Direct] {
            // A budget of 2 MiB: the tensors are written and read back, the 3 MiB one written
            // through.
            let (_dir, store) = store(path, 2 << 20);
            let returned = Arc::new(AtomicUsize::new(0));
            let hs: Vec<_> = SIZES
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    put(
                        &store,
                        &common::bytes(n, i as u64),
                        0,
                        &format!("t{i}"),
                        &returned,
                    )
                })
                .collect();
            store.flush();
            for (i, h) in hs.iter().enumerate().rev() {
                let got = get(&store, h, 0).unwrap();
                assert!(
                    got == common::bytes(SIZES[i], i as u64),
                    "{path:?}: tensor {i} differs"
                );
            }
            let s = store.stats();
            assert!(
                s.bytes_written >= SIZES.iter().sum::<usize>() as u64,
                "{path:?}: {s:?}"
            );
            assert!(
                s.peak_held_bytes <= 2 << 20 && s.peak_device_held_bytes <= 2 << 20,
                "{s:?}"
            );
            assert_eq!(s.written_through, 1, "{path:?}: {s:?}");
            assert_eq!((s.device_puts, s.device_gets), (7, 7));
            drop(hs);
            drop(store);
            assert_eq!(
                returned.load(Ordering::SeqCst),
                SIZES.len(),
                "device memory given back"
            );
        }
        common::assert_clean("round trips");
    }
);

/// Puts a tensor whose bytes a delayed producer stream writes, ordered after it or not;
/// returns what comes back.
fn produced_late(store: &OffloadStore, ordered: bool) -> (Vec<u8>, Vec<u8>) {
    let len = 256 << 10;
    let want = common::bytes(len, 42);
    let producer = stream(0).unwrap();
    let returned = Arc::new(AtomicUsize::new(0));
    let mut target = DeviceBuffer::new(len, 0).unwrap();
    let mut scratch = DeviceBuffer::new(4096, 0).unwrap();
    let mut host = PinnedBuffer::new(len).unwrap();
    host.copy_from_slice(&want);
    let junk = PinnedBuffer::new(4096).unwrap();
    // Thirty copies ahead of the one that writes the tensor: each runs after the stand-in's
    // delay, so the tensor's bytes land long after a copy stream with nothing queued would
    // read them.
    for _ in 0..30 {
        // SAFETY: both buffers outlive the stream's work (synchronized below).
        unsafe { cuda_htod_async(&mut scratch, &junk, &producer) };
    }
    // SAFETY: as above.
    unsafe { cuda_htod_async(&mut target, &host, &producer) };
    let after = ordered
        .then(|| Box::new(Done::record(stream_ref(&producer, 0)).unwrap()) as Box<dyn DeviceEvent>);
    // The test keeps the memory too, until the producer is done with it.
    let target = Arc::new(target);
    let lent = Lent {
        buf: target.clone(),
        returned,
    };
    let h = store
        .put_device(DeviceSource::new(Box::new(lent), after), "late")
        .unwrap();
    store.flush();
    let got = get(store, &h, 0).unwrap();
    producer.synchronize().unwrap();
    (got, want)
}

/// Queues a copy of `src` into the start of `dst` on `s`.
///
/// # Safety
/// Both buffers must outlive the stream's work.
unsafe fn cuda_htod_async(dst: &mut DeviceBuffer, src: &PinnedBuffer, s: &Stream) {
    // SAFETY: the caller's contract; `src` is pinned.
    unsafe { fastensor::gds::copies::upload_async(dst, src, s) }.unwrap()
}

scenario_test!(
    a_copy_out_waits_for_the_producers_stream,
    [("FASTENSOR_STAND_IN_DELAY_US", "3000")],
    || {
        let (_dir, store) = store(DevicePath::Staged, 64 << 20);
        let (got, want) = produced_late(&store, true);
        assert!(
            got == want,
            "the copy read the tensor before its producer wrote it"
        );
        // Without the order the same copy reads the memory as it was before (the stand-in
        // fills new device memory with 0xDB): what a missing wait looks like.
        let (got, want) = produced_late(&store, false);
        assert!(got != want, "an unordered copy should have read early here");
        assert!(got.iter().all(|&b| b == 0), "new device memory is zeroed");
        drop(store);
        common::assert_clean("ordering");
    }
);

scenario_test!(
    a_tensor_kept_on_its_device_is_copied_out_after_its_producer_when_a_later_put_passes_the_limit,
    [("FASTENSOR_STAND_IN_DELAY_US", "3000")],
    || {
        for path in [DevicePath::Staged, DevicePath::Direct] {
            let dir = tempfile::tempdir().unwrap();
            let config = OffloadConfig::new(dir.path(), 64 << 20)
                .small_threshold(0)
                .device_write_behind(256 << 10)
                .device_path(path);
            let store = OffloadStore::new(&Engine::new().unwrap(), config).unwrap();
            // produced_late's tensor (256 KiB) is kept; flush copies it out like a put past
            // the limit would: the copy still waits for the event of its put.
            let (got, want) = produced_late(&store, true);
            assert!(
                got == want,
                "{path:?}: the copy read the tensor before its producer"
            );
            let returned = Arc::new(AtomicUsize::new(0));
            let older = put(&store, &common::bytes(200_000, 1), 0, "older", &returned);
            let newer = put(&store, &common::bytes(200_000, 2), 0, "newer", &returned);
            let s = store.stats();
            assert_eq!(s.device_unwritten_bytes, 200_000, "{path:?}: {s:?}");
            assert!(get(&store, &newer, 0).unwrap() == common::bytes(200_000, 2));
            assert!(get(&store, &older, 0).unwrap() == common::bytes(200_000, 1));
            drop((older, newer));
            drop(store);
            assert_eq!(
                returned.load(Ordering::SeqCst),
                2,
                "device memory given back"
            );
        }
        common::assert_clean("kept on the device");
    }
);

scenario_test!(
    pinned_memory_is_reused_and_stays_within_its_budget,
    [],
    || {
        let budget = 4 << 20;
        let (_dir, store) = store(DevicePath::Staged, budget);
        let returned = Arc::new(AtomicUsize::new(0));
        let mut allocations = Vec::new();
        for step in 0..5u64 {
            let hs: Vec<_> = (0..12u64)
                .map(|i| {
                    put(
                        &store,
                        &common::bytes(300_000 + i as usize, step * 100 + i),
                        0,
                        "a",
                        &returned,
                    )
                })
                .collect();
            store.expect_backward();
            for (i, h) in hs.iter().enumerate().rev() {
                let got = get(&store, h, 0).unwrap();
                assert!(got == common::bytes(300_000 + i, step * 100 + i as u64));
            }
            let p = store.pinned_stats(0).unwrap();
            assert!(p.peak_held_bytes <= budget, "{p:?}");
            allocations.push(p.allocations);
        }
        assert!(
            allocations[1..].windows(2).all(|w| w[0] == w[1]),
            "pinned blocks are reused after the first step: {allocations:?}"
        );
        drop(store);
        common::assert_clean("pinned reuse");
    }
);

scenario_test!(
    handles_dropped_and_the_store_closed_mid_flight_leave_nothing_behind,
    [("FASTENSOR_STAND_IN_DELAY_US", "500")],
    || {
        for path in [DevicePath::Staged, DevicePath::Direct] {
            let (_dir, store) = store(path, 8 << 20);
            let returned = Arc::new(AtomicUsize::new(0));
            let mut kept = Vec::new();
            for i in 0..40u64 {
                let h = put(&store, &common::bytes(100_000, i), 0, "m", &returned);
                if i % 2 == 0 {
                    kept.push(h); // the others are dropped at once, their copies under way
                }
            }
            // A get under way too: its copy into device memory is still queued.
            let s = stream(0).unwrap();
            let buf = DeviceBuffer::new(100_000, 0).unwrap();
            store.get_into_device(&kept[0], &dest(&buf, &s)).unwrap();
            drop(store);
            drop(kept);
            s.synchronize().unwrap();
            assert_eq!(
                returned.load(Ordering::SeqCst),
                40,
                "{path:?}: device memory given back"
            );
        }
        common::assert_clean("closed mid-flight");
    }
);

scenario_test!(
    pinned_memory_exhausted_is_an_out_of_memory_error_naming_the_tensor,
    [("FASTENSOR_STAND_IN_FAULT", "pinned-oom@0")],
    || {
        let (_dir, store) = store(DevicePath::Staged, 8 << 20);
        let returned = Arc::new(AtomicUsize::new(0));
        let e = try_put(&store, &[1u8; 8192], 0, "act-1", &returned).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e}");
        assert!(e.to_string().contains("`act-1`"), "{e}");
        assert_eq!(
            returned.load(Ordering::SeqCst),
            1,
            "its device memory was given back"
        );
        drop(store);
        common::assert_clean("pinned exhausted");
    }
);

scenario_test!(
    a_device_lost_mid_transfer_ends_in_device_errors,
    [("FASTENSOR_STAND_IN_FAULT", "device-lost@1M")],
    || {
        let (_dir, store) = store(DevicePath::Staged, 8 << 20);
        let returned = Arc::new(AtomicUsize::new(0));
        let mut failed = 0;
        let mut hs = Vec::new();
        for i in 0..8u64 {
            match try_put(
                &store,
                &common::bytes(300_000, i),
                0,
                &format!("x{i}"),
                &returned,
            ) {
                Ok(h) => hs.push((i, h)),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Device, "{e}");
                    failed += 1;
                }
            }
        }
        store.flush();
        for (i, h) in hs.iter().rev() {
            match get(&store, h, 0) {
                Ok(got) => assert!(got == common::bytes(300_000, *i)),
                Err(e) => {
                    assert!(
                        matches!(e.kind(), ErrorKind::Device),
                        "a lost device is a device error: {e}"
                    );
                    failed += 1;
                }
            }
        }
        assert!(failed > 0, "the device was lost after 1 MiB");
    }
);

scenario_test!(
    a_failing_write_ends_in_an_io_error_naming_the_tensor,
    [],
    || {
        let faulty = Faulty::new("faulty", Arc::new(MemoryBackend::new())).with_fault(Fault::new(
            Op::Write,
            When::Nth(2),
            ErrorKind::Io,
        ));
        let engine = Engine::builder()
            .registry(Registry::new())
            .backend(Arc::new(faulty))
            .pin("faulty")
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = OffloadConfig::new(dir.path(), 1 << 20)
            .small_threshold(0)
            .device_write_behind(0)
            .io_threads(1)
            .device_path(DevicePath::Staged)
            .device_runtime(CudaRuntime::shared());
        let store = OffloadStore::new(&engine, config).unwrap();
        let returned = Arc::new(AtomicUsize::new(0));
        let mut hs = Vec::new();
        let mut reported = 0;
        for i in 0..6u64 {
            let bytes = common::bytes(400_000, i);
            match try_put(&store, &bytes, 0, &format!("w{i}"), &returned) {
                Ok(h) => hs.push(h),
                Err(e) => {
                    // The failed write of an earlier tensor, reported by this put, which stored
                    // nothing: put it again.
                    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
                    assert!(
                        e.to_string().contains(&format!("`w{i}` was not stored")),
                        "{e}"
                    );
                    reported += 1;
                    hs.push(put(&store, &bytes, 0, &format!("w{i}"), &returned));
                }
            }
        }
        store.flush();
        let mut io_errors = 0;
        for (i, h) in hs.iter().enumerate().rev() {
            match get(&store, h, 0) {
                Ok(got) => assert!(got == common::bytes(400_000, i as u64)),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
                    assert!(e.to_string().contains(&format!("`w{i}`")), "{e}");
                    io_errors += 1;
                }
            }
        }
        assert_eq!(io_errors, 1, "the second write failed");
        assert!(reported <= 1);
        drop(hs);
        drop(store);
        assert_eq!(returned.load(Ordering::SeqCst), 6 + reported);
        common::assert_clean("failing write");
    }
);

scenario_test!(
    a_read_back_waits_for_the_block_a_copy_into_device_memory_gives_back_not_its_time_limit,
    [],
    || {
        // Room for two pinned blocks: backward's first get copies one into device memory
        // while the prefetch of a third tensor asks the pool for a block. That block comes
        // back when the copy passes, which must wake the read (not its PINNED_WAIT limit).
        let dir = tempfile::tempdir().unwrap();
        let config = OffloadConfig::new(dir.path(), 1 << 20)
            .small_threshold(0)
            .device_write_behind(0)
            .io_threads(1)
            .device_path(DevicePath::Staged)
            .device_runtime(CudaRuntime::shared());
        let store = OffloadStore::new(&Engine::new().unwrap(), config).unwrap();
        let returned = Arc::new(AtomicUsize::new(0));
        let hs: Vec<Handle> = (0..6u64)
            .map(|i| {
                put(
                    &store,
                    &common::bytes(400_000, i),
                    0,
                    &format!("r{i}"),
                    &returned,
                )
            })
            .collect();
        store.flush();
        let t0 = std::time::Instant::now();
        for (i, h) in hs.iter().enumerate().rev() {
            assert!(get(&store, h, 0).unwrap() == common::bytes(400_000, i as u64));
        }
        assert!(
            t0.elapsed() < fastensor::offload::PINNED_WAIT / 2,
            "the gets took {:?}: a read waited out its pinned-memory limit",
            t0.elapsed()
        );
        drop(hs);
        drop(store);
        common::assert_clean("read back beside a copy in");
    }
);

scenario_test!(
    a_driver_without_cu_stream_wait_event_is_refused_as_unsupported,
    [],
    ["cuStreamWaitEvent"],
    || {
        let (_dir, store) = store(DevicePath::Staged, 8 << 20);
        let returned = Arc::new(AtomicUsize::new(0));
        let e = try_put(&store, &[3u8; 5000], 0, "y", &returned).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        assert!(format!("{e:?}").contains("cuStreamWaitEvent"), "{e:?}");
        assert_eq!(returned.load(Ordering::SeqCst), 1);
    }
);

scenario_test!(
    tensors_of_two_gpus_share_a_store,
    [("FASTENSOR_STAND_IN_DEVICES", "2")],
    || {
        for path in [DevicePath::Staged, DevicePath::Direct] {
            let (_dir, store) = store(path, 1 << 20);
            let returned = Arc::new(AtomicUsize::new(0));
            let hs: Vec<_> = (0..6u64)
                .map(|i| {
                    let gpu = (i % 2) as u32;
                    (
                        gpu,
                        put(&store, &common::bytes(200_000, i), gpu, "g", &returned),
                    )
                })
                .collect();
            for (i, (gpu, h)) in hs.iter().enumerate().rev() {
                // Back on its own GPU, and the last one on the other GPU too.
                let other = if i == 5 { 1 - gpu } else { *gpu };
                let got = get(&store, h, other).unwrap();
                assert!(
                    got == common::bytes(200_000, i as u64),
                    "{path:?} tensor {i}"
                );
            }
            if path == DevicePath::Staged {
                assert!(store.pinned_stats(0).is_some() && store.pinned_stats(1).is_some());
            }
        }
        common::assert_clean("two GPUs");
    }
);
