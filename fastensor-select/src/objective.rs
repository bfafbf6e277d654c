//! What "fastest" means and what one transfer measured (per byte: a [`Sample`]).

use fastensor_core::{Error, ErrorKind};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// One measured transfer, normalised per byte.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Wall-clock nanoseconds per byte (the inverse of GB/s).
    pub time_ns_per_byte: f64,
    /// CPU nanoseconds per byte (all threads of the process).
    pub cpu_ns_per_byte: f64,
}

/// What the selector minimises, per byte moved.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Objective {
    /// Wall-clock time (the default).
    #[default]
    Time,
    /// CPU time of the process, so that transfers leave the cores to computation.
    Cpu,
    /// `time * wall + cpu * cpu_time`.
    Weighted {
        /// Weight of wall-clock time.
        time: f64,
        /// Weight of CPU time.
        cpu: f64,
    },
}

impl Objective {
    /// The cost of one sample under this objective.
    pub fn cost(self, s: Sample) -> f64 {
        match self {
            Objective::Time => s.time_ns_per_byte,
            Objective::Cpu => s.cpu_ns_per_byte,
            Objective::Weighted { time, cpu } => {
                time * s.time_ns_per_byte + cpu * s.cpu_ns_per_byte
            }
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Objective::Time => f.write_str("time"),
            Objective::Cpu => f.write_str("cpu"),
            Objective::Weighted { time, cpu } => write!(f, "weighted:{time},{cpu}"),
        }
    }
}

impl FromStr for Objective {
    type Err = Error;

    /// `time`, `cpu`, or `weighted:TIME,CPU` (two non-negative weights, not both zero).
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || {
            Error::new(
                ErrorKind::InvalidInput,
                format!("unknown objective `{s}`; expected `time`, `cpu` or `weighted:TIME,CPU`"),
            )
        };
        match s.trim() {
            "time" => Ok(Objective::Time),
            "cpu" => Ok(Objective::Cpu),
            other => {
                let weights = other.strip_prefix("weighted:").ok_or_else(bad)?;
                let (t, c) = weights.split_once(',').ok_or_else(bad)?;
                let time: f64 = t.trim().parse().map_err(|_| bad())?;
                let cpu: f64 = c.trim().parse().map_err(|_| bad())?;
                let ok = |w: f64| w.is_finite() && w >= 0.0;
                if !ok(time) || !ok(cpu) || time + cpu == 0.0 {
                    return Err(bad());
                }
                Ok(Objective::Weighted { time, cpu })
            }
        }
    }
}

/// What one transfer cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Bytes moved.
    pub bytes: u64,
    /// Wall-clock time.
    pub wall: Duration,
    /// CPU time of the process (all threads).
    pub cpu: Duration,
}

impl Observation {
    /// The observation as a per-byte sample (an empty transfer counts as one byte).
    pub fn sample(&self) -> Sample {
        let bytes = self.bytes.max(1) as f64;
        Sample {
            time_ns_per_byte: self.wall.as_nanos() as f64 / bytes,
            cpu_ns_per_byte: self.cpu.as_nanos() as f64 / bytes,
        }
    }
}
