//! What "fastest" means, what one transfer measured, and where time comes from.

use crate::Sample;
use fastensor_core::{Error, ErrorKind};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

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

/// A reading of a [`Clock`]: wall-clock time and process CPU time since some fixed origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClockReading {
    /// Monotonic wall-clock time.
    pub wall: Duration,
    /// CPU time.
    pub cpu: Duration,
}

impl ClockReading {
    /// The time from `earlier` to `self` (saturating at zero).
    pub fn since(&self, earlier: ClockReading) -> (Duration, Duration) {
        (
            self.wall.saturating_sub(earlier.wall),
            self.cpu.saturating_sub(earlier.cpu),
        )
    }
}

/// The time source of an engine. The real one reads the monotonic clock and the process CPU
/// clock; tests inject a virtual clock that throttled backends advance by exact amounts, so
/// selection is deterministic and nothing sleeps. Any `Fn() -> ClockReading` is a clock.
pub trait Clock: Send + Sync {
    /// The current reading.
    fn now(&self) -> ClockReading;

    /// The wall-clock part of the current reading alone. Clocks whose CPU reading is dear
    /// (a system call, about a microsecond in a VM: as much as a cached 4 KiB read) answer
    /// this one cheaply.
    fn wall(&self) -> Duration {
        self.now().wall
    }
}

impl<F: Fn() -> ClockReading + Send + Sync> Clock for F {
    fn now(&self) -> ClockReading {
        self()
    }
}
