//! `fastensor bench compare A.json B.json`: the ratio B/A of every metric, cell by cell.

use super::metric::Metric;
use super::render::{cell_row, cell_table};
use super::report::{Cell, Report, SCHEMA};
use crate::sizes::format_size;
use clap::Args;
use fastensor::{Error, ErrorKind, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Options of `fastensor bench compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The baseline report (JSON of `fastensor bench --json`).
    pub a: PathBuf,
    /// The report compared with it; ratios are B/A.
    pub b: PathBuf,
    /// Also write the ratios as JSON to this file (`-` for standard output).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The ratios of one cell present in both reports; `None` where either side has no value.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// Backend label.
    pub label: String,
    /// `read` or `write`.
    pub direction: String,
    /// `cold`, `warm` or `null`.
    pub cache: Option<super::measure::Cache>,
    /// Bytes per transfer.
    pub bytes: u64,
    /// Median bandwidth, B/A (above 1: B is faster).
    pub gbps_median: Option<f64>,
    /// CPU seconds per GiB, B/A (below 1: B is cheaper).
    pub cpu_s_per_gib: Option<f64>,
    /// p50 latency, B/A.
    pub latency_p50_us: Option<f64>,
    /// p99 latency, B/A.
    pub latency_p99_us: Option<f64>,
    /// CPU package energy per GiB, B/A.
    pub energy_cpu_j_per_gib: Option<f64>,
}

/// The comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// `fastensor-bench-compare/1`.
    pub schema: &'static str,
    /// Cells of both, B/A.
    pub cells: Vec<Ratio>,
    /// Geometric mean of the bandwidth ratios.
    pub gbps_geomean: Option<f64>,
    /// Cells only A measured (labels with direction, cache and size).
    pub only_in_a: Vec<String>,
    /// Cells only B measured.
    pub only_in_b: Vec<String>,
}

/// b / a, 1 when both are 0, `None` when a is 0 alone or either is not finite.
fn ratio(a: f64, b: f64) -> Option<f64> {
    if !a.is_finite() || !b.is_finite() {
        None
    } else if a == 0.0 {
        (b == 0.0).then_some(1.0)
    } else {
        Some(b / a)
    }
}

fn mratio(a: &Metric, b: &Metric) -> Option<f64> {
    ratio(a.get()?, b.get()?)
}

fn describe(c: &Cell) -> String {
    format!(
        "{} {}{} {}",
        c.label,
        c.direction,
        c.cache
            .map_or(String::new(), |k| format!(" {}", k.as_str())),
        format_size(c.bytes)
    )
}

/// Reads a report, checking its schema.
pub fn load(path: &Path) -> Result<Report> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(e, "cannot read the report").with_path(path))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::new(ErrorKind::Corrupt, format!("not JSON: {e}")).with_path(path))?;
    if value["schema"] != SCHEMA {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "report schema {}; this build compares {SCHEMA}",
                value["schema"]
            ),
        )
        .with_path(path));
    }
    serde_json::from_value(value).map_err(|e| {
        Error::new(ErrorKind::Corrupt, format!("not a bench report: {e}")).with_path(path)
    })
}

/// Compares two reports cell by cell.
pub fn compare(a: &Report, b: &Report) -> Comparison {
    let mut cells = Vec::new();
    let mut only_in_a = Vec::new();
    for ca in &a.cells {
        let Some(cb) = b.cells.iter().find(|c| c.key() == ca.key()) else {
            only_in_a.push(describe(ca));
            continue;
        };
        cells.push(Ratio {
            label: ca.label.clone(),
            direction: ca.direction.clone(),
            cache: ca.cache,
            bytes: ca.bytes,
            gbps_median: ratio(ca.gbps_median, cb.gbps_median),
            cpu_s_per_gib: ratio(ca.cpu_s_per_gib, cb.cpu_s_per_gib),
            latency_p50_us: mratio(&ca.latency_p50_us, &cb.latency_p50_us),
            latency_p99_us: mratio(&ca.latency_p99_us, &cb.latency_p99_us),
            energy_cpu_j_per_gib: mratio(&ca.energy_cpu_j_per_gib, &cb.energy_cpu_j_per_gib),
        });
    }
    let only_in_b = b
        .cells
        .iter()
        .filter(|cb| !a.cells.iter().any(|ca| ca.key() == cb.key()))
        .map(describe)
        .collect();
    let logs: Vec<f64> = cells
        .iter()
        .filter_map(|r| r.gbps_median)
        .filter(|r| *r > 0.0)
        .map(f64::ln)
        .collect();
    let gbps_geomean =
        (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp());
    Comparison {
        schema: "fastensor-bench-compare/1",
        cells,
        gbps_geomean,
        only_in_a,
        only_in_b,
    }
}

/// Runs `fastensor bench compare`.
pub fn run(args: CompareArgs) -> Result<()> {
    let a = load(&args.a)?;
    let b = load(&args.b)?;
    let cmp = compare(&a, &b);
    println!(
        "B/A: A = {} ({}), B = {} ({}); GB/s above 1 means B is faster, costs below 1 mean B is cheaper",
        args.a.display(),
        a.machine.kernel,
        args.b.display(),
        b.machine.kernel
    );
    let mut t = cell_table(&["GB/s", "CPU s/GiB", "p50", "p99", "CPU J/GiB"]);
    let f = super::render::ratio;
    for r in &cmp.cells {
        let ratios = [
            r.gbps_median,
            r.cpu_s_per_gib,
            r.latency_p50_us,
            r.latency_p99_us,
            r.energy_cpu_j_per_gib,
        ];
        t.row(cell_row(
            r.bytes,
            &r.direction,
            r.cache,
            &r.label,
            ratios.map(f),
        ));
    }
    print!("{t}");
    println!("geometric mean of GB/s ratios: {}", f(cmp.gbps_geomean));
    for (which, list) in [("A", &cmp.only_in_a), ("B", &cmp.only_in_b)] {
        if !list.is_empty() {
            println!("only in {which}: {}", list.join("; "));
        }
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&cmp)
            .map_err(|e| Error::new(ErrorKind::Other, format!("cannot encode JSON: {e}")))?;
        super::write_output(path, &text)?;
    }
    Ok(())
}
