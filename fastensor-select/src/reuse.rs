//! Re-reads: a cold read through the page cache leaves its bytes cached for the next read
//! of them, a read that bypasses the cache does not. When the workload reads bytes again,
//! a cold read's cost is judged with the next read of the same bytes included.
//!
//! With `r` the share of first-read bytes that are read again (measured by the caller), a
//! candidate's cost `c` per byte in a cold-read context is judged as
//!
//! * `c + r * cached`, when it keeps the bytes in the page cache (`cached`: the best median
//!   in the same context with the bytes cached, in the nearest size class measured), and
//! * `c * (1 + r)`, when it bypasses the cache (the next read is as cold as this one).
//!
//! Without a cached estimate yet, or with `r = 0`, costs are judged as measured.

use crate::ContextKey;
use fastensor_core::{CacheState, Direction};
use std::collections::BTreeSet;

/// What the selector knows of re-reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reuse {
    /// Share of first-read bytes read again, in `[0, 1]`.
    rate: f64,
    /// Candidates whose reads leave the bytes in the page cache.
    keeping: BTreeSet<String>,
}

impl Reuse {
    /// Sets the share of first-read bytes that are read again (clamped to `[0, 1]`).
    pub fn set_rate(&mut self, rate: f64) {
        self.rate = if rate.is_finite() {
            rate.clamp(0.0, 1.0)
        } else {
            0.0
        };
    }

    /// The share of first-read bytes read again.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Names the candidates whose reads leave the bytes in the page cache.
    pub fn set_keeping<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, names: I) {
        self.keeping = names.into_iter().map(Into::into).collect();
    }

    /// Whether reads through `name` leave the bytes in the page cache.
    pub(crate) fn keeps(&self, name: &str) -> bool {
        self.keeping.contains(name)
    }

    /// Whether the costs of `key`'s candidates are judged with the next read included.
    pub(crate) fn applies_to(&self, key: &ContextKey) -> bool {
        self.rate > 0.0
            && !self.keeping.is_empty()
            && key.direction == Direction::Read
            && key.cache == CacheState::Cold
    }

    /// `(scale, shift)` for `name`: a judged cost is `cost * scale + shift`. `cached` is the
    /// best median in the cached context.
    pub(crate) fn adjustment(&self, name: &str, cached: f64) -> (f64, f64) {
        if self.keeping.contains(name) {
            (1.0, self.rate * cached)
        } else {
            (1.0 + self.rate, 0.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastensor_core::MemoryKind;

    fn key(cache: CacheState, direction: Direction) -> ContextKey {
        ContextKey {
            direction,
            memory: MemoryKind::Host,
            size_class: 23,
            in_flight: 0,
            fs_type: "ext4".into(),
            device: "1:2".into(),
            cache,
            durable: false,
        }
    }

    #[test]
    fn only_cold_reads_with_rereads_are_adjusted() {
        let mut r = Reuse::default();
        r.set_keeping(["posix"]);
        assert!(!r.applies_to(&key(CacheState::Cold, Direction::Read)));
        r.set_rate(2.0);
        assert_eq!(r.rate(), 1.0);
        assert!(r.applies_to(&key(CacheState::Cold, Direction::Read)));
        assert!(!r.applies_to(&key(CacheState::Cached, Direction::Read)));
        assert!(!r.applies_to(&key(CacheState::Unknown, Direction::Read)));
        assert!(!r.applies_to(&key(CacheState::Cold, Direction::Write)));
        r.set_rate(f64::NAN);
        assert_eq!(r.rate(), 0.0);
    }

    #[test]
    fn a_keeping_path_pays_the_cached_read_and_a_bypassing_one_the_cold_read_again() {
        let mut r = Reuse::default();
        r.set_keeping(["posix"]);
        r.set_rate(0.5);
        let names: Vec<String> = vec!["posix".into(), "uring".into()];
        let adj: Vec<(f64, f64)> = names.iter().map(|n| r.adjustment(n, 0.1)).collect();
        assert_eq!(adj, vec![(1.0, 0.05), (1.5, 0.0)]);
        // posix cold 0.45 ns/B, uring 0.30: judged 0.50 against 0.45 at r = 0.5, and
        // 0.55 against 0.60 at r = 1 (posix then wins).
        let judged =
            |a: &[(f64, f64)], c: [f64; 2]| [c[0] * a[0].0 + a[0].1, c[1] * a[1].0 + a[1].1];
        let j = judged(&adj, [0.45, 0.30]);
        assert!(j[0] > j[1]);
        r.set_rate(1.0);
        let adj: Vec<(f64, f64)> = names.iter().map(|n| r.adjustment(n, 0.1)).collect();
        let j = judged(&adj, [0.45, 0.30]);
        assert!(j[0] < j[1]);
        // The cached context of a cold read is the same context but for the cache state.
        let (cold, cached) = (
            key(CacheState::Cold, Direction::Read),
            key(CacheState::Cached, Direction::Read),
        );
        assert!(cold.same_but_size_and_cache(&cached) && !cold.same_but_size(&cached));
    }
}
