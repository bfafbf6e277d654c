//! Faults injected by the CUDA stand-in (host memory, no GPU): failing, short and empty
//! cuFile reads, failing writes, failed batch requests, pinned memory exhausted, the device
//! lost in the middle of a transfer, and an older driver or cuFile lacking a symbol. Each
//! ends in fastensor's typed error (or, where the fault can be worked around, in every byte
//! right), never a crash or a hang, with nothing left allocated. Each runs in a process of
//! its own, which fails if it runs for two minutes.
//!
//! Run them with the stand-in on the loader path:
//! `fastensor-testkit/cuda-stand-in/run cargo test -p fastensor-cuda-stand-in`.

#[macro_use]
mod common;

use common::{assert_clean, assert_error, bytes, data_file, run_child, stat};
use fastensor_core::{Availability, Backend, BackendFile, Error, ErrorKind, OpenMode, ReadRequest};
use fastensor_gds::{DeviceBuffer, GdsBackend, GdsConfig, StagedBackend, StagedConfig};
use std::path::PathBuf;

/// `gds` with small pieces on three threads, so a transfer is many cuFile calls.
fn small_gds() -> GdsBackend {
    GdsBackend::new(GdsConfig {
        chunk_size: 64 << 10,
        threads: 3,
        ..GdsConfig::default()
    })
}

/// `cuda-staged` with small buffers, so a transfer is many copies.
fn small_staged(buffers: usize) -> StagedBackend {
    StagedBackend::new(StagedConfig {
        buffer_size: 64 << 10,
        buffers,
        threads: 2,
        direct: true,
    })
}

/// Reads `requests` (offset, length) of `file` into device buffers with `read_batch`; the
/// buffers' bytes, or the error.
fn batch(
    file: &dyn BackendFile,
    requests: &[(u64, usize)],
) -> fastensor_core::Result<Vec<Vec<u8>>> {
    let mut bufs: Vec<DeviceBuffer> = requests
        .iter()
        .map(|r| DeviceBuffer::new(r.1, 0).unwrap())
        .collect();
    let mut reqs: Vec<ReadRequest<'_>> = requests
        .iter()
        .zip(bufs.iter_mut())
        .map(|(r, b)| ReadRequest {
            offset: r.0,
            dst: b.as_mem_mut(),
            done: 0,
        })
        .collect();
    file.read_batch(&mut reqs)?;
    drop(reqs);
    Ok(bufs.iter().map(|b| b.to_vec().unwrap()).collect())
}

/// Reads `n` small requests of `file` with `read_batch` and asserts each matches `content`.
fn assert_batch_reads(file: &dyn BackendFile, content: &[u8], n: u64) {
    let requests = small_requests(n, content.len());
    let got = batch(file, &requests).unwrap();
    for ((off, len), b) in requests.iter().zip(&got) {
        assert!(
            *b == content[*off as usize..*off as usize + len],
            "batch at {off}"
        );
    }
}

/// `n` small requests spread over the first `len` bytes.
fn small_requests(n: u64, len: usize) -> Vec<(u64, usize)> {
    (0..n)
        .map(|i| {
            (
                (i * 7919) % (len as u64 - 5000),
                1 + (i as usize * 104_729) % 4096,
            )
        })
        .collect()
}

/// A file of `len` pseudo-random bytes in a temporary folder, opened with a backend. The
/// fields drop in order: the file before its backend.
struct Opened<B> {
    file: Box<dyn BackendFile>,
    _backend: B,
    path: PathBuf,
    content: Vec<u8>,
    _dir: tempfile::TempDir,
}

/// A file of `len` bytes opened with `backend` in `mode`.
fn opened<B: Backend>(backend: B, len: usize, mode: OpenMode) -> Opened<B> {
    let (dir, path, content) = data_file("data.bin", len, 7);
    let file = backend.open(&path, mode).unwrap();
    Opened {
        file,
        _backend: backend,
        path,
        content,
        _dir: dir,
    }
}

/// Opens a file of `len` bytes with `backend` in `mode` and reads it whole into a new device
/// buffer, which must fail with an error of `kind` that names the file and says `words`; the
/// file, the buffer and the error.
fn read_fails<B: Backend>(
    backend: B,
    (len, mode): (usize, OpenMode),
    kind: ErrorKind,
    words: &str,
) -> (Opened<B>, DeviceBuffer, Error) {
    let o = opened(backend, len, mode);
    let mut dev = DeviceBuffer::new(len, 0).unwrap();
    let err = o.file.read_at(0, dev.as_mem_mut()).unwrap_err();
    assert_error(&err, kind, &o.path, words);
    (o, dev, err)
}

