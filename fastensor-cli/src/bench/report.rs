//! The results of a bench run (JSON schema `fastensor-bench/2`): the machine, the settings,
//! the energy sources, the budget, and statistics per cell.

use super::energy::SourceStatus;
use super::machine::Machine;
use super::measure::{Cache, Sample};
use super::metric::{latency_percentiles, median, Metric};
use super::random::RandomRow;
use super::subjects::RAW;
use super::subjects::{KnobGrid, Subject};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the JSON layout.
pub const SCHEMA: &str = "fastensor-bench/2";

/// How the run was set up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Transfer sizes, bytes.
    pub sizes: Vec<u64>,
    /// Backends measured (names, without `raw`).
    pub backends: Vec<String>,
    /// `read` and/or `write`.
    pub directions: Vec<String>,
    /// Page-cache states of reads.
    pub cache: Vec<Cache>,
    /// Timed repetitions per cell as given (`null`: automatic, see `repeat_rule`).
    pub repeat: Option<usize>,
    /// How repetitions were chosen.
    pub repeat_rule: String,
    /// Untimed transfers before each cell's timed ones.
    pub warmup: usize,
    /// Time budget, seconds (`null`: none).
    pub budget_s: Option<f64>,
    /// Knob values swept per backend.
    pub knobs: KnobGrid,
    /// The `raw` reference row was measured.
    pub raw: bool,
    /// `--quick` was given.
    pub quick: bool,
    /// Random 4 KiB reads per backend and mode (0: none).
    pub random_reads: usize,
    /// Size of the random-read file.
    pub random_file: u64,
}

/// What the budget allowed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetUse {
    /// Cells planned.
    pub cells_planned: usize,
    /// Cells measured.
    pub cells_run: usize,
    /// True when the budget ran out before every planned cell was measured.
    pub exhausted: bool,
    /// Seconds the measurements took.
    pub elapsed_s: f64,
}

/// The energy sources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnergySources {
    /// CPU package (RAPL).
    pub cpu: SourceStatus,
    /// GPU (NVML).
    pub gpu: SourceStatus,
}

/// One (backend and knobs, direction, cache, size) cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// `backend` or `backend[knob=value,...]`.
    pub label: String,
    /// Backend name, or `raw` for the reference loop.
    pub backend: String,
    /// Knob settings (empty: the backend's defaults).
    pub knobs: BTreeMap<String, String>,
    /// `read` or `write`.
    pub direction: String,
    /// Page-cache state of reads; `null` for writes.
    pub cache: Option<Cache>,
    /// Bytes per transfer.
    pub bytes: u64,
    /// Timed repetitions.
    pub repeats: usize,
    /// Untimed transfers before them.
    pub warmup: usize,
    /// Median bandwidth, GB/s (10^9 bytes per second).
    pub gbps_median: f64,
    /// Slowest repetition, GB/s.
    pub gbps_min: f64,
    /// Fastest repetition, GB/s.
    pub gbps_max: f64,
    /// (max - min) / median.
    pub gbps_spread: f64,
    /// Median CPU seconds (user + system) per GiB moved.
    pub cpu_s_per_gib: f64,
    /// Median per-request latency, microseconds (requests of at most 1 MiB).
    pub latency_p50_us: Metric,
    /// 99th-percentile per-request latency, microseconds (requests of at most 1 MiB).
    pub latency_p99_us: Metric,
    /// Median CPU package energy per GiB moved, joules (RAPL).
    pub energy_cpu_j_per_gib: Metric,
    /// GPU energy per GiB moved, joules (NVML).
    pub energy_gpu_j_per_gib: Metric,
    /// Median bandwidth over the `posix` backend's (default knobs) in the same run.
    pub ratio_to_posix: Option<f64>,
    /// Median bandwidth over the `raw` reference's in the same run.
    pub ratio_to_raw: Option<f64>,
}

/// Everything a run measured and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: String,
    /// Where it ran.
    pub machine: Machine,
    /// How.
    pub settings: Settings,
    /// Energy sources and why not.
    pub energy: EnergySources,
    /// What the budget allowed.
    pub budget: BudgetUse,
    /// Cells in run order.
    pub cells: Vec<Cell>,
    /// Random small reads, batched and one at a time.
    pub random_reads: Vec<RandomRow>,
    /// Best knob settings per swept backend (see `--write-profile`).
    #[serde(default)]
    pub best_knobs: BTreeMap<String, BTreeMap<String, String>>,
}

