//! `fastensor bench` sweeps and reports: the JSON schema, CSV, the SVG chart, the profile
//! knobs, `bench compare`, the budget, and energy (unavailable here, or from a fake RAPL tree).

mod common;

use common::{failed, fastensor, ok, run};
use serde_json::Value;
use std::path::Path;

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A tiny sweep: 2 sizes, posix and posix-direct at two thread counts, cold and warm reads.
fn sweep(dir: &Path, extra: &[&str]) -> String {
    let out = fastensor()
        .args([
            "bench", "--sizes", "4K,2M", "--repeat", "1", "--warmup", "0",
        ])
        .args(["--backends", "posix,posix-direct", "--random-reads", "0"])
        .args([
            "--cache",
            "cold,warm",
            "--knobs",
            "posix-direct:threads=1,2",
        ])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .output()
        .unwrap();
    ok(out)
}

#[test]
fn sweep_writes_json_csv_svg_and_profile_knobs() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let table = sweep(
        dir.path(),
        &[
            "--json",
            &p("r.json"),
            "--csv",
            &p("r.csv"),
            "--plot",
            &p("r.svg"),
            "--write-profile",
            &p("profile.toml"),
        ],
    );
    assert!(table.contains("posix-direct[threads=2]"), "{table}");
    let r = read_json(&dir.path().join("r.json"));
    assert_eq!(r["schema"], "fastensor-bench/2");
    for key in [
        "kernel",
        "cpu_model",
        "cpus",
        "file_system",
        "device",
        "device_model",
    ] {
        assert!(
            r["machine"].get(key).is_some(),
            "machine.{key} missing: {r}"
        );
    }
    let s = &r["settings"];
    assert_eq!(s["sizes"], serde_json::json!([4096, 2 << 20]));
    assert_eq!(s["cache"], serde_json::json!(["cold", "warm"]));
    assert_eq!(
        s["knobs"]["posix-direct"]["threads"],
        serde_json::json!(["1", "2"])
    );
    assert_eq!(s["repeat"], 1);
    assert_eq!(s["warmup"], 0);
    assert_eq!(r["budget"]["exhausted"], false);
    let cells = r["cells"].as_array().unwrap();
    // 4 subjects (posix, 2 x posix-direct, raw) x 2 sizes x (write + cold + warm read)
    assert_eq!(cells.len(), 4 * 2 * 3);
    assert_eq!(r["budget"]["cells_run"], 24);
    for c in cells {
        assert!(c["gbps_median"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["gbps_min"].as_f64().unwrap() <= c["gbps_max"].as_f64().unwrap());
        let small = c["bytes"] == 4096;
        for m in ["latency_p50_us", "latency_p99_us"] {
            assert_eq!(c[m]["available"], small, "{m}: {c}");
            if small {
                assert!(c[m]["value"].as_f64().unwrap() > 0.0);
            } else {
                assert!(c[m].get("value").is_none() && c[m]["reason"].is_string());
            }
        }
        match c["direction"].as_str().unwrap() {
            "write" => assert!(c["cache"].is_null()),
            _ => assert!(c["cache"] == "cold" || c["cache"] == "warm"),
        }
        if c["label"] == "posix" {
            assert_eq!(c["ratio_to_posix"].as_f64().unwrap(), 1.0);
        }
        if c["label"] == "raw" {
            assert_eq!(c["ratio_to_raw"].as_f64().unwrap(), 1.0);
        }
    }
    let best = &r["best_knobs"]["posix-direct"]["threads"];
    assert!(best == "1" || best == "2", "{r}");
    let profile = std::fs::read_to_string(dir.path().join("profile.toml")).unwrap();
    assert!(profile.contains("[knobs.posix-direct]"), "{profile}");
    // `tune` rewrites the profile's measurements and keeps its knobs.
    ok(fastensor()
        .args(["tune", "--sizes", "4K", "--max-rounds", "1"])
        .args([
            "--backends",
            "posix,posix-direct",
            "--profile",
            &p("profile.toml"),
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap());
    let tuned = std::fs::read_to_string(dir.path().join("profile.toml")).unwrap();
    assert!(tuned.contains("[knobs.posix-direct]"), "{tuned}");
    assert!(tuned.contains("[[context]]"), "{tuned}");
    let csv = std::fs::read_to_string(dir.path().join("r.csv")).unwrap();
    assert!(csv.starts_with("label,backend,knobs,direction,cache,bytes"));
    assert_eq!(csv.lines().count(), 1 + cells.len());
    let svg = std::fs::read_to_string(dir.path().join("r.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
    for text in [
        "transfer size (bytes, log scale)",
        "bandwidth (GB/s",
        "read, cold page cache",
        "read, warm page cache",
        "write (synced to disk)",
        "posix-direct (best of 2 knob settings)",
        "raw O_DIRECT reference",
        "4 KiB",
        "2 MiB",
    ] {
        assert!(svg.contains(text), "`{text}` missing from the chart");
    }
}

#[test]
fn energy_is_unavailable_with_a_reason_never_zero() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let absent = dir.path().join("no-powercap");
    let mut args = vec!["--json", json.to_str().unwrap()];
    let real_rapl = Path::new("/sys/class/powercap/intel-rapl:0/energy_uj");
    if std::fs::read_to_string(real_rapl).is_ok() {
        // This machine has readable RAPL: test the unavailable path with a missing tree.
        args.extend(["--powercap-root", absent.to_str().unwrap()]);
    }
    let table = sweep(dir.path(), &args);
    assert!(table.contains("CPU energy unavailable"), "{table}");
    let r = read_json(&json);
    for source in ["cpu", "gpu"] {
        let e = &r["energy"][source];
        assert_eq!(e["available"], false, "{e}");
        assert!(!e["reason"].as_str().unwrap().is_empty());
    }
    assert!(r["energy"]["gpu"]["reason"]
        .as_str()
        .unwrap()
        .contains("NVML support not built"));
    for c in r["cells"].as_array().unwrap() {
        for m in ["energy_cpu_j_per_gib", "energy_gpu_j_per_gib"] {
            assert_eq!(c[m]["available"], false, "{c}");
            assert!(c[m].get("value").is_none(), "a number for {m}: {c}");
            assert!(c[m]["reason"].is_string());
        }
    }
}

#[test]
fn a_fake_rapl_tree_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let zone = dir.path().join("powercap/intel-rapl:0");
    std::fs::create_dir_all(&zone).unwrap();
    std::fs::write(zone.join("energy_uj"), "123456\n").unwrap();
    std::fs::write(zone.join("max_energy_range_uj"), "262143328850\n").unwrap();
    std::fs::write(zone.join("name"), "package-0\n").unwrap();
    let json = dir.path().join("r.json");
    sweep(
        dir.path(),
        &[
            "--json",
            json.to_str().unwrap(),
            "--powercap-root",
            dir.path().join("powercap").to_str().unwrap(),
        ],
    );
    let r = read_json(&json);
    assert_eq!(r["energy"]["cpu"]["available"], true, "{}", r["energy"]);
    assert!(r["energy"]["cpu"]["source"]
        .as_str()
        .unwrap()
        .contains("intel-rapl:0 (package-0)"));
    for c in r["cells"].as_array().unwrap() {
        // The fake counter never moves: exactly 0 J measured, not made up.
        assert_eq!(
            c["energy_cpu_j_per_gib"]["value"].as_f64(),
            Some(0.0),
            "{c}"
        );
    }
}

#[test]
fn compare_with_itself_is_one_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.json");
    sweep(dir.path(), &["--json", a.to_str().unwrap()]);
    let cmp = dir.path().join("cmp.json");
    let table = ok(run("bench compare", &[&a, &a, "--json".as_ref(), &cmp]));
    assert!(
        table.contains("geometric mean of GB/s ratios: 1.00"),
        "{table}"
    );
    let c = read_json(&cmp);
    let cells = c["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 24);
    assert_eq!(c["gbps_geomean"].as_f64(), Some(1.0));
    assert!(c["only_in_a"].as_array().unwrap().is_empty());
    assert!(c["only_in_b"].as_array().unwrap().is_empty());
    for cell in cells {
        for m in ["gbps_median", "cpu_s_per_gib"] {
            assert_eq!(cell[m].as_f64(), Some(1.0), "{m}: {cell}");
        }
        for m in ["latency_p50_us", "latency_p99_us"] {
            if cell["bytes"] == 4096 {
                assert_eq!(cell[m].as_f64(), Some(1.0), "{m}: {cell}");
            } else {
                assert!(cell[m].is_null(), "{m}: {cell}");
            }
        }
        // Energy is unavailable on both sides: no ratio.
        if std::fs::metadata("/sys/class/powercap/intel-rapl:0").is_err() {
            assert!(cell["energy_cpu_j_per_gib"].is_null(), "{cell}");
        }
    }
    // A report of another schema is refused, naming the file.
    let old = dir.path().join("old.json");
    std::fs::write(&old, r#"{"schema": "fastensor-bench/1", "cells": []}"#).unwrap();
    assert!(failed(run("bench compare", &[&old, &a])).contains("old.json"));
}

#[test]
fn a_spent_budget_reports_what_ran() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let svg = dir.path().join("r.svg");
    let table = ok(run(
        "bench run --sizes 4K --repeat 1 --budget 0s --backends posix --random-reads 0 --json",
        &[&json, "--plot".as_ref(), &svg, "--dir".as_ref(), dir.path()],
    ));
    assert!(table.contains("budget spent: measured 0 of"), "{table}");
    let r = read_json(&json);
    assert_eq!(r["budget"]["exhausted"], true);
    assert_eq!(r["budget"]["cells_run"], 0);
    assert!(r["budget"]["cells_planned"].as_u64().unwrap() > 0);
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
}

#[test]
fn unknown_knobs_and_knobs_of_unmeasured_backends_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (knobs, expect) in [
        ("posix-direct:depth=1,2", "its knobs: threads, chunk"),
        ("uring:qd=1", "not among the backends measured"),
        ("posix:threads=1", "backend `posix` has no knobs"),
    ] {
        let args = format!("bench --backends posix,posix-direct --knobs {knobs} --dir");
        let err = failed(run(&args, &[dir.path()]));
        assert!(err.contains(expect), "{knobs}: {err}");
    }
}
