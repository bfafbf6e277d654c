//! The in-memory reference backend passes the suite it helps to test.

use fastensor_testkit::conformance::assert_conformance;
use fastensor_testkit::MemoryBackend;

#[test]
fn memory_backend_passes_conformance() {
    let report = assert_conformance(&MemoryBackend::new());
    assert!(report.passed.len() >= 13, "{report}");
}

mod broken {
    //! A backend that loses the last byte of every write larger than one byte: the suite
    //! must notice.
    use fastensor_core::{
        Availability, Backend, BackendFile, Capabilities, MemMut, MemRef, OpenMode, Result,
    };
    use std::path::Path;

    pub struct Lossy(pub fastensor_testkit::MemoryBackend);

    struct LossyFile(Box<dyn BackendFile>);

    impl Backend for Lossy {
        fn name(&self) -> &str {
            "lossy"
        }
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        fn probe(&self) -> Availability {
            Availability::Available
        }
        fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
            Ok(Box::new(LossyFile(self.0.open(path, mode)?)))
        }
    }

    impl BackendFile for LossyFile {
        fn path(&self) -> &Path {
            self.0.path()
        }
        fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
            self.0.read_at(offset, dst)
        }
        fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
            let keep = src.len().saturating_sub(usize::from(src.len() > 1));
            self.0.write_at(offset, src.slice(0, keep))
        }
        fn sync(&self) -> Result<()> {
            self.0.sync()
        }
        fn len(&self) -> Result<u64> {
            self.0.len()
        }
        fn set_len(&self, len: u64) -> Result<()> {
            self.0.set_len(len)
        }
    }
}

#[test]
fn the_suite_catches_a_backend_that_loses_bytes() {
    let report = fastensor_testkit::conformance::run(&broken::Lossy(MemoryBackend::new()));
    assert!(!report.ok());
    assert!(
        report
            .failed
            .iter()
            .any(|(name, _)| name.starts_with("round_trip_sizes")),
        "{report}"
    );
}

#[test]
fn an_unavailable_backend_is_skipped_and_reported() {
    let missing = fastensor_testkit::stub::StubBackend::new("missing-lib")
        .unavailable("libfoo.so.1 not found");
    let report = fastensor_testkit::conformance::run(&missing);
    assert_eq!(report.skipped.as_deref(), Some("libfoo.so.1 not found"));
    assert!(report.passed.is_empty() && report.failed.is_empty());
    assert!(report.to_string().contains("SKIPPED"));
}
