//! Faults injected by the CUDA stand-in (host memory, no GPU): failing, short and empty
//! cuFile reads, failing writes, failed batch requests, pinned memory exhausted, the device
//! lost in the middle of a transfer, and an older driver or cuFile lacking a symbol. Each
//! ends in fastensor's typed error (or, where the fault can be worked around, in every byte
//! right), never a crash or a hang, with nothing left allocated. Each runs in a process of
//! its own, which fails if it runs for two minutes.
//!
//! Run them with the stand-in on the loader path:
//! `fastensor-testkit/cuda-stand-in/run cargo test -p fastensor-cuda-stand-in`.

mod common;

use common::{assert_clean, assert_error, bytes, library_without, run_child, scenario, stat};
use fastensor_core::{Availability, Backend, ErrorKind, OpenMode, ReadRequest};
use fastensor_gds::{DeviceBuffer, GdsBackend, GdsConfig, StagedBackend, StagedConfig};
use std::path::{Path, PathBuf};

/// A file of `len` pseudo-random bytes in `dir`.
fn file_in(dir: &Path, len: usize) -> (PathBuf, Vec<u8>) {
    let path = dir.join("data.bin");
    let content = bytes(len, 7);
    std::fs::write(&path, &content).unwrap();
    (path, content)
}

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
    file: &dyn fastensor_core::BackendFile,
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

#[test]
fn stand_in_failing_cufile_read_ends_in_an_io_error() {
    let env = [("FASTENSOR_STAND_IN_FAULT", "read-error@3")];
    scenario(
        "stand_in_failing_cufile_read_ends_in_an_io_error",
        &env,
        || {
            let dir = tempfile::tempdir().unwrap();
            let (path, _) = file_in(dir.path(), 1 << 20);
            let gds = small_gds();
            let file = gds.open(&path, OpenMode::Read).unwrap();
            let mut dev = DeviceBuffer::new(1 << 20, 0).unwrap();
            let err = file.read_at(0, dev.as_mem_mut()).unwrap_err();
            assert_error(&err, ErrorKind::Io, &path, "cuFileRead failed");
            assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
            // A batch: its requests fail, and so does the one-by-one retry.
            let err = batch(file.as_ref(), &small_requests(20, 1 << 20)).unwrap_err();
            assert_error(&err, ErrorKind::Io, &path, "cuFileRead failed");
            drop((file, gds, dev));
            assert!(stat("fault.read-error") > 0);
            assert_clean("after failing reads");
        },
    );
}

#[test]
fn stand_in_short_cufile_reads_still_deliver_every_byte() {
    let env = [("FASTENSOR_STAND_IN_FAULT", "short-read@0")];
    scenario(
        "stand_in_short_cufile_reads_still_deliver_every_byte",
        &env,
        || {
            let dir = tempfile::tempdir().unwrap();
            let (path, content) = file_in(dir.path(), (1 << 20) + 4321);
            let gds = small_gds();
            let file = gds.open(&path, OpenMode::Read).unwrap();
            let mut dev = DeviceBuffer::new(content.len() - 100, 0).unwrap();
            let n = file.read_at(100, dev.as_mem_mut()).unwrap();
            assert_eq!(n, content.len() - 100);
            assert!(
                dev.to_vec().unwrap() == content[100..],
                "short reads lost bytes"
            );
            let requests = small_requests(40, content.len());
            let got = batch(file.as_ref(), &requests).unwrap();
            for ((off, len), b) in requests.iter().zip(&got) {
                assert!(
                    *b == content[*off as usize..*off as usize + len],
                    "batch at {off}"
                );
            }
            drop((file, gds, dev));
            assert!(stat("fault.short-read") > 0);
            assert_clean("after short reads");
        },
    );
}

#[test]
fn stand_in_cufile_read_of_nothing_before_the_end_is_a_clear_error() {
    let env = [("FASTENSOR_STAND_IN_FAULT", "zero-read@0")];
    scenario(
        "stand_in_cufile_read_of_nothing_before_the_end_is_a_clear_error",
        &env,
        || {
            let dir = tempfile::tempdir().unwrap();
            let (path, _) = file_in(dir.path(), 300_000);
            let gds = small_gds();
            let file = gds.open(&path, OpenMode::Read).unwrap();
            let mut dev = DeviceBuffer::new(300_000, 0).unwrap();
            let err = file.read_at(0, dev.as_mem_mut()).unwrap_err();
            assert_error(&err, ErrorKind::Io, &path, "cuFileRead returned no bytes");
            drop((file, gds, dev));
            assert_clean("after empty reads");
        },
    );
}

