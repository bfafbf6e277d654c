//! The results of a bench run: statistics per cell, and the table, JSON and CSV renderings.

use crate::sizes::format_size;
use crate::table::Table;
use serde::Serialize;

/// Version of the JSON layout.
pub const SCHEMA: &str = "fastensor-bench/1";

/// One (backend, direction, size) cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Backend name, or `raw` for the reference loop.
    pub backend: String,
    /// `read` or `write`.
    pub direction: String,
    /// Bytes per transfer.
    pub bytes: u64,
    /// Timed repetitions.
    pub repeats: usize,
    /// Median bandwidth, GB/s (10^9 bytes per second).
    pub gbps_median: f64,
    /// Slowest repetition, GB/s.
    pub gbps_min: f64,
    /// Fastest repetition, GB/s.
    pub gbps_max: f64,
    /// Median CPU seconds (user + system) per GiB moved.
    pub cpu_s_per_gib: f64,
    /// Median bandwidth over the `posix` backend's in the same run.
    pub ratio_to_posix: Option<f64>,
    /// Median bandwidth over the `raw` reference's in the same run.
    pub ratio_to_raw: Option<f64>,
}

/// Everything a run measured and how.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// The directory measured.
    pub dir: String,
    /// File system type and device of the directory.
    pub file_system: String,
    /// Kernel release.
    pub kernel: String,
    /// Cells in run order.
    pub cells: Vec<Cell>,
    /// Random small reads, batched and one at a time.
    pub random_reads: Vec<super::random::RandomRow>,
}

/// Median of a non-empty slice.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

impl Report {
    /// Fills the ratio columns from the `posix` and `raw` cells of the same size and direction.
    pub fn compute_ratios(&mut self) {
        let find = |cells: &[Cell], name: &str, dir: &str, bytes: u64| {
            cells
                .iter()
                .find(|c| c.backend == name && c.direction == dir && c.bytes == bytes)
                .map(|c| c.gbps_median)
        };
        let snapshot = self.cells.clone();
        for c in &mut self.cells {
            c.ratio_to_posix =
                find(&snapshot, "posix", &c.direction, c.bytes).map(|p| c.gbps_median / p);
            c.ratio_to_raw =
                find(&snapshot, "raw", &c.direction, c.bytes).map(|r| c.gbps_median / r);
        }
    }

    /// The human-readable table.
    pub fn table(&self) -> Table {
        let mut t = Table::new(&[
            "size",
            "dir",
            "backend",
            "GB/s",
            "min..max",
            "x posix",
            "x raw",
            "CPU s/GiB",
        ]);
        let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}"));
        for c in &self.cells {
            t.row(vec![
                format_size(c.bytes),
                c.direction.clone(),
                c.backend.clone(),
                format!("{:.3}", c.gbps_median),
                format!("{:.3}..{:.3}", c.gbps_min, c.gbps_max),
                ratio(c.ratio_to_posix),
                ratio(c.ratio_to_raw),
                format!("{:.3}", c.cpu_s_per_gib),
            ]);
        }
        t
    }

    /// CSV with a header line.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "backend,direction,bytes,repeats,gbps_median,gbps_min,gbps_max,cpu_s_per_gib,ratio_to_posix,ratio_to_raw\n",
        );
        let opt = |r: Option<f64>| r.map_or(String::new(), |r| format!("{r:.4}"));
        for c in &self.cells {
            out.push_str(&format!(
                "{},{},{},{},{:.4},{:.4},{:.4},{:.4},{},{}\n",
                c.backend,
                c.direction,
                c.bytes,
                c.repeats,
                c.gbps_median,
                c.gbps_min,
                c.gbps_max,
                c.cpu_s_per_gib,
                opt(c.ratio_to_posix),
                opt(c.ratio_to_raw)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
