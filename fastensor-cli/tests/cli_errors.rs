//! Errors and outputs of `bench` that say what happened: `--json -` and `--csv -` carry only
//! their format, settings that cannot be measured are refused up front, odd sizes skip the
//! `raw` row with the reason, and `--dir` that is a file says so.

mod common;

use common::{fastensor, stderr};
use std::path::Path;
use std::process::Output;

fn bench(dir: &Path, extra: &[&str]) -> Output {
    fastensor()
        .args([
            "bench",
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--backends",
            "posix",
        ])
        .args(["--random-reads", "0", "--dir"])
        .arg(dir)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn json_and_csv_to_stdout_carry_only_their_format() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(dir.path(), &["--sizes", "4K", "--json", "-"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert!(v["cells"].as_array().is_some_and(|c| !c.is_empty()));
    assert!(
        stderr(&out).contains("fastensor bench:"),
        "the table goes to stderr"
    );
    let out = bench(dir.path(), &["--sizes", "4K", "--csv", "-"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let csv = String::from_utf8_lossy(&out.stdout);
    let header = csv.lines().next().unwrap_or_default();
    assert!(!csv.contains("fastensor bench:"), "{csv}");
    let columns = header.split(',').count();
    assert!(columns > 3, "{header}");
    assert!(
        csv.lines()
            .filter(|l| !l.is_empty())
            .all(|l| l.split(',').count() == columns),
        "{csv}"
    );
    let out = bench(dir.path(), &["--sizes", "4K", "--csv", "-", "--json", "-"]);
    assert!(!out.status.success());
}

#[test]
fn sizes_and_repeats_of_zero_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (args, what) in [
        (&["--sizes", "0"][..], "--sizes"),
        (&["--sizes", "4K,0"][..], "--sizes"),
        (&["--sizes", "4K", "--repeat", "0"][..], "--repeat"),
    ] {
        let out = bench(dir.path(), args);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(stderr(&out).contains(what), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn odd_sizes_skip_raw_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(dir.path(), &["--sizes", "3,4097,4K", "--json", "-"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("raw skipped at"), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cells = v["cells"].as_array().unwrap();
    let size_of = |c: &serde_json::Value| c["size"].as_u64().or_else(|| c["bytes"].as_u64());
    let raw: Vec<_> = cells
        .iter()
        .filter(|c| c.to_string().contains("\"raw\""))
        .collect();
    assert!(!raw.is_empty(), "raw still measures 4 KiB");
    assert!(raw
        .iter()
        .all(|c| size_of(c) != Some(3) && size_of(c) != Some(4097)));
}

#[test]
fn a_dir_that_is_a_file_is_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let out = bench(&file, &["--sizes", "4K"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not a directory"), "{}", stderr(&out));
    let out = bench(&dir.path().join("missing"), &["--sizes", "4K"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("No such file"), "{}", stderr(&out));
}
