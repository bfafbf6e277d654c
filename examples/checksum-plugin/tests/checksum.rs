//! The checksum plugin passes the conformance suite, shows up in the registry as a
//! compiled-in plugin, and catches bytes that changed behind its back.

use checksum_plugin::{ChecksumBackend, Record, CHECKSUM_POSIX};
use fastensor_core::{Backend, BackendFileExt, ErrorKind, OpenMode, Origin, Registry};

#[test]
fn passes_the_conformance_suite() {
    let backend = ChecksumBackend::over_posix();
    let report = fastensor_testkit::conformance::assert_conformance(&backend);
    assert!(report.skipped.is_none());
    // The suite's writes were recorded and its reads verified against them.
    assert!(backend.verified_ranges() > 0);
}

#[test]
fn is_listed_as_a_compiled_in_plugin() {
    checksum_plugin::link();
    let registry = Registry::compiled_in();
    let entry = registry.entry(CHECKSUM_POSIX).unwrap();
    assert_eq!(
        entry.origin,
        Origin::CompiledInPlugin {
            module: "checksum_plugin"
        }
    );
    assert_eq!(
        entry.origin.to_string(),
        "compiled-in plugin (checksum_plugin)"
    );
    // The backend it wraps is fastensor's own.
    assert_eq!(registry.entry("posix").unwrap().origin, Origin::BuiltIn);
    assert!(entry.backend.probe().is_available());
}

#[test]
fn records_checksums_and_detects_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tensor.bin");
    let backend = ChecksumBackend::over_posix();
    let f = backend.open(&path, OpenMode::Create).unwrap();
    let a = vec![1u8; 4096];
    let b = vec![2u8; 100];
    f.write_at(0, a.as_slice().into()).unwrap();
    f.write_at(4096, b.as_slice().into()).unwrap();
    assert_eq!(
        backend.checksums(&path),
        vec![
            Record {
                offset: 0,
                len: 4096,
                crc32: crc32fast::hash(&a)
            },
            Record {
                offset: 4096,
                len: 100,
                crc32: crc32fast::hash(&b)
            },
        ]
    );
    // A whole-file read verifies both ranges.
    assert_eq!(f.read_all().unwrap().len(), 4196);
    assert_eq!(backend.verified_ranges(), 2);

    // Another writer flips a byte of the second range.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4100] ^= 0xFF;
    std::fs::write(&path, &bytes).unwrap();
    let mut dst = vec![0u8; 100];
    let err = f.read_at(4096, dst.as_mut_slice().into()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    let text = err.to_string();
    assert!(text.contains("checksum mismatch"), "{text}");
    assert!(text.contains(&*path.to_string_lossy()), "{text}");
    assert!(text.contains("offset 4096"), "{text}");
    // The untouched range still reads fine; a partial read of the damaged one is not checked.
    let mut dst = vec![0u8; 4096];
    f.read_at(0, dst.as_mut_slice().into()).unwrap();
    let mut dst = vec![0u8; 10];
    f.read_at(4096, dst.as_mut_slice().into()).unwrap();

    // Rewriting the range records the new bytes; cutting the file forgets what lies past the end.
    f.write_at(4096, b.as_slice().into()).unwrap();
    let mut dst = vec![0u8; 100];
    f.read_at(4096, dst.as_mut_slice().into()).unwrap();
    f.set_len(4096).unwrap();
    assert_eq!(backend.checksums(&path).len(), 1);
}
