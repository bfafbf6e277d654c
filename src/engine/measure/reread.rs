//! Which bytes of a file were read already: how much of a workload's reading is reading
//! again (see [`fastensor_select::Reuse`]).

use super::usage::{Count, Counters};
use std::collections::BTreeMap;

/// The byte ranges of one file read so far, merged, up to [`ReadRanges::MAX_RANGES`] of
/// them (past that, new ranges are not tracked: a file read at random in small pieces
/// costs the bookkeeping nothing more).
#[derive(Debug, Default)]
pub(crate) struct ReadRanges {
    /// start -> end of disjoint, non-adjacent ranges.
    ranges: BTreeMap<u64, u64>,
    /// The range the last read grew or made, `(start, end, start of the next range or
    /// u64::MAX)`: a stream's next read extends it with one map lookup, not three (every
    /// read of a file comes here, and a read through the page cache twice, see
    /// [`FileReads`]).
    hot: Option<(u64, u64, u64)>,
}

impl ReadRanges {
    /// The most ranges tracked per file.
    pub(crate) const MAX_RANGES: usize = 4096;

    /// The start of the first range starting after `s`.
    fn ranges_after(&self, s: u64) -> Option<u64> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.ranges
            .range((Excluded(s), Unbounded))
            .next()
            .map(|(&start, _)| start)
    }

    /// Whether every byte of `start..end` was read before (an empty range: no).
    pub(crate) fn covers(&self, start: u64, end: u64) -> bool {
        start < end
            && self
                .ranges
                .range(..=start)
                .next_back()
                .is_some_and(|(_, &e)| e >= end)
    }

    /// Adds `start..end`; returns how many of its bytes had been read before. Allocates
    /// nothing for a read that extends or falls inside a known range (a stream's reads).
    pub(crate) fn add(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        // A read inside or extending the range it starts in, reaching no other range: that
        // range grows in place.
        let known = match self.hot {
            Some((s, e, next)) if s <= start && start <= e => Some((s, e, next)),
            _ => self
                .ranges
                .range(..=start)
                .next_back()
                .map(|(&s, &e)| (s, e, self.ranges_after(s).unwrap_or(u64::MAX))),
        };
        if let Some((s, e, next)) = known {
            if e >= start && end < next {
                let grown = e.max(end);
                if grown > e {
                    if let Some(e) = self.ranges.get_mut(&s) {
                        *e = grown;
                    }
                }
                self.hot = Some((s, grown, next));
                return e.min(end) - start;
            }
        }
        self.hot = None;
        let mut again = 0;
        let (mut lo, mut hi) = (start, end);
        let mut touched = false;
        // The range starting last at or before `hi` touches `lo..hi` when it ends at or
        // after `lo`; merged in, it can only extend `hi` past ranges that would overlap it,
        // and there are none (they are disjoint), so the next one is looked up below `hi`.
        while let Some((&s, &e)) = self.ranges.range(..=hi).next_back() {
            if e < lo {
                break;
            }
            again += e.min(end).saturating_sub(s.max(start));
            lo = lo.min(s);
            hi = hi.max(e);
            touched = true;
            self.ranges.remove(&s);
        }
        if touched || self.ranges.len() < Self::MAX_RANGES {
            self.ranges.insert(lo, hi);
            self.hot = Some((lo, hi, self.ranges_after(lo).unwrap_or(u64::MAX)));
        }
        again
    }
}

/// One file's reads as the engine's counters take them (see [`Counters::add_reads`]): the
/// bytes a file reads for the first time count once it reads some bytes again, or when it
/// is closed without having done so, so that a file's first pass does not lower the re-read
/// rate while it lasts (see `docs/lab/measurement.md`).
#[derive(Debug, Default)]
pub(crate) struct FileReads {
    ranges: ReadRanges,
    /// The ranges read through a path that keeps the page cache (the bytes it left cached).
    through_cache: ReadRanges,
    /// First-read bytes not counted yet (nothing read again so far).
    pending: u64,
    /// Some bytes were read again.
    read_again: bool,
}

impl FileReads {
    /// Adds a read of `start..end` (`keeps_cache`: through a path that keeps the page
    /// cache); returns the bytes to count now, `(first, again)`.
    pub(crate) fn add(&mut self, start: u64, end: u64, keeps_cache: bool) -> (u64, u64) {
        if keeps_cache {
            self.through_cache.add(start, end);
        }
        let again = self.ranges.add(start, end);
        let first = end.saturating_sub(start) - again;
        self.read_again |= again > 0;
        if self.read_again {
            (first + std::mem::take(&mut self.pending), again)
        } else {
            self.pending += first;
            (0, 0)
        }
    }

    /// Whether every byte of `start..end` was read before (see [`ReadRanges::covers`]).
    pub(crate) fn covers(&self, start: u64, end: u64) -> bool {
        self.ranges.covers(start, end)
    }

    /// Whether every byte of `start..end` was read before through a path that keeps the
    /// page cache (see [`ReadRanges::covers`]).
    pub(crate) fn covers_through_cache(&self, start: u64, end: u64) -> bool {
        self.through_cache.covers(start, end)
    }

