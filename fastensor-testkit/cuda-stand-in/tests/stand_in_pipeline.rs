//! fastensor's CUDA code paths against the CUDA stand-in (host memory, no GPU): the
//! `cuda-staged` pipeline's chunking and double buffering, the `gds` backend's batch API and
//! buffer registration, two devices, and checkpoint loads into device memory. Every byte is
//! compared with a host read of the same file. These check logic, ordering, bounds and
//! error handling, not GPU speed.
//!
//! Run them with the stand-in on the loader path:
//! `fastensor-testkit/cuda-stand-in/run cargo test -p fastensor-cuda-stand-in`.

#[macro_use]
mod common;

use common::{assert_clean, bytes, data_file, stat};
use fastensor::checkpoint::{self, TensorView};
use fastensor::Engine;
use fastensor_core::{Backend, DType, MemMut, MemRef, OpenMode, ReadRequest, TensorDesc};
use fastensor_gds::testing::DeviceMemory;
use fastensor_gds::{DeviceBuffer, GdsBackend, GdsConfig, StagedBackend, StagedConfig};
use fastensor_testkit::conformance::assert_conformance_with_memory;

/// Compares `got` with `want`, naming the first difference.
fn same(what: &str, got: &[u8], want: &[u8]) {
    if let Some(i) = fastensor_testkit::data::first_difference(got, want) {
        panic!(
            "{what}: {} bytes, {} expected, first difference at byte {i}",
            got.len(),
            want.len()
        );
    }
}

scenario_test!(
    stand_in_staged_reads_and_writes_overlap_buffers_in_order,
    [("FASTENSOR_STAND_IN_DELAY_US", "300")],
    || {
        // 64 KiB buffers, two per lane, two lanes; each copy completes 300 µs after it is queued,
        // so a buffer refilled before its copy finished would show as wrong bytes.
        let (_dir, path, content) = data_file("staged.bin", (3 << 20) + 123, 1);
        let backend = StagedBackend::new(StagedConfig {
            buffer_size: 64 << 10,
            buffers: 2,
            threads: 2,
            direct: true,
        });
        let file = backend.open(&path, OpenMode::ReadWrite).unwrap();
        let (offset, len) = (4097usize, content.len() - 5000);
        let mut dev = DeviceBuffer::new(len, 0).unwrap();
        assert_eq!(file.read_at(offset as u64, dev.as_mem_mut()).unwrap(), len);
        same(
            "staged read",
            &dev.to_vec().unwrap(),
            &std::fs::read(&path).unwrap()[offset..offset + len],
        );
        let chunks = (offset + len).div_ceil(64 << 10) as i64; // aligned blocks around it
        assert!(stat("copies.async") >= chunks, "one async copy per chunk");
        assert_eq!(stat("copies.async_pageable"), 0, "staging is page-locked");
        assert!(
            stat("peak.stream_copies_in_flight") >= 2,
            "a lane never had two copies in flight: no double buffering"
        );

        // The reverse pipeline: device -> pinned buffers -> file, unaligned at both ends.
        let patch = bytes(2_000_001, 2);
        let src = DeviceBuffer::from_host(&patch, 0).unwrap();
        file.write_at(8191, src.as_mem()).unwrap();
        file.sync().unwrap();
        let mut want = content.clone();
        want[8191..8191 + patch.len()].copy_from_slice(&patch);
        same(
            "file after a staged write",
            &std::fs::read(&path).unwrap(),
            &want,
        );
        drop((file, backend, dev, src));
        assert_clean("staged pipeline");
    }
);

scenario_test!(
    stand_in_gds_batches_and_registered_buffers_match_host_reads,
    [("FASTENSOR_STAND_IN_MAX_BATCH", "64")],
    || {
        let (dir, path, _) = data_file("batch.bin", 3 << 20, 3);
        let host = std::fs::read(&path).unwrap();
        let backend = GdsBackend::default();
        let file = backend.open(&path, OpenMode::Read).unwrap();

        // 300 requests: most in buffers of their own, every fourth in one shared buffer
        // (used again and again, so it gets registered with cuFileBufRegister).
        let layout: Vec<(u64, usize)> = (0..300u64)
            .map(|i| {
                (
                    (i * 9973) % (3 << 20) as u64,
                    1 + (i as usize * 7919) % 9000,
                )
            })
            .collect();
        let shared_len: usize = layout.iter().step_by(4).map(|l| l.1).sum();
        let mut shared = DeviceBuffer::new(shared_len, 0).unwrap();
        let mut own: Vec<DeviceBuffer> = layout
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 4 != 0)
            .map(|(_, l)| DeviceBuffer::new(l.1, 0).unwrap())
            .collect();
        {
            let mut rest: &mut [DeviceBuffer] = &mut own;
            let mut shared_left = shared.as_mem_mut();
            let mut reqs = Vec::new();
            for (i, &(off, len)) in layout.iter().enumerate() {
                let dst = if i % 4 == 0 {
                    let (a, b) = shared_left.split_at(len);
                    shared_left = b;
                    a
                } else {
                    let (first, tail) = rest.split_first_mut().unwrap();
                    rest = tail;
                    first.as_mem_mut()
                };
                reqs.push(ReadRequest {
                    offset: off,
                    dst,
                    done: 0,
                });
            }
            file.read_batch(&mut reqs).unwrap();
            for (r, &(off, len)) in reqs.iter().zip(&layout) {
                let end = (off as usize + len).min(host.len());
                assert_eq!(r.done, end - off as usize, "request at {off}");
            }
        }
        let mut at = 0;
        let shared_bytes = shared.to_vec().unwrap();
        let mut own_iter = own.iter();
        for (i, &(off, len)) in layout.iter().enumerate() {
            let end = (off as usize + len).min(host.len());
            let want = &host[off as usize..end];
            if i % 4 == 0 {
                same(
                    &format!("request {i}"),
                    &shared_bytes[at..at + want.len()],
                    want,
                );
                at += len;
            } else {
                let b = own_iter.next().unwrap().to_vec().unwrap();
                same(&format!("request {i}"), &b[..want.len()], want);
            }
        }
        assert!(
            stat("calls.cuFileBatchIOSubmit") >= 5,
            "300 requests in batches of at most 64"
        );
        assert!(
            stat("calls.cuFileBufRegister") >= 1,
            "the shared buffer was reused"
        );

        // A registered buffer read again through read_at, at an offset inside it.
        let len = shared_len - 4096;
        let (_, tail) = shared.as_mem_mut().split_at(4096);
        assert_eq!(file.read_at(12_345, tail).unwrap(), len);
        same(
            "read_at into a registered buffer",
            &shared.to_vec().unwrap()[4096..],
            &host[12_345..12_345 + len],
        );
        // And written from, at an aligned offset: cuFileWrite from a registered base.
        let out = dir.path().join("out.bin");
        let w = backend.open(&out, OpenMode::Truncate).unwrap();
        let tail = MemRef::Device(shared.slice(8192, shared.len() - 8192));
        w.write_at(1 << 20, tail).unwrap();
        w.sync().unwrap();
        let written = std::fs::read(&out).unwrap();
        same(
            "write from a registered buffer",
            &written[1 << 20..],
            &shared.to_vec().unwrap()[8192..],
        );
        assert!(stat("calls.cuFileWrite") >= 1);
        drop((w, file, backend, shared, own));
        assert_clean("gds batches");
    }
);

