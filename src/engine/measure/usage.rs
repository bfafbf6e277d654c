//! Counters an engine keeps without locks: what each backend moved, events, and the
//! requests in flight.

use fastensor_sys::fork;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What one backend moved through an engine: every transfer, measured by the selector or
/// not. Atomic counters: counting costs a transfer no lock.
#[derive(Debug, Default)]
pub(crate) struct Usage {
    transfers: AtomicU64,
    bytes: AtomicU64,
    wall_ns: AtomicU64,
    /// CPU time of the transfers whose CPU clock was read.
    cpu_ns: AtomicU64,
    /// Bytes of those transfers.
    cpu_bytes: AtomicU64,
}

impl Usage {
    /// Counts a transfer of `bytes` taking `wall`, and `cpu` when it was read.
    pub(crate) fn add(&self, bytes: u64, wall: Duration, cpu: Option<Duration>) {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.transfers.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.wall_ns.fetch_add(nanos(wall), Ordering::Relaxed);
        if let Some(cpu) = cpu {
            self.cpu_ns.fetch_add(nanos(cpu), Ordering::Relaxed);
            self.cpu_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Transfers, bytes, wall time, and the CPU time of all the transfers: that of the ones
    /// measured, scaled to every byte.
    pub(crate) fn totals(&self) -> (u64, u64, Duration, Duration) {
        let bytes = self.bytes.load(Ordering::Relaxed);
        let cpu_bytes = self.cpu_bytes.load(Ordering::Relaxed);
        let cpu = Duration::from_nanos(self.cpu_ns.load(Ordering::Relaxed));
        let cpu = if cpu_bytes == 0 {
            Duration::ZERO
        } else {
            cpu.mul_f64(bytes as f64 / cpu_bytes as f64)
        };
        (
            self.transfers.load(Ordering::Relaxed),
            bytes,
            Duration::from_nanos(self.wall_ns.load(Ordering::Relaxed)),
            cpu,
        )
    }
}

/// The engine's event counters, one slot each (see [`Counters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// Loads into new host memory that mapped the file.
    MappedLoads,
    /// Loads into new host memory read through a backend.
    ReadLoads,
    /// Jobs of reads given one backend each (see `file/job.rs`).
    Jobs,
    /// Transfers timed (paces the CPU clock readings of exploiting transfers).
    Transfers,
    /// Choices answered from a file's kept answers.
    Reused,
    /// Of those, explorations.
    ReusedExploring,
    /// Bytes read for the first time (as files count them, see `reread.rs`).
    FirstReads,
    /// Bytes read again.
    AgainReads,
    /// The requests in flight, tagged with the process that counted them (see
    /// [`InFlight`]).
    InFlight,
}

impl Count {
    const ALL: usize = Count::InFlight as usize + 1;
}

/// Counters of events, without locks: counting costs a transfer no lock.
#[derive(Debug, Default)]
pub(crate) struct Counters([AtomicU64; Count::ALL]);

impl Counters {
    /// Adds `n` to the counter `c`.
    pub(crate) fn add(&self, c: Count, n: u64) -> u64 {
        self.0[c as usize].fetch_add(n, Ordering::Relaxed)
    }

    /// The counter `c`.
    pub(crate) fn get(&self, c: Count) -> u64 {
        self.0[c as usize].load(Ordering::Relaxed)
    }

    /// Applies `step` to this process's count of requests in flight; returns the new count.
    /// In a child made by `fork` the count starts from none (the requests of the parent's
    /// threads never end there): the slot holds the low 32 bits of the
    /// [`fork::generation`] that counted, then the count.
    fn update_in_flight(&self, step: impl Fn(u32) -> u32) -> u32 {
        let slot = &self.0[Count::InFlight as usize];
        let generation = fork::generation() as u32;
        let mut now = slot.load(Ordering::SeqCst);
        loop {
            let mine = (now >> 32) as u32 == generation;
            let n = step(if mine { now as u32 } else { 0 });
            let next = (u64::from(generation) << 32) | u64::from(n);
            match slot.compare_exchange_weak(now, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return n,
                Err(seen) => now = seen,
            }
        }
    }
}

/// Counts a request in flight for as long as it lives.
pub(crate) struct InFlight<'a>(&'a Counters);

impl<'a> InFlight<'a> {
    /// Counts a request in flight; with the count, this one included.
    pub(crate) fn enter(counters: &'a Counters) -> (Self, u32) {
        let n = counters.update_in_flight(|n| n.saturating_add(1));
        (InFlight(counters), n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.update_in_flight(|n| n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_scales_the_measured_cpu_time_to_every_byte() {
        let u = Usage::default();
        assert_eq!(u.totals(), (0, 0, Duration::ZERO, Duration::ZERO));
        let ms = Duration::from_millis;
        u.add(1 << 20, ms(1), Some(ms(2)));
        u.add(1 << 20, ms(1), None);
        u.add(2 << 20, ms(2), None);
        // 2 ms of CPU measured over 1 MiB of 4: 8 ms in all.
        assert_eq!(u.totals(), (3, 4 << 20, ms(4), ms(8)));
    }
}
