//! The `fastensor` command, run as a user runs it.

mod common;

use common::{failed, names, ok, run};

#[test]
fn backends_lists_the_posix_family_as_available() {
    let text = ok(run("backends", &[]));
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
    let table = ok(run(
        "bench --sizes 4K,1M --repeat 1 --backends posix,posix-direct,mmap --random-reads 200 \
         --random-file 8M --dir",
        &[dir.path(), "--json".as_ref(), &json, "--csv".as_ref(), &csv],
    ));
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
    let left = names(dir.path());
    assert_eq!(left.len(), 2, "{left:?}");
}

#[test]
fn bench_on_a_missing_directory_fails_clearly() {
    let err = failed(run("bench --quick --dir /nonexistent/fastensor", &[]));
    assert!(err.contains("/nonexistent/fastensor"), "{err}");
}

#[test]
fn bench_with_an_unknown_backend_lists_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let err = failed(run("bench --backends nope --dir", &[dir.path()]));
    assert!(
        err.contains("no backend named `nope`") && err.contains("posix-direct"),
        "{err}"
    );
}

#[test]
fn bad_sizes_are_refused_by_the_parser() {
    assert!(failed(run("bench --sizes 12Q --dir /tmp", &[])).contains("12Q"));
}