scenario_test!(
    stand_in_conformance_on_a_second_device_binds_its_context,
    [("FASTENSOR_STAND_IN_DEVICES", "2")],
    || {
        // Two devices: every cuFile call and copy must run with the right device's context.
        let memory = DeviceMemory { ordinal: 1 };
        let gds = GdsBackend::new(GdsConfig {
            chunk_size: 256 << 10,
            ..GdsConfig::default()
        });
        assert_conformance_with_memory(&gds, &[&memory]);
        let staged = StagedBackend::new(StagedConfig {
            buffer_size: 128 << 10,
            ..StagedConfig::default()
        });
        assert_conformance_with_memory(&staged, &[&memory]);
        drop((gds, staged));
        assert_clean("conformance on device 1");
    }
);

/// An engine that may use only `posix` (for the header) and the CUDA backend `device` (for
/// the tensors; registered by `fastensor-gds`, linked into this test).
fn engine(device: &str) -> Engine {
    Engine::builder()
        .backends(["posix", device])
        .build()
        .unwrap()
}

scenario_test!(
    stand_in_checkpoint_saved_from_and_loaded_into_device_memory_matches_host,
    [],
    || {
        let dir = tempfile::tempdir().unwrap();
        let shapes: [(&str, DType, &[u64]); 5] = [
            ("embed", DType::F32, &[1000, 257]),
            ("norm.bias", DType::BF16, &[257]),
            ("empty", DType::F16, &[0, 4]),
            ("scalar", DType::I64, &[]),
            ("head", DType::U8, &[3, 1_500_001]),
        ];
        let tensors: Vec<(TensorDesc, Vec<u8>)> = shapes
            .iter()
            .enumerate()
            .map(|(i, (n, d, s))| {
                let desc = TensorDesc::new(*n, *d, s.to_vec());
                let data = bytes(desc.byte_len().unwrap() as usize, 40 + i as u64);
                (desc, data)
            })
            .collect();
        for name in [fastensor_gds::GDS, fastensor_gds::CUDA_STAGED] {
            let engine = engine(name);
            let path = dir.path().join(format!("{name}.safetensors"));
            // Saved from device memory through the CUDA backend...
            let on_device: Vec<DeviceBuffer> = tensors
                .iter()
                .map(|(_, b)| DeviceBuffer::from_host(b, 0).unwrap())
                .collect();
            let views: Vec<TensorView<'_>> = tensors
                .iter()
                .zip(&on_device)
                .map(|((d, _), b)| TensorView::new(d.clone(), b.as_mem()))
                .collect();
            checkpoint::save(&engine, &path, &views).unwrap();
            drop(views);
            // ...read back on the host, by a reader that knows no CUDA...
            let host = checkpoint::load(&fastensor::posix::PosixBackend, &path).unwrap();
            for (d, b) in &tensors {
                let (_, got) = host.tensor(&d.name).unwrap();
                same(&format!("{name}: saved {}", d.name), got, b);
            }
            // ...and loaded into fresh device buffers.
            let mut targets: Vec<DeviceBuffer> = tensors
                .iter()
                .map(|(d, _)| DeviceBuffer::new(d.byte_len().unwrap() as usize, 0).unwrap())
                .collect();
            let pairs: Vec<(&str, MemMut<'_>)> = tensors
                .iter()
                .zip(targets.iter_mut())
                .map(|((d, _), b)| (d.name.as_str(), b.as_mem_mut()))
                .collect();
            checkpoint::load_into(&engine, &path, pairs).unwrap();
            for ((d, _), b) in tensors.iter().zip(&targets) {
                let (_, want) = host.tensor(&d.name).unwrap();
                same(
                    &format!("{name}: loaded {}", d.name),
                    &b.to_vec().unwrap(),
                    want,
                );
            }
            let used = engine.report().to_string();
            assert!(used.contains(name), "{name} was not used:\n{used}");
            drop((engine, on_device, targets));
        }
        assert_clean("checkpoints");
    }
);
