//! The profile on disk: round trip, corrupt files, another machine or format version.

use super::*;
use fastensor_core::{CacheState, Direction, FileLocation, TransferContext};
use fastensor_select::Observation;
use std::time::Duration;

/// A selector that chose among three candidates in a few contexts, fingerprinted as this
/// machine with the device its contexts name.
fn trained() -> Selector {
    let mut s = fresh(SelectorConfig::default());
    let location = FileLocation::new("ext4", "259:1");
    let mut f = s.fingerprint().clone();
    f.add_location(&location, &ThisMachine);
    s.set_fingerprint(f);
    for bytes in [4096u64, 1 << 20] {
        for direction in [Direction::Read, Direction::Write] {
            let c = TransferContext {
                cache: CacheState::Cold,
                ..TransferContext::host(direction, bytes, location.clone())
            };
            for round in 0..12u64 {
                let choice = s.choose(&c, &["x", "y", "z"]).unwrap();
                let per = match choice.backend.as_str() {
                    "x" => 10,
                    "y" => 12,
                    _ => 40,
                };
                let wall = Duration::from_nanos(bytes * per / 10 + round % 3);
                let obs = Observation {
                    bytes,
                    wall,
                    cpu: wall / 3,
                };
                s.record(&c, &choice.backend, obs);
            }
        }
    }
    s
}

#[test]
fn a_saved_profile_loads_back_equal_and_leaves_no_temporary_file() {
    let dict = trained().dictionary();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.toml");
    save(&dict, &path).unwrap();
    assert_eq!(read(&path).unwrap(), dict);
    let (loaded, warning) = load(Some(&path), SelectorConfig::default()).unwrap();
    assert!(warning.is_none(), "{warning:?}");
    assert_eq!(loaded.dictionary(), dict);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn a_corrupt_profile_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    for text in [
        "this is = = not toml",
        "version = 1\nobjective = 3",
        "version = 1\nobjective = \"time\"\n[fingerprint]\n[[context]]\ndirection = \"sideways\"\nmemory = \"host\"\nsize_class = 3\nin_flight = 0\ncache = \"cold\"\n",
    ] {
        std::fs::write(&path, text).unwrap();
        for err in [
            read(&path).unwrap_err(),
            load(Some(&path), SelectorConfig::default()).unwrap_err(),
        ] {
            assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
            assert_eq!(err.path(), Some(path.as_path()));
            assert!(err.to_string().contains("bad.toml"));
        }
    }
}

#[test]
fn a_missing_file_is_not_found_and_a_directory_invalid_input() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.toml");
    assert_eq!(read(&missing).unwrap_err().kind(), ErrorKind::NotFound);
    let err = read(dir.path()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert_eq!(err.path(), Some(dir.path()));
}

#[test]
fn another_machine_or_version_warns_and_starts_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.toml");
    let mut dict = trained().dictionary();
    dict.fingerprint.kernel = "0.0.1-elsewhere".into();
    save(&dict, &path).unwrap();
    assert!(other_machine(&dict).is_some());
    let (s, warning) = load(Some(&path), SelectorConfig::default()).unwrap();
    let warning = warning.expect("a warning");
    assert!(warning.to_string().contains("another machine"), "{warning}");
    assert!(warning.to_string().contains("p.toml"), "{warning}");
    assert!(s.keys().is_empty());

    let mut dict = trained().dictionary();
    dict.fingerprint.devices[0].model = "a disk this machine never had".into();
    save(&dict, &path).unwrap();
    let (s, warning) = load(Some(&path), SelectorConfig::default()).unwrap();
    assert!(warning.unwrap().to_string().contains("259:1"));
    assert!(s.keys().is_empty());

    let text = trained()
        .dictionary()
        .to_toml()
        .replace("version = 1", "version = 99");
    std::fs::write(&path, text).unwrap();
    let (s, warning) = load(Some(&path), SelectorConfig::default()).unwrap();
    assert!(warning.unwrap().to_string().contains("version 99"));
    assert!(s.keys().is_empty());

    // Missing, or no path at all: fresh, silently, fingerprinted as this machine.
    for path in [Some(dir.path().join("none.toml")), None] {
        let (s, warning) = load(path.as_deref(), SelectorConfig::default()).unwrap();
        assert!(warning.is_none() && s.keys().is_empty());
        assert_eq!(s.fingerprint().kernel, kernel_release());
    }
}
