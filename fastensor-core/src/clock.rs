//! The time source of an engine: wall-clock and process CPU time, injectable by tests.

use std::time::Duration;

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
