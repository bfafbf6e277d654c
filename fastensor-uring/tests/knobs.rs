//! `uring` knobs: listed with defaults and applied by `with_knobs`.

use fastensor_core::{Backend, ErrorKind, Knobs};
use fastensor_uring::UringBackend;

#[test]
fn uring_knobs_apply() {
    let b = UringBackend::default();
    let qd = b.knobs().into_iter().find(|s| s.name == "qd").unwrap();
    assert_eq!(qd.default, "16");
    let mut k = Knobs::new();
    k.set("qd", "4").set("chunk", "512K");
    assert_eq!(b.with_knobs(&k).unwrap().capabilities().queue_depth, 4);
    let mut bad = Knobs::new();
    bad.set("threads", "4");
    assert_eq!(
        b.with_knobs(&bad).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
}