scenario_test!(
    stand_in_failing_cufile_read_ends_in_an_io_error,
    [("FASTENSOR_STAND_IN_FAULT", "read-error@3")],
    || {
        let (o, dev, err) = read_fails(
            small_gds(),
            (1 << 20, OpenMode::Read),
            ErrorKind::Io,
            "cuFileRead failed",
        );
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
        // A batch: its requests fail, and so does the one-by-one retry.
        let err = batch(o.file.as_ref(), &small_requests(20, 1 << 20)).unwrap_err();
        assert_error(&err, ErrorKind::Io, &o.path, "cuFileRead failed");
        drop((o, dev));
        assert!(stat("fault.read-error") > 0);
        assert_clean("after failing reads");
    }
);

scenario_test!(
    stand_in_short_cufile_reads_still_deliver_every_byte,
    [("FASTENSOR_STAND_IN_FAULT", "short-read@0")],
    || {
        let o = opened(small_gds(), (1 << 20) + 4321, OpenMode::Read);
        let mut dev = DeviceBuffer::new(o.content.len() - 100, 0).unwrap();
        let n = o.file.read_at(100, dev.as_mem_mut()).unwrap();
        assert_eq!(n, o.content.len() - 100);
        assert!(
            dev.to_vec().unwrap() == o.content[100..],
            "short reads lost bytes"
        );
        assert_batch_reads(o.file.as_ref(), &o.content, 40);
        drop((o, dev));
        assert!(stat("fault.short-read") > 0);
        assert_clean("after short reads");
    }
);

scenario_test!(
    stand_in_cufile_read_of_nothing_before_the_end_is_a_clear_error,
    [("FASTENSOR_STAND_IN_FAULT", "zero-read@0")],
    || {
        let (o, dev, _) = read_fails(
            small_gds(),
            (300_000, OpenMode::Read),
            ErrorKind::Io,
            "cuFileRead returned no bytes",
        );
        drop((o, dev));
        assert_clean("after empty reads");
    }
);

scenario_test!(
    stand_in_failing_cufile_write_ends_in_an_io_error,
    [("FASTENSOR_STAND_IN_FAULT", "write-error@1")],
    || {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        let gds = small_gds();
        let file = gds.open(&path, OpenMode::Truncate).unwrap();
        let src = DeviceBuffer::from_host(&bytes(1 << 20, 9), 0).unwrap();
        let err = file.write_at(0, src.as_mem()).unwrap_err();
        assert_error(&err, ErrorKind::Io, &path, "cuFileWrite failed");
        drop((file, gds, src));
        assert_clean("after failing writes");
    }
);

scenario_test!(
    stand_in_failed_batch_requests_fall_back_with_every_byte,
    [("FASTENSOR_STAND_IN_FAULT", "batch-fail@5")],
    || {
        let o = opened(GdsBackend::default(), 2 << 20, OpenMode::Read);
        assert_batch_reads(o.file.as_ref(), &o.content, 200);
        drop(o);
        assert!(stat("fault.batch-fail") > 0);
        assert_clean("after failed batch requests");
    }
);

scenario_test!(
    stand_in_pinned_memory_exhausted_is_out_of_memory_with_nothing_leaked,
    [("FASTENSOR_STAND_IN_FAULT", "pinned-oom@1")],
    || {
        // The second cuMemHostAlloc fails: a lane of three buffers gets one, then fails.
        let (o, dev, _) = read_fails(
            small_staged(3),
            (1 << 20, OpenMode::ReadWrite),
            ErrorKind::OutOfMemory,
            "CUDA_ERROR_OUT_OF_MEMORY",
        );
        assert_eq!(stat("live.pinned_buffers"), 0, "a pinned buffer leaked");
        let err = o.file.write_at(0, dev.as_mem()).unwrap_err();
        assert_error(&err, ErrorKind::OutOfMemory, &o.path, "cuMemHostAlloc");
        drop((o, dev));
        assert!(stat("fault.pinned-oom") > 0);
        assert_clean("after pinned memory ran out");
    }
);

scenario_test!(
    stand_in_device_lost_during_a_staged_read_is_a_device_error,
    [("FASTENSOR_STAND_IN_FAULT", "device-lost@1M")],
    || {
        // Allocated before the loss; the upload counts towards the megabyte.
        let (o, dev, _) = read_fails(
            small_staged(2),
            (4 << 20, OpenMode::ReadWrite),
            ErrorKind::Device,
            "CUDA_ERROR_UNKNOWN",
        );
        // Everything after the loss fails the same way, at once.
        let err = o.file.write_at(0, dev.as_mem()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Device, "{err}");
        let err = DeviceBuffer::new(4096, 0).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Device, "{err}");
        drop((o, dev));
        assert!(stat("fault.device-lost") > 0);
        assert_clean("after the device was lost");
    }
);

