//! How much guarded memory a break can move before the kernel lets the writer go.
//!
//! The kernel holds a writer for at most `/proc/sys/fs/lease-break-time` seconds (45 by
//! default, settable by the administrator); a break whose memory is still being moved then
//! lets the writer change the pages not moved yet. Moving runs at the speed of faulting
//! in fresh memory and copying into it, which on some machines is 1-3 s a GB: a load of a
//! few tens of GB (or a few hundred MB with a short lease-break time) cannot be moved in
//! time. So a mapping is guarded only where every lease on its file, answered one after
//! the other, can be moved within half the lease-break time at the rate measured on this
//! machine (the other half is the margin for pages that were evicted, which come back at
//! the device's speed); a load that does not fit reads its file instead.
//!
//! The rate is the slowest measured in this process: by each break that moved enough bytes
//! to time, and, before any, by moving a scratch mapping once (only for loads large enough
//! that a pessimistic rate would not pass them anyway).

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The lease-break time where `/proc/sys/fs/lease-break-time` cannot be read (the kernel's
/// default).
const DEFAULT_BREAK_TIME: u64 = 45;

/// A rate no machine moves memory slower than (bytes a second): loads whose move takes at
/// most the allowed time at this rate pass without a measurement.
const PESSIMISTIC_RATE: u64 = 64 << 20;

/// Bytes the scratch measurement moves, and the fewest bytes a break must move to count.
const SAMPLE: usize = 32 << 20;

/// The slowest move rate measured in this process (bytes a second); 0 before any.
static RATE: AtomicU64 = AtomicU64::new(0);

/// A mapping whose guarded memory could not be moved before the writer is let go.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TooSlow {
    /// Bytes a break of the file's leases would move (this mapping's and the others').
    pub bytes: u64,
    /// The move rate measured here, bytes a second.
    pub rate: u64,
    /// `/proc/sys/fs/lease-break-time`, seconds.
    pub break_time: u64,
}

impl fmt::Display for TooSlow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a lease break would move {:.2} GB at the {:.2} GB/s measured here, about {:.1} s, \
             more than half of the {} s the kernel holds a writer \
             (/proc/sys/fs/lease-break-time)",
            self.bytes as f64 / 1e9,
            self.rate as f64 / 1e9,
            self.bytes as f64 / self.rate.max(1) as f64,
            self.break_time
        )
    }
}

impl std::error::Error for TooSlow {}

/// `/proc/sys/fs/lease-break-time` now (it may change at any time), seconds.
pub fn break_time() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/lease-break-time")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(DEFAULT_BREAK_TIME)
}

/// Whether a break that moves `bytes` ends within half the lease-break time, at the rate
/// measured in this process (measured now where none was yet and `bytes` needs it).
pub(crate) fn check(bytes: u64) -> Result<(), TooSlow> {
    let break_time = break_time();
    let allowed = |rate: u64| (rate as u128 * break_time as u128 / 2) as u64;
    if bytes <= allowed(PESSIMISTIC_RATE) {
        return Ok(());
    }
    let rate = match RATE.load(Ordering::Relaxed) {
        0 => match measure() {
            Ok(rate) => record(rate),
            Err(_) => PESSIMISTIC_RATE,
        },
        rate => rate,
    };
    if bytes <= allowed(rate) {
        Ok(())
    } else {
        Err(TooSlow {
            bytes,
            rate,
            break_time,
        })
    }
}

/// Counts a break that moved `bytes` in `nanos`, where enough to time.
pub(crate) fn note_move(bytes: u64, nanos: u64) {
    if bytes >= SAMPLE as u64 && nanos > 0 {
        record((bytes as u128 * 1_000_000_000 / nanos as u128) as u64);
    }
}

/// Keeps `rate` where it is the slowest so far; returns the rate kept.
fn record(rate: u64) -> u64 {
    let rate = rate.max(1);
    let prev = RATE.fetch_min(rate, Ordering::Relaxed);
    if prev == 0 {
        RATE.store(rate, Ordering::Relaxed); // the first: `fetch_min` kept the 0
        rate
    } else {
        prev.min(rate)
    }
}

/// The rate of one move of a scratch mapping of [`SAMPLE`] bytes, written first (as a
/// load's pages are in memory), as a break moves memory.
fn measure() -> io::Result<u64> {
    let mut map = memmap2::MmapMut::map_anon(SAMPLE)?;
    map.fill(1);
    let start = map.as_ptr() as usize;
    let t0 = Instant::now();
    let whole = std::iter::once(start..start + SAMPLE).collect::<Vec<_>>();
    super::anon::move_ranges(&whole)?;
    let nanos = t0.elapsed().as_nanos().max(1);
    drop(map); // the moved pages are at the same addresses: unmapped as the map's
    Ok((SAMPLE as u128 * 1_000_000_000 / nanos) as u64)
}

/// The slowest rate measured in this process so far (bytes a second), if any.
pub fn rate() -> Option<u64> {
    match RATE.load(Ordering::Relaxed) {
        0 => None,
        r => Some(r),
    }
}
