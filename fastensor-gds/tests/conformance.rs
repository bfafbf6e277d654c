//! The shared conformance suite over GPU memory. Without a GPU (or without cuFile, for `gds`)
//! the backends are unavailable and each test skips, printing SKIPPED with the reason;
//! `FASTENSOR_REQUIRE=gds,cuda-staged` turns that into a failure on a GPU machine.
//!
//! `scripts/test` runs it against the CUDA stand-in (`fastensor-testkit/cuda-stand-in`: host
//! memory, no GPU), which checks the logic, ordering, bounds and error handling, not speed;
//! `scripts/gpu-check.sh` runs it on a GPU.

use fastensor_core::Backend;
use fastensor_gds::testing::DeviceMemory;
use fastensor_gds::{GdsBackend, GdsConfig, StagedBackend, StagedConfig};
use fastensor_testkit::conformance::assert_conformance_with_memory;
use fastensor_testkit::skip;
use fastensor_testkit::test_memory::{HostMemory, TestMemory};

/// Runs the suite over `memories`; a backend unavailable here skips the test, saying why.
#[track_caller]
fn conforms(backend: &dyn Backend, memories: &[&dyn TestMemory]) {
    skip::if_unavailable(&assert_conformance_with_memory(backend, memories));
}

#[test]
fn gds_passes_conformance_on_device_memory() {
    let backend = GdsBackend::default();
    eprintln!("gds: {}", backend.describe());
    conforms(&backend, &[&HostMemory, &DeviceMemory { ordinal: 0 }]);
}

#[test]
fn gds_with_small_chunks_and_no_registration_passes_conformance() {
    let backend = GdsBackend::new(GdsConfig {
        chunk_size: 64 << 10,
        threads: 3,
        register_buffers: false,
        batch: false,
        ..GdsConfig::default()
    });
    conforms(&backend, &[&DeviceMemory { ordinal: 0 }]);
}

#[test]
fn cuda_staged_passes_conformance_on_device_memory() {
    let backend = StagedBackend::default();
    conforms(&backend, &[&HostMemory, &DeviceMemory { ordinal: 0 }]);
}

#[test]
fn cuda_staged_with_small_buffers_passes_conformance() {
    // Many chunks per transfer: three buffers in flight on each of three lanes.
    let backend = StagedBackend::new(StagedConfig {
        buffer_size: 8192,
        buffers: 3,
        threads: 3,
        direct: true,
    });
    conforms(&backend, &[&DeviceMemory { ordinal: 0 }]);
}

#[test]
fn cuda_staged_through_the_page_cache_passes_conformance() {
    let backend = StagedBackend::new(StagedConfig {
        direct: false,
        ..StagedConfig::default()
    });
    conforms(&backend, &[&DeviceMemory { ordinal: 0 }]);
}
