//! The table and CSV renderings of a [`Report`].

use super::measure::Cache;
use super::metric::Metric;
use super::report::Report;
use crate::sizes::format_size;
use crate::table::Table;

/// A ratio with two decimals, `-` when there is none.
pub(super) fn ratio(r: Option<f64>) -> String {
    r.map_or("-".to_string(), |r| format!("{r:.2}"))
}

fn metric(m: &Metric, digits: usize) -> String {
    m.get().map_or("-".to_string(), |v| format!("{v:.digits$}"))
}

/// The first columns of the tables of cells, which say what a row measured; then `columns`.
pub(super) fn cell_table(columns: &[&str]) -> Table {
    Table::new(&[&["size", "dir", "cache", "backend"], columns].concat())
}

/// A row of a [`cell_table`]: what the cell measured (its size, direction, cache state and
/// label), then `values`.
pub(super) fn cell_row(
    bytes: u64,
    direction: &str,
    cache: Option<Cache>,
    label: &str,
    values: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let key = [
        format_size(bytes),
        direction.to_string(),
        cache.map_or("-", |c| c.as_str()).to_string(),
        label.to_string(),
    ];
    key.into_iter().chain(values).collect()
}

/// The human-readable table of the cells.
pub fn table(report: &Report) -> Table {
    let mut t = cell_table(&[
        "GB/s",
        "min..max",
        "x posix",
        "x raw",
        "CPU s/GiB",
        "p50 us",
        "p99 us",
        "CPU J/GiB",
    ]);
    for c in &report.cells {
        t.row(cell_row(
            c.bytes,
            &c.direction,
            c.cache,
            &c.label,
            [
                format!("{:.3}", c.gbps_median),
                format!("{:.3}..{:.3}", c.gbps_min, c.gbps_max),
                ratio(c.ratio_to_posix),
                ratio(c.ratio_to_raw),
                format!("{:.3}", c.cpu_s_per_gib),
                metric(&c.latency_p50_us, 0),
                metric(&c.latency_p99_us, 0),
                metric(&c.energy_cpu_j_per_gib, 2),
            ],
        ));
    }
    t
}

/// The columns of [`csv`].
pub const CSV_HEADER: &str = "label,backend,knobs,direction,cache,bytes,repeats,warmup,gbps_median,gbps_min,gbps_max,gbps_spread,cpu_s_per_gib,latency_p50_us,latency_p99_us,energy_cpu_j_per_gib,energy_gpu_j_per_gib,ratio_to_posix,ratio_to_raw";

/// CSV with a header line; unavailable metrics are empty fields (their reasons are in the
/// JSON report).
pub fn csv(report: &Report) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    let opt = |r: Option<f64>| r.map_or(String::new(), |r| format!("{r:.4}"));
    let quote = |s: &str| {
        if s.contains([',', '"']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    };
    for c in &report.cells {
        let knobs: Vec<String> = c.knobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{:.4},{:.4},{},{},{},{},{},{}\n",
            quote(&c.label),
            c.backend,
            quote(&knobs.join(";")),
            c.direction,
            c.cache.map_or("", |c| c.as_str()),
            c.bytes,
            c.repeats,
            c.warmup,
            c.gbps_median,
            c.gbps_min,
            c.gbps_max,
            c.gbps_spread,
            c.cpu_s_per_gib,
            opt(c.latency_p50_us.get()),
            opt(c.latency_p99_us.get()),
            opt(c.energy_cpu_j_per_gib.get()),
            opt(c.energy_gpu_j_per_gib.get()),
            opt(c.ratio_to_posix),
            opt(c.ratio_to_raw),
        ));
    }
    out
}
