//! What an engine chose and measured.

use super::Engine;
use crate::profile::Warning;
use fastensor_select::{human_bytes, Dictionary, SelectorStats};
use std::fmt;
use std::time::Duration;

/// How much one backend was used.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendUsage {
    /// Backend name.
    pub name: String,
    /// Transfers it ran.
    pub transfers: u64,
    /// Bytes it moved.
    pub bytes: u64,
    /// Wall-clock time of those transfers.
    pub wall: Duration,
    /// CPU time of those transfers: the CPU clock is read on a share of them (see
    /// [`Engine`]), and the time measured is scaled to all their bytes.
    pub cpu: Duration,
}

impl BackendUsage {
    /// Throughput in GB/s (0 when nothing was timed).
    pub fn gb_per_s(&self) -> f64 {
        let s = self.wall.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 / s / 1e9
        } else {
            0.0
        }
    }
}

/// A summary of an engine: per backend use, selector counters, and the dictionary (per
/// context: the choice and every candidate's estimate). `Display` renders tables.
#[derive(Debug, Clone)]
pub struct Report {
    /// Available backends.
    pub backends: Vec<String>,
    /// The pinned backend, if any.
    pub pinned: Option<String>,
    /// Use per backend, sorted by name.
    pub usage: Vec<BackendUsage>,
    /// Selector counters.
    pub stats: SelectorStats,
    /// What was learned.
    pub dictionary: Dictionary,
    /// Why the profile was not loaded, if it was not.
    pub warning: Option<Warning>,
}

impl Report {
    pub(crate) fn of(engine: &Engine) -> Report {
        let inner = &engine.inner;
        let mut usage: Vec<BackendUsage> = inner
            .candidates
            .iter()
            .zip(inner.measurer.usage())
            .filter_map(|(c, u)| {
                let (transfers, bytes, wall, cpu) = u.totals();
                (transfers > 0).then(|| BackendUsage {
                    name: c.name().to_string(),
                    transfers,
                    bytes,
                    wall,
                    cpu,
                })
            })
            .collect();
        usage.sort_by(|a, b| a.name.cmp(&b.name));
        let sel = inner.measurer.selector();
        Report {
            backends: engine.backend_names(),
            pinned: engine.pinned(),
            usage,
            stats: inner.measurer.stats(&sel),
            dictionary: sel.dictionary(),
            warning: engine.inner.warning.clone(),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "backends: {}", self.backends.join(", "))?;
        if let Some(p) = &self.pinned {
            writeln!(f, "pinned: {p}")?;
        }
        if let Some(w) = &self.warning {
            writeln!(f, "warning: {w}")?;
        }
        let s = self.stats;
        writeln!(
            f,
            "choices {}  explorations {}  re-explorations {}  contexts {}",
            s.choices, s.explorations, s.reexplorations, s.keys
        )?;
        for u in &self.usage {
            writeln!(
                f,
                "{:14} {:8} transfers  {:>12}  {:9.3} s  {:7.3} GB/s  cpu {:8.3} s",
                u.name,
                u.transfers,
                human_bytes(u.bytes),
                u.wall.as_secs_f64(),
                u.gb_per_s(),
                u.cpu.as_secs_f64()
            )?;
        }
        write!(f, "{}", crate::profile::Table(&self.dictionary))
    }
}
