//! The shared conformance suite on the `uring` backend, with the default settings and with a
//! tiny queue and small chunks that force many resubmissions and staging waits.

use fastensor_testkit::conformance::assert_conformance;
use fastensor_uring::{UringBackend, UringConfig};

#[test]
fn default_config_conforms() {
    assert_conformance(&UringBackend::default());
}

#[test]
fn tiny_queue_and_small_chunks_conform() {
    assert_conformance(&UringBackend::new(UringConfig {
        queue_depth: 2,
        chunk_size: 64 << 10,
        staging_size: 64 << 10,
        ..UringConfig::default()
    }));
}
