//! Loads this crate's `cdylib` through the plugin ABI and runs the conformance suite across the
//! dynamic boundary; checks that bad libraries are refused with clear errors.
//!
//! The libraries are found next to this test's executable (`target/<profile>/deps`), where
//! cargo puts the `cdylib` of this crate and of its dev-dependency `fastensor-bad-abi-plugin`.

use fastensor_core::{Backend, BackendFileExt, ErrorKind, MemoryKind, OpenMode, Origin, Registry};
use fastensor_plugin::{DynamicBackend, RegistryExt, PLUGINS_ENV};
use fastensor_testkit::cdylib;
use std::path::{Path, PathBuf};

fn plugin() -> PathBuf {
    cdylib("fastensor_example_plugin")
}

#[test]
fn conformance_through_the_dynamic_boundary() {
    let backend = DynamicBackend::load(plugin()).unwrap();
    assert_eq!(backend.name(), "example-stdfs");
    assert_eq!(backend.library_path(), plugin());
    let report = fastensor_testkit::conformance::assert_conformance(&backend);
    assert!(report.skipped.is_none());
    assert!(!report.passed.is_empty());
}

#[test]
fn registry_lists_the_plugin_with_its_file() {
    let mut registry = Registry::new();
    let name = registry.load_plugin(plugin()).unwrap();
    assert_eq!(name, "example-stdfs");
    let entry = registry.entry(&name).unwrap();
    assert_eq!(entry.origin, Origin::DynamicPlugin { path: plugin() });
    assert!(entry
        .origin
        .to_string()
        .contains("libfastensor_example_plugin"));
    assert!(entry.backend.probe().is_available());
    assert_eq!(
        entry.backend.capabilities(),
        fastensor_core::Capabilities::default()
    );
    // A second load of the same plugin is refused: the name is taken.
    let err = registry.load_plugin(plugin()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists);
    assert!(err.to_string().contains("example-stdfs"), "{err}");
}

#[test]
fn handles_keep_the_library_loaded_and_errors_keep_their_kind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.bin");
    let file = {
        let mut registry = Registry::new();
        registry.load_plugin(plugin()).unwrap();
        let backend = registry.get("example-stdfs").unwrap();
        backend.open(&path, OpenMode::Create).unwrap()
        // The registry and the backend are gone here; the handle keeps the library.
    };
    file.write_at(3, b"hello"[..].into()).unwrap();
    file.sync().unwrap();
    assert_eq!(file.len().unwrap(), 8);
    assert_eq!(&file.read_all().unwrap()[..], b"\0\0\0hello");
    file.set_len(4).unwrap();
    assert_eq!(file.len().unwrap(), 4);
    drop(file);

    // An OS error crosses the boundary with its kind, the file, the backend and errno.
    let backend = DynamicBackend::load(plugin()).unwrap();
    let missing = dir.path().join("missing.bin");
    let err = backend.open(&missing, OpenMode::Read).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(err.raw_os_error(), Some(2));
    assert_eq!(err.backend(), Some("example-stdfs"));
    let text = err.to_string();
    assert!(text.contains(&*missing.to_string_lossy()), "{text}");
}

#[test]
fn device_memory_is_refused_before_the_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let backend = DynamicBackend::load(plugin()).unwrap();
    assert!(!backend
        .capabilities()
        .supports_memory(MemoryKind::Device { ordinal: 0 }));
    let f = backend
        .open(&dir.path().join("d.bin"), OpenMode::Create)
        .unwrap();
    // SAFETY: the pointer is never dereferenced: the backend refuses device memory first.
    let dev = unsafe { fastensor_core::DeviceSlice::from_raw(0x1000, 16, 0) };
    let err = f
        .write_at(0, fastensor_core::MemRef::Device(dev))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
}

fn assert_load_error(path: &Path, kind: ErrorKind, words: &str) {
    let err = Registry::new().load_plugin(path).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.kind(), kind, "{text}");
    assert!(text.contains(words), "`{words}` not in: {text}");
    assert!(
        text.contains(&*path.to_string_lossy()),
        "the error does not name the file: {text}"
    );
}

#[test]
fn bad_libraries_are_refused_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("plugin.so");
    std::fs::write(&text, "this is a text file, not a shared library\n").unwrap();
    let mut cases = vec![
        (
            cdylib("fastensor_bad_abi_plugin"),
            ErrorKind::Unsupported,
            "built for plugin ABI version 999, but this fastensor speaks version 1",
        ),
        (
            text,
            ErrorKind::InvalidInput,
            "not a loadable shared library",
        ),
        (
            dir.path().join("nope.so"),
            ErrorKind::NotFound,
            "no such file",
        ),
    ];
    if cfg!(target_os = "linux") {
        // libc is a perfectly good shared library, but no fastensor plugin.
        cases.push((
            PathBuf::from("libc.so.6"),
            ErrorKind::InvalidInput,
            "not a fastensor plugin (the library exports no `fastensor_plugin` symbol: ",
        ));
    }
    for (path, kind, words) in cases {
        assert_load_error(&path, kind, words);
    }
}

#[test]
fn env_list_loads_each_and_reports_each_failure() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello").unwrap();
    let list = std::env::join_paths([plugin(), PathBuf::new(), text.clone()]).unwrap();
    // The only test of this binary that touches the variable.
    std::env::set_var(PLUGINS_ENV, &list);
    let mut registry = Registry::new();
    let results = registry.load_env_plugins();
    std::env::remove_var(PLUGINS_ENV);
    assert_eq!(results.len(), 2, "the empty entry is skipped");
    assert_eq!(results[0].as_ref().unwrap(), "example-stdfs");
    let err = results[1].as_ref().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains(&*text.to_string_lossy()));
    assert_eq!(registry.names(), vec!["example-stdfs".to_string()]);
}