#[test]
fn stand_in_failing_cufile_write_ends_in_an_io_error() {
    let env = [("FASTENSOR_STAND_IN_FAULT", "write-error@1")];
    scenario(
        "stand_in_failing_cufile_write_ends_in_an_io_error",
        &env,
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
        },
    );
}

#[test]
fn stand_in_failed_batch_requests_fall_back_with_every_byte() {
    let env = [("FASTENSOR_STAND_IN_FAULT", "batch-fail@5")];
    scenario(
        "stand_in_failed_batch_requests_fall_back_with_every_byte",
        &env,
        || {
            let dir = tempfile::tempdir().unwrap();
            let (path, content) = file_in(dir.path(), 2 << 20);
            let gds = GdsBackend::default();
            let file = gds.open(&path, OpenMode::Read).unwrap();
            let requests = small_requests(200, content.len());
            let got = batch(file.as_ref(), &requests).unwrap();
            for ((off, len), b) in requests.iter().zip(&got) {
                assert!(
                    *b == content[*off as usize..*off as usize + len],
                    "batch at {off}"
                );
            }
            drop((file, gds));
            assert!(stat("fault.batch-fail") > 0);
            assert_clean("after failed batch requests");
        },
    );
}

#[test]
fn stand_in_pinned_memory_exhausted_is_out_of_memory_with_nothing_leaked() {
    // The second cuMemHostAlloc fails: a lane of three buffers gets one, then fails.
    let env = [("FASTENSOR_STAND_IN_FAULT", "pinned-oom@1")];
    scenario(
        "stand_in_pinned_memory_exhausted_is_out_of_memory_with_nothing_leaked",
        &env,
        || {
            let dir = tempfile::tempdir().unwrap();
            let (path, _) = file_in(dir.path(), 1 << 20);
            let staged = small_staged(3);
            let file = staged.open(&path, OpenMode::ReadWrite).unwrap();
            let mut dev = DeviceBuffer::new(1 << 20, 0).unwrap();
            let err = file.read_at(0, dev.as_mem_mut()).unwrap_err();
            assert_error(
                &err,
                ErrorKind::OutOfMemory,
                &path,
                "CUDA_ERROR_OUT_OF_MEMORY",
            );
            assert_eq!(stat("live.pinned_buffers"), 0, "a pinned buffer leaked");
            let err = file.write_at(0, dev.as_mem()).unwrap_err();
            assert_error(&err, ErrorKind::OutOfMemory, &path, "cuMemHostAlloc");
            drop((file, staged, dev));
            assert!(stat("fault.pinned-oom") > 0);
            assert_clean("after pinned memory ran out");
        },
    );
}

#[test]
fn stand_in_device_lost_during_a_staged_read_is_a_device_error() {
    let env = [("FASTENSOR_STAND_IN_FAULT", "device-lost@1M")];
    scenario(
        "stand_in_device_lost_during_a_staged_read_is_a_device_error",
        &env,
        || {
            let dir = tempfile::tempdir().unwrap();
            let (path, _) = file_in(dir.path(), 4 << 20);
            let staged = small_staged(2);
            let file = staged.open(&path, OpenMode::ReadWrite).unwrap();
            // Allocated before the loss; the upload counts towards the megabyte.
            let mut dev = DeviceBuffer::new(4 << 20, 0).unwrap();
            let err = file.read_at(0, dev.as_mem_mut()).unwrap_err();
            assert_error(&err, ErrorKind::Device, &path, "CUDA_ERROR_UNKNOWN");
            // Everything after the loss fails the same way, at once.
            let err = file.write_at(0, dev.as_mem()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Device, "{err}");
            let err = DeviceBuffer::new(4096, 0).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Device, "{err}");
            drop((file, staged, dev));
            assert!(stat("fault.device-lost") > 0);
            assert_clean("after the device was lost");
        },
    );
}

#[test]
fn stand_in_device_lost_during_a_gds_read_is_a_device_error() {
    let env = [("FASTENSOR_STAND_IN_FAULT", "device-lost@1M")];
    scenario(
        "stand_in_device_lost_during_a_gds_read_is_a_device_error",
        &env,
        || {
            let dir = tempfile::tempdir().unwrap();
            let (path, _) = file_in(dir.path(), 4 << 20);
            let gds = small_gds();
            let file = gds.open(&path, OpenMode::ReadWrite).unwrap();
            let mut dev = DeviceBuffer::new(4 << 20, 0).unwrap();
            let err = file.read_at(0, dev.as_mem_mut()).unwrap_err();
            assert_error(&err, ErrorKind::Device, &path, "CU_FILE_CUDA_DRIVER_ERROR");
            let err = file.write_at(0, dev.as_mem()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Device, "{err}");
            drop((file, gds, dev));
            assert_clean("after the device was lost");
        },
    );
}

