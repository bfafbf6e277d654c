//! The shared conformance suite on the three POSIX backends.

use fastensor_posix::{DirectBackend, DirectConfig, MmapBackend, PosixBackend};
use fastensor_testkit::conformance::assert_conformance;
use fastensor_testkit::skip::if_unavailable;

#[test]
fn posix_passes_conformance() {
    if_unavailable(&assert_conformance(&PosixBackend));
}

#[test]
fn posix_direct_passes_conformance() {
    if_unavailable(&assert_conformance(&DirectBackend::default()));
}

#[test]
fn posix_direct_with_small_chunks_passes_conformance() {
    // Small chunks and several threads: many chunks per transfer, bounce paths exercised.
    if_unavailable(&assert_conformance(&DirectBackend::new(DirectConfig {
        chunk_size: 8192,
        threads: 3,
        preallocate: true,
    })));
}

#[test]
fn mmap_passes_conformance() {
    let report = assert_conformance(&MmapBackend);
    if_unavailable(&report);
    assert!(!report.passed.is_empty());
}