scenario_test!(
    stand_in_device_lost_during_a_gds_read_is_a_device_error,
    [("FASTENSOR_STAND_IN_FAULT", "device-lost@1M")],
    || {
        let (o, dev, _) = read_fails(
            small_gds(),
            (4 << 20, OpenMode::ReadWrite),
            ErrorKind::Device,
            "CU_FILE_CUDA_DRIVER_ERROR",
        );
        let err = o.file.write_at(0, dev.as_mem()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Device, "{err}");
        drop((o, dev));
        assert_clean("after the device was lost");
    }
);

scenario_test!(
    stand_in_older_driver_without_a_symbol_leaves_cuda_unavailable,
    [],
    ["cuMemcpyDtoHAsync_v2"],
    || {
        let (_dir, path, _) = data_file("data.bin", 4096, 7);
        let backends: [Box<dyn Backend>; 2] = [Box::new(small_gds()), Box::new(small_staged(2))];
        for b in &backends {
            let Availability::Unavailable { reason } = b.probe() else {
                panic!("{} is available with a driver lacking a symbol", b.name());
            };
            eprintln!("{}: {reason}", b.name());
            assert!(reason.contains("cuMemcpyDtoHAsync_v2"), "{reason}");
            let err = b.open(&path, OpenMode::Read).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        }
        let err = DeviceBuffer::new(4096, 0).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    }
);

scenario_test!(
    stand_in_cufile_without_read_leaves_gds_unavailable_and_staged_working,
    [],
    ["cuFileRead"],
    || {
        let Availability::Unavailable { reason } = small_gds().probe() else {
            panic!("gds is available with a cuFile lacking cuFileRead");
        };
        assert!(reason.contains("cuFileRead"), "{reason}");
        let o = opened(small_staged(2), 100_000, OpenMode::Read);
        let mut dev = DeviceBuffer::new(o.content.len(), 0).unwrap();
        o.file.read_at(0, dev.as_mem_mut()).unwrap();
        assert!(dev.to_vec().unwrap() == o.content);
        drop((o, dev));
        assert_clean("cuda-staged without cuFileRead");
    }
);

scenario_test!(
    stand_in_cufile_without_the_batch_api_reads_one_request_at_a_time,
    [],
    ["cuFileBatchIOSubmit"],
    || {
        let o = opened(GdsBackend::default(), 1 << 20, OpenMode::Read);
        assert_batch_reads(o.file.as_ref(), &o.content, 100);
        assert_eq!(stat("calls.cuFileBatchIOSetUp"), 0);
        assert!(stat("calls.cuFileRead") >= 100);
        drop(o);
        assert_clean("gds without the batch API");
    }
);

#[test]
fn stand_in_stops_host_code_reading_device_memory() {
    // The stand-in's own guard: device pointers are not host memory.
    let name = "stand_in_stops_host_code_reading_device_memory";
    if std::env::var("FASTENSOR_STAND_IN_SCENARIO").is_ok_and(|s| s == name) {
        let dev = DeviceBuffer::from_host(&[1, 2, 3], 0).unwrap();
        // SAFETY: none, on purpose: the stand-in maps device addresses with no access rights,
        // so this read must stop the process with SIGSEGV, which the parent checks.
        let byte = unsafe { std::ptr::read_volatile(dev.device_ptr() as *const u8) };
        println!("read {byte} through a device pointer");
        return;
    }
    if !common::stand_in_loaded() {
        return;
    }
    let out = run_child(name, &[], None);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{}", out.text);
}

scenario_test!(
    stand_in_counts_pinned_memory_freed_before_its_copy_ran,
    [("FASTENSOR_STAND_IN_DELAY_US", "50000")],
    || {
        // The stand-in's own guard: an asynchronous copy still queued when its pinned buffer is
        // freed is a violation (on a GPU it would copy freed memory).
        use fastensor_gds::cuda::{self, PinnedBuffer, Stream};
        cuda::require().unwrap().bind(0).unwrap();
        let dev = DeviceBuffer::new(4096, 0).unwrap();
        let stream = Stream::new().unwrap();
        let pinned = PinnedBuffer::new(4096).unwrap();
        // SAFETY: dev holds 4096 bytes; the pinned buffer is freed too early on purpose.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dev.device_ptr(), &pinned[..], stream.raw())
        }
        .unwrap();
        drop(pinned);
        stream.synchronize().unwrap();
        assert_eq!(stat("violation.freed_while_in_use"), 1);
    }
);
