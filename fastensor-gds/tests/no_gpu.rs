//! Without CUDA nothing panics: probing, opening, allocating and copying give errors that
//! say why. Where the CUDA driver loads (a GPU, or the CUDA stand-in) these checks skip,
//! saying so (the conformance tests cover that machine).

use fastensor_core::{Availability, Backend, ErrorKind, OpenMode};
use fastensor_gds::{cuda, DeviceBuffer, GdsBackend, GdsConfig, StagedBackend};
use std::panic::catch_unwind;

/// Why the no-GPU checks cannot run here: the CUDA driver loads.
const CUDA_HERE: &str = "the CUDA driver loads here (a GPU or the CUDA stand-in): the no-GPU \
                         checks do not apply";

#[test]
fn nothing_panics_without_cuda() {
    if cuda::driver().is_ok() {
        fastensor_testkit::skip!("{CUDA_HERE}");
    }
    let result = catch_unwind(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, [1u8; 100]).unwrap();
        let backends: Vec<Box<dyn Backend>> = vec![
            Box::new(GdsBackend::default()),
            Box::new(StagedBackend::default()),
        ];
        for b in &backends {
            let Availability::Unavailable { reason } = b.probe() else {
                panic!("{} is available without CUDA", b.name());
            };
            eprintln!("{}: {reason}", b.name());
            assert!(reason.contains("libcuda"), "{reason}");
            assert_eq!(b.detail(), None, "no detail while unavailable");
            let caps = b.capabilities();
            assert!(caps.device_memory && !caps.host_memory);
            let err = b.open(&path, OpenMode::Read).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
            assert!(err.to_string().contains("f.bin"), "{err}");
            // A second probe answers from the cached reason.
            assert_eq!(
                b.probe(),
                Availability::Unavailable {
                    reason: reason.clone()
                }
            );
        }
        let err = DeviceBuffer::new(1 << 20, 0).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        let err = DeviceBuffer::from_host(&[1, 2, 3], 0).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        let err = fastensor_gds::copy_to_device(0x1000, 0, &[1, 2, 3]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert!(fastensor_gds::gpus().contains("libcuda"));
    });
    assert!(result.is_ok(), "a call panicked without CUDA");
}

#[test]
fn an_explicit_cufile_path_is_reported() {
    if cuda::driver().is_ok() {
        fastensor_testkit::skip!("{CUDA_HERE}");
    }
    let b = GdsBackend::new(GdsConfig {
        cufile_path: Some("/opt/nowhere/libcufile.so.0".into()),
        ..GdsConfig::default()
    });
    // Without CUDA the driver is the first problem; the reason still says so precisely.
    let Availability::Unavailable { reason } = b.probe() else {
        panic!("available without CUDA");
    };
    assert!(reason.starts_with("libcuda.so.1 not found"), "{reason}");
    assert!(
        reason.contains("libcufile.so.0 not found either"),
        "{reason}"
    );
}