impl Cell {
    /// The statistics of `samples` (at least one).
    pub fn from_samples(
        subject: &Subject,
        direction: &str,
        cache: Option<Cache>,
        bytes: u64,
        warmup: usize,
        samples: &[Sample],
        gpu_reason: &str,
    ) -> Cell {
        let gib = bytes as f64 / (1u64 << 30) as f64;
        let mut bw: Vec<f64> = samples
            .iter()
            .map(|s| bytes as f64 / s.seconds.max(1e-9) / 1e9)
            .collect();
        let mut cpu: Vec<f64> = samples.iter().map(|s| s.cpu_seconds / gib).collect();
        let gbps_min = bw.iter().copied().fold(f64::INFINITY, f64::min);
        let gbps_max = bw.iter().copied().fold(0.0, f64::max);
        let gbps_median = median(&mut bw);
        let requests: Vec<f64> = samples.iter().map(|s| s.request_seconds).collect();
        let (p50, p99) = latency_percentiles(bytes, &requests);
        let energy = match samples
            .iter()
            .map(|s| s.joules.clone())
            .collect::<Result<Vec<f64>, String>>()
        {
            Ok(j) if !j.is_empty() => {
                let mut per_gib: Vec<f64> = j.iter().map(|j| j / gib).collect();
                Metric::value(median(&mut per_gib))
            }
            Ok(_) => Metric::unavailable("no timed transfers"),
            Err(why) => Metric::unavailable(why),
        };
        Cell {
            label: subject.label(),
            backend: subject.name().to_string(),
            knobs: subject.knobs.0.clone(),
            direction: direction.to_string(),
            cache,
            bytes,
            repeats: samples.len(),
            warmup,
            gbps_median,
            gbps_min,
            gbps_max,
            gbps_spread: (gbps_max - gbps_min) / gbps_median.max(1e-12),
            cpu_s_per_gib: median(&mut cpu),
            latency_p50_us: p50,
            latency_p99_us: p99,
            energy_cpu_j_per_gib: energy,
            energy_gpu_j_per_gib: Metric::unavailable(gpu_reason),
            ratio_to_posix: None,
            ratio_to_raw: None,
        }
    }

    /// The key cells are matched on across runs and against references.
    pub fn key(&self) -> (String, String, Option<Cache>, u64) {
        (
            self.label.clone(),
            self.direction.clone(),
            self.cache,
            self.bytes,
        )
    }
}

impl Report {
    /// Fills the ratio columns from the `posix` (default knobs) and `raw` cells of the same
    /// size, direction and cache state.
    pub fn compute_ratios(&mut self) {
        let find = |cells: &[Cell], label: &str, c: &Cell| {
            cells
                .iter()
                .find(|r| {
                    r.label == label
                        && r.direction == c.direction
                        && r.cache == c.cache
                        && r.bytes == c.bytes
                })
                .map(|r| r.gbps_median)
        };
        let snapshot = self.cells.clone();
        for c in &mut self.cells {
            c.ratio_to_posix = find(&snapshot, "posix", c).map(|p| c.gbps_median / p);
            c.ratio_to_raw = find(&snapshot, RAW, c).map(|r| c.gbps_median / r);
        }
    }

    /// For every backend measured at more than one knob setting, the setting with the best
    /// geometric-mean bandwidth over the cells every setting of it measured.
    pub fn compute_best_knobs(&mut self) {
        let mut by_backend: BTreeMap<&str, BTreeMap<String, Vec<&Cell>>> = BTreeMap::new();
        for c in self.cells.iter().filter(|c| !c.knobs.is_empty()) {
            by_backend
                .entry(&c.backend)
                .or_default()
                .entry(c.label.clone())
                .or_default()
                .push(c);
        }
        let mut best = BTreeMap::new();
        for (backend, settings) in by_backend {
            let place = |c: &Cell| (c.direction.clone(), c.cache, c.bytes);
            let common: Vec<_> = settings
                .values()
                .next()
                .map(|cells| cells.iter().map(|c| place(c)).collect())
                .unwrap_or_default();
            let common: Vec<_> = common
                .into_iter()
                .filter(|p| {
                    settings
                        .values()
                        .all(|cs| cs.iter().any(|c| &place(c) == p))
                })
                .collect();
            if common.is_empty() {
                continue;
            }
            let score = |cells: &Vec<&Cell>| -> f64 {
                cells
                    .iter()
                    .filter(|c| common.contains(&place(c)))
                    .map(|c| c.gbps_median.max(1e-12).ln())
                    .sum()
            };
            if let Some(cells) = settings
                .values()
                .max_by(|a, b| score(a).total_cmp(&score(b)))
            {
                best.insert(backend.to_string(), cells[0].knobs.clone());
            }
        }
        self.best_knobs = best;
    }
}
