//! `posix-direct` knobs: listed with defaults, applied by `with_knobs`, bad ones refused.

use fastensor_core::{Backend, ErrorKind, Knobs};
use fastensor_posix::DirectBackend;

#[test]
fn direct_knobs_apply_and_bad_ones_are_refused() {
    let b = DirectBackend::default();
    let specs = b.knobs();
    let threads = specs.iter().find(|s| s.name == "threads").unwrap();
    assert_eq!(threads.default, "4");
    assert!(threads.candidates.contains(&"1".to_string()));
    let mut k = Knobs::new();
    k.set("threads", "2").set("chunk", "1M");
    let tuned = b.with_knobs(&k).unwrap();
    assert_eq!(tuned.name(), "posix-direct");
    assert_eq!(tuned.capabilities().queue_depth, 2);
    let mut bad = Knobs::new();
    bad.set("qd", "4");
    assert_eq!(
        b.with_knobs(&bad).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    let mut bad = Knobs::new();
    bad.set("chunk", "lots");
    assert_eq!(
        b.with_knobs(&bad).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    // Backends without knobs say so.
    let err = fastensor_posix::PosixBackend.with_knobs(&k).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(fastensor_posix::PosixBackend.knobs().is_empty());
}