    /// The first-read bytes still to count, when the file is closed.
    pub(crate) fn finish(&mut self) -> u64 {
        std::mem::take(&mut self.pending)
    }
}

/// Bytes read for the first time and read again, over an engine's life (as its files
/// count them, see [`FileReads`]).
impl Counters {
    /// Counts `first` bytes read for the first time and `again` bytes read again.
    pub(crate) fn add_reads(&self, first: u64, again: u64) {
        if first > 0 {
            self.add(Count::FirstReads, first);
        }
        if again > 0 {
            self.add(Count::AgainReads, again);
        }
    }

    /// The share of first-read bytes that were read again (0 before any read).
    pub(crate) fn reread_rate(&self) -> f64 {
        let first = self.get(Count::FirstReads);
        if first == 0 {
            return 0.0;
        }
        self.get(Count::AgainReads) as f64 / first as f64
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
    fn counts_match_a_byte_map() {
        let mut r = ReadRanges::default();
        let mut seen = vec![false; 4096];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let start = x % 4000;
            let end = (start + x / 4000 % 96).min(4096);
            let expected = seen[start as usize..end as usize]
                .iter()
                .filter(|b| **b)
                .count();
            seen[start as usize..end as usize].fill(true);
            assert_eq!(r.add(start, end), expected as u64, "{start}..{end}");
        }
        // Disjoint, non-adjacent, covering exactly what was read.
        let mut last_end = None;
        for (&s, &e) in &r.ranges {
            assert!(s < e && last_end.is_none_or(|l| l < s));
            last_end = Some(e);
        }
        let covered: u64 = r.ranges.iter().map(|(s, e)| e - s).sum();
        assert_eq!(covered, seen.iter().filter(|b| **b).count() as u64);
    }

    #[test]
    fn streams_grow_their_ranges_in_place_and_stop_at_the_next() {
        let mut r = ReadRanges::default();
        assert_eq!(r.add(1000, 1100), 0);
        for i in 0..10 {
            assert_eq!(r.add(i * 10, i * 10 + 10), 0);
        }
        // Reads again inside the range just grown, then runs into the next one: merged.
        assert_eq!(r.add(50, 120), 50);
        assert_eq!(r.add(120, 1010), 10);
        assert_eq!(r.ranges.iter().collect::<Vec<_>>(), vec![(&0, &1100)]);
        // Another stream elsewhere, then the first one again.
        assert_eq!(r.add(2000, 2100), 0);
        assert_eq!(r.add(1100, 1200), 0);
        assert_eq!(r.add(2100, 2200), 0);
        assert!(r.covers(0, 1200) && r.covers(2000, 2200) && !r.covers(1150, 2050));
        assert_eq!(r.ranges.len(), 2);
    }

    #[test]
    fn covers_only_ranges_read_in_full() {
        let mut r = ReadRanges::default();
        r.add(100, 200);
        r.add(300, 400);
        assert!(r.covers(100, 200) && r.covers(150, 160) && r.covers(300, 301));
        assert!(!r.covers(50, 150) && !r.covers(150, 250) && !r.covers(150, 350));
        assert!(!r.covers(200, 300) && !r.covers(0, 10) && !r.covers(500, 600));
        assert!(!r.covers(150, 150));
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
        let c = Counters::default();
        assert_eq!(c.reread_rate(), 0.0);
        c.add_reads(100, 0);
        c.add_reads(50, 50);
        assert_eq!(c.reread_rate(), 50.0 / 150.0);
    }

    #[test]
    fn a_files_first_reads_count_once_it_reads_again_or_closes() {
        let counts = Counters::default();
        let count = |(first, again): (u64, u64)| counts.add_reads(first, again);
        // A file read twice, 100 bytes: the rate stays 1.0 through a second file's first
        // pass, which counts when it reads again.
        let mut a = FileReads::default();
        count(a.add(0, 100, false));
        assert_eq!(counts.reread_rate(), 0.0);
        count(a.add(0, 60, false));
        assert_eq!(counts.reread_rate(), 0.6);
        count(a.add(60, 100, false));
        assert_eq!(counts.reread_rate(), 1.0);
        let mut b = FileReads::default();
        count(b.add(0, 300, false));
        assert_eq!(counts.reread_rate(), 1.0);
        count(b.add(0, 100, false));
        assert_eq!(counts.reread_rate(), 200.0 / 400.0);
        // A file closed after one pass counts then.
        let mut c = FileReads::default();
        count(c.add(0, 400, false));
        assert_eq!(counts.reread_rate(), 0.5);
        counts.add_reads(c.finish(), 0);
        assert_eq!(counts.reread_rate(), 200.0 / 800.0);
        assert_eq!(c.finish(), 0);
        // Nothing is left to count for a file that read again.
        assert_eq!(b.finish(), 0);
    }

    #[test]
    fn a_file_knows_the_bytes_read_through_the_page_cache() {
        let mut f = FileReads::default();
        f.add(0, 100, true);
        f.add(100, 300, false);
        f.add(300, 400, true);
        assert!(f.covers_through_cache(0, 100) && f.covers_through_cache(310, 320));
        assert!(!f.covers_through_cache(50, 150) && !f.covers_through_cache(100, 200));
        assert!(f.covers(0, 400));
    }
}
