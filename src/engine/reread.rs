//! Which bytes of a file were read already: how much of a workload's reading is reading
//! again (see [`fastensor_select::Reuse`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The byte ranges of one file read so far, merged, up to [`ReadRanges::MAX_RANGES`] of
/// them (past that, new ranges are not tracked: a file read at random in small pieces
/// costs the bookkeeping nothing more).
#[derive(Debug, Default)]
pub(crate) struct ReadRanges {
    /// start -> end of disjoint, non-adjacent ranges.
    ranges: BTreeMap<u64, u64>,
}

impl ReadRanges {
    /// The most ranges tracked per file.
    pub(crate) const MAX_RANGES: usize = 4096;

    /// Adds `start..end`; returns how many of its bytes had been read before.
    pub(crate) fn add(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let mut again = 0;
        let (mut lo, mut hi) = (start, end);
        // Ranges that overlap or touch start..end: the one starting at or before `start`,
        // and those starting inside.
        let first = self
            .ranges
            .range(..=start)
            .next_back()
            .map(|(&s, _)| s)
            .unwrap_or(start);
        let touching: Vec<(u64, u64)> = self
            .ranges
            .range(first..=end)
            .map(|(&s, &e)| (s, e))
            .filter(|&(s, e)| e >= start && s <= end)
            .collect();
        for (s, e) in &touching {
            again += e.min(&end).saturating_sub(*s.max(&start));
            lo = lo.min(*s);
            hi = hi.max(*e);
        }
        if touching.is_empty() && self.ranges.len() >= Self::MAX_RANGES {
            return again;
        }
        for (s, _) in touching {
            self.ranges.remove(&s);
        }
        self.ranges.insert(lo, hi);
        again
    }
}

/// Bytes read for the first time and read again, over an engine's life.
#[derive(Debug, Default)]
pub(crate) struct ReadCounts {
    first: AtomicU64,
    again: AtomicU64,
}

impl ReadCounts {
    /// Counts a read of `bytes` of which `again` had been read before.
    pub(crate) fn add(&self, bytes: u64, again: u64) {
        let again = again.min(bytes);
        self.first.fetch_add(bytes - again, Ordering::Relaxed);
        self.again.fetch_add(again, Ordering::Relaxed);
    }

    /// The share of first-read bytes that were read again (0 before any read).
    pub(crate) fn rate(&self) -> f64 {
        let first = self.first.load(Ordering::Relaxed);
        if first == 0 {
            return 0.0;
        }
        self.again.load(Ordering::Relaxed) as f64 / first as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_are_counted_and_ranges_merged() {
        let mut r = ReadRanges::default();
        assert_eq!(r.add(0, 100), 0);
        assert_eq!(r.add(100, 200), 0); // adjacent: merged
        assert_eq!(r.ranges.len(), 1);
        assert_eq!(r.add(50, 150), 100);
        assert_eq!(r.add(300, 400), 0);
        assert_eq!(r.ranges.len(), 2);
        // Spans the gap: 100 bytes again on each side.
        assert_eq!(r.add(100, 400), 200);
        assert_eq!(r.ranges.len(), 1);
        assert_eq!(r.add(0, 400), 400);
        assert_eq!(r.add(5, 5), 0);
    }

    #[test]
    fn tracking_stops_growing_at_the_cap() {
        let mut r = ReadRanges::default();
        for i in 0..(ReadRanges::MAX_RANGES as u64 + 10) {
            r.add(i * 10, i * 10 + 5);
        }
        assert_eq!(r.ranges.len(), ReadRanges::MAX_RANGES);
        // Known ranges still count.
        assert_eq!(r.add(0, 5), 5);
    }

    #[test]
    fn the_rate_is_again_over_first() {
        let c = ReadCounts::default();
        assert_eq!(c.rate(), 0.0);
        c.add(100, 0);
        c.add(100, 50);
        assert_eq!(c.rate(), 50.0 / 150.0);
    }
}
