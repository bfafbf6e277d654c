//! `fastensor tune`, `profile show` and `ckpt ...`, run as a user runs them.

mod common;

use common::{failed, names, ok, run};

#[test]
fn tune_writes_a_profile_that_profile_show_prints() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.toml");
    let out = ok(run(
        "tune --sizes 4K,64K --max-rounds 4 --dir",
        &[dir.path(), "--profile".as_ref(), &profile],
    ));
    assert!(out.contains("profile written to"), "{out}");
    assert!(profile.exists());
    // Where loads into new memory put their bytes, measured and kept in the profile.
    assert!(out.contains("loads into new memory: "), "{out}");
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(text.contains("[knobs.engine]"), "{text}");
    assert!(
        text.contains("new_loads = \"mapped\"") || text.contains("new_loads = \"read\""),
        "{text}"
    );
    let shown = ok(run("profile show", &[&profile]));
    assert!(shown.contains("fastensor dictionary"), "{shown}");
    for line in ["read", "write"] {
        assert!(
            shown.lines().any(|l| l.starts_with(line)),
            "{line} missing:\n{shown}"
        );
    }
    // Nothing but the profile is left in the directory.
    let left = names(dir.path());
    assert_eq!(left.len(), 1, "{left:?}");
}

#[test]
fn profile_show_of_a_corrupt_file_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "this is [not a profile").unwrap();
    let err = failed(run("profile show", &[&bad]));
    assert!(err.contains("bad.toml"), "{err}");
}

#[test]
fn ckpt_bench_copy_and_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(run("ckpt bench --scale 0.005 --dir", &[dir.path()]));
    for row in [
        "fastensor",
        "safetensors crate",
        "plain buffered",
        "disk (raw O_DIRECT)",
        "limit into fresh memory",
        "of fresh",
        "threads faulted in",
    ] {
        assert!(out.contains(row), "{row} missing:\n{out}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the bench cleans up"
    );

    // A small foreign-layout file: header not padded, so the data section is unaligned.
    let src = dir.path().join("small.safetensors");
    let header = br#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.extend((0..19u8).collect::<Vec<_>>());
    std::fs::write(&src, &file).unwrap();
    let table = ok(run("ckpt inspect", &[&src]));
    let row_a = table
        .lines()
        .find(|l| l.starts_with("a "))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row_a.contains("F32") && row_a.contains("[2, 2]") && row_a.trim_end().ends_with("16"),
        "{table}"
    );
    assert!(table.contains("data not aligned"), "{table}");
    let dst = dir.path().join("copy.safetensors");
    ok(run("ckpt copy", &[&src, &dst]));
    let copied = std::fs::read(&dst).unwrap();
    let hlen = u64::from_le_bytes(copied[..8].try_into().unwrap()) as usize;
    assert_eq!((8 + hlen) % 4096, 0, "the copy's data section is aligned");
    assert_eq!(&copied[8 + hlen..], &(0..19u8).collect::<Vec<_>>()[..]);

    // A truncated file is refused with its name.
    let cut = dir.path().join("cut.safetensors");
    std::fs::write(&cut, &file[..file.len() - 5]).unwrap();
    assert!(failed(run("ckpt inspect", &[&cut])).contains("cut.safetensors"));
}
