//! The `fastensor` command, run as a user runs it.

use std::process::Command;

fn fastensor() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fastensor"))
}

#[test]
fn backends_lists_the_posix_family_as_available() {
    let out = fastensor().arg("backends").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for name in ["posix ", "posix-direct", "mmap"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        assert!(line.contains("available"), "{line}");
        assert!(line.contains("built in"), "{line}");
    }
}

#[test]
fn bench_writes_a_table_json_and_csv() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let csv = dir.path().join("out.csv");
    let out = fastensor()
        .args([
            "bench",
            "--sizes",
            "4K,1M",
            "--repeat",
            "1",
            "--backends",
            "posix,posix-direct,mmap",
            "--random-reads",
            "200",
            "--random-file",
            "8M",
            "--dir",
        ])
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .arg("--csv")
        .arg(&csv)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("x posix") && table.contains("CPU s/GiB"),
        "{table}"
    );
    for row in ["posix-direct", "mmap", "raw"] {
        assert!(
            table
                .lines()
                .any(|l| l.contains(row) && l.contains("1 MiB")),
            "{row} missing:\n{table}"
        );
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["schema"], "fastensor-bench/2");
    let cells = report["cells"].as_array().unwrap();
    // 2 sizes x (3 readers + raw) reads + 2 sizes x (2 writers + raw) writes
    assert_eq!(cells.len(), 2 * 4 + 2 * 3);
    for c in cells {
        assert!(c["gbps_median"].as_f64().unwrap() > 0.0, "{c}");
        if c["backend"] == "posix" {
            assert_eq!(c["ratio_to_posix"].as_f64().unwrap(), 1.0);
        }
    }
    let random = report["random_reads"].as_array().unwrap();
    // Batch and one-at-a-time per backend, and through `auto` and `auto-explored` engines.
    assert_eq!(
        random.len(),
        (3 + 2) * 2,
        "batch and one-at-a-time per subject"
    );
    for name in ["auto", "auto-explored"] {
        assert!(
            random.iter().any(|r| r["backend"] == name),
            "{name} missing"
        );
    }
    let direct_single = random
        .iter()
        .find(|r| r["backend"] == "posix-direct" && r["mode"] == "one-at-a-time")
        .unwrap();
    assert_eq!(
        direct_single["ratio_to_direct_single"].as_f64().unwrap(),
        1.0
    );
    assert!(table.contains("random 4 KiB reads"), "{table}");
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv.lines().count(), 1 + cells.len());
    // Nothing left behind in the bench directory but the reports.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

#[test]
fn bench_on_a_missing_directory_fails_clearly() {
    let out = fastensor()
        .args(["bench", "--quick", "--dir", "/nonexistent/fastensor"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("/nonexistent/fastensor"), "{err}");
}

#[test]
fn bench_with_an_unknown_backend_lists_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let out = fastensor()
        .args(["bench", "--backends", "nope", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("no backend named `nope`") && err.contains("posix-direct"),
        "{err}"
    );
}

#[test]
fn bad_sizes_are_refused_by_the_parser() {
    let out = fastensor()
        .args(["bench", "--sizes", "12Q", "--dir", "/tmp"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr).unwrap().contains("12Q"));
}