/// Runs scenario `name` against a copy of the stand-in lacking the symbols `missing`.
fn with_library_without(name: &str, missing: &[&str], body: impl FnOnce()) {
    if std::env::var("FASTENSOR_STAND_IN_SCENARIO").is_ok_and(|s| s == name) {
        body();
        return;
    }
    if !common::stand_in_loaded() {
        return;
    }
    let lib = library_without(missing);
    let out = run_child(name, &[], Some(lib.path()));
    eprintln!("{}", out.text);
    assert!(out.status.success(), "scenario {name} failed: {}", out.text);
}

#[test]
fn stand_in_older_driver_without_a_symbol_leaves_cuda_unavailable() {
    let name = "stand_in_older_driver_without_a_symbol_leaves_cuda_unavailable";
    with_library_without(name, &["cuMemcpyDtoHAsync_v2"], || {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = file_in(dir.path(), 4096);
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
    });
}

#[test]
fn stand_in_cufile_without_read_leaves_gds_unavailable_and_staged_working() {
    let name = "stand_in_cufile_without_read_leaves_gds_unavailable_and_staged_working";
    with_library_without(name, &["cuFileRead"], || {
        let dir = tempfile::tempdir().unwrap();
        let (path, content) = file_in(dir.path(), 100_000);
        let Availability::Unavailable { reason } = small_gds().probe() else {
            panic!("gds is available with a cuFile lacking cuFileRead");
        };
        assert!(reason.contains("cuFileRead"), "{reason}");
        let staged = small_staged(2);
        let file = staged.open(&path, OpenMode::Read).unwrap();
        let mut dev = DeviceBuffer::new(content.len(), 0).unwrap();
        file.read_at(0, dev.as_mem_mut()).unwrap();
        assert!(dev.to_vec().unwrap() == content);
        drop((file, staged, dev));
        assert_clean("cuda-staged without cuFileRead");
    });
}

#[test]
fn stand_in_cufile_without_the_batch_api_reads_one_request_at_a_time() {
    let name = "stand_in_cufile_without_the_batch_api_reads_one_request_at_a_time";
    with_library_without(name, &["cuFileBatchIOSubmit"], || {
        let dir = tempfile::tempdir().unwrap();
        let (path, content) = file_in(dir.path(), 1 << 20);
        let gds = GdsBackend::default();
        let file = gds.open(&path, OpenMode::Read).unwrap();
        let requests = small_requests(100, content.len());
        let got = batch(file.as_ref(), &requests).unwrap();
        for ((off, len), b) in requests.iter().zip(&got) {
            assert!(
                *b == content[*off as usize..*off as usize + len],
                "at {off}"
            );
        }
        assert_eq!(stat("calls.cuFileBatchIOSetUp"), 0);
        assert!(stat("calls.cuFileRead") >= 100);
        drop((file, gds));
        assert_clean("gds without the batch API");
    });
}

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

#[test]
fn stand_in_counts_pinned_memory_freed_before_its_copy_ran() {
    // The stand-in's own guard: an asynchronous copy still queued when its pinned buffer is
    // freed is a violation (on a GPU it would copy freed memory).
    let env = [("FASTENSOR_STAND_IN_DELAY_US", "50000")];
    scenario(
        "stand_in_counts_pinned_memory_freed_before_its_copy_ran",
        &env,
        || {
            use fastensor_gds::cuda::{self, PinnedBuffer, Stream};
            cuda::require().unwrap().bind(0).unwrap();
            let dev = DeviceBuffer::new(4096, 0).unwrap();
            let stream = Stream::new().unwrap();
            let pinned = PinnedBuffer::new(4096).unwrap();
            // SAFETY: dev holds 4096 bytes; the pinned buffer is freed too early on purpose.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    dev.device_ptr(),
                    &pinned[..],
                    stream.raw(),
                )
            }
            .unwrap();
            drop(pinned);
            stream.synchronize().unwrap();
            assert_eq!(stat("violation.freed_while_in_use"), 1);
        },
    );
}
