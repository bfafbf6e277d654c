//! Robust estimates of a candidate's cost: median and median absolute deviation (MAD) of a
//! bounded window of recent samples, so that one slow outlier moves nothing.

use crate::{Objective, Sample};
use std::cell::{Cell, RefCell};
use std::cmp::Ordering;

/// The robust summary of a set of costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Number of samples.
    pub n: usize,
    /// Median cost.
    pub median: f64,
    /// Median absolute deviation from the median.
    pub mad: f64,
    /// Smallest cost.
    pub min: f64,
    /// Largest cost.
    pub max: f64,
}

impl Estimate {
    /// The estimate of sorted, finite, non-empty costs, in one pass: the deviations from the
    /// median are read in increasing order by walking outwards from the median (those below
    /// it grow leftwards, those above it rightwards), up to the middle one(s).
    fn of_sorted(sorted: &[f64]) -> Estimate {
        let n = sorted.len();
        let med = median_sorted(sorted);
        // `below`: costs left of it are under the median; `above`: the next one at or above.
        let mut below = sorted.partition_point(|&c| c < med);
        let mut above = below;
        let (mut low, mut high) = (0.0, 0.0);
        for rank in 0..=n / 2 {
            let left = below.checked_sub(1).map(|i| med - sorted[i]);
            let right = sorted.get(above).map(|c| c - med);
            let d = match (left, right) {
                (Some(l), r) if r.is_none_or(|r| l <= r) => {
                    below -= 1;
                    l
                }
                (_, r) => {
                    above += 1;
                    r.expect("n deviations are read at most")
                }
            };
            if rank == (n - 1) / 2 {
                low = d;
            }
            high = d;
        }
        let mad = if n % 2 == 1 {
            high
        } else {
            low / 2.0 + high / 2.0
        };
        Estimate {
            n,
            median: med,
            mad,
            min: sorted[0],
            max: sorted[n - 1],
        }
    }

    /// The estimate of the costs `cost * scale + shift` (`scale` > 0: the order is kept).
    pub fn scaled(&self, scale: f64, shift: f64) -> Estimate {
        Estimate {
            n: self.n,
            median: self.median * scale + shift,
            mad: self.mad * scale,
            min: self.min * scale + shift,
            max: self.max * scale + shift,
        }
    }

    /// The spread relative to the median (`mad / median`, 0 when the median is 0).
    pub fn relative_spread(&self) -> f64 {
        if self.median > 0.0 {
            self.mad / self.median
        } else {
            0.0
        }
    }
}

/// The median of sorted values (the mean of the two middle ones for an even count).
pub(crate) fn median_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        sorted[n / 2 - 1] / 2.0 + sorted[n / 2] / 2.0
    }
}

/// The recent samples of one candidate in one context, at most `window` of them.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    samples: Vec<Sample>,
    /// The last estimate computed, and under which objective (cleared by every change): a
    /// decision asks for the same estimates many times between two samples.
    memo: Cell<Option<(Objective, Estimate)>>,
    /// The samples' costs under an objective, sorted, kept up to date as samples come and
    /// go (an insertion and a removal in a sorted window, instead of sorting it again for
    /// every estimate: a choice's estimate is asked again after each of its samples).
    sorted: RefCell<SortedCosts>,
}

/// See [`Samples::sorted`].
#[derive(Debug, Clone, Default)]
struct SortedCosts {
    /// The objective of `costs`; `None`: not built.
    objective: Option<Objective>,
    costs: Vec<f64>,
}

impl SortedCosts {
    fn insert(&mut self, cost: f64) {
        let at = self
            .costs
            .partition_point(|c| c.total_cmp(&cost) == Ordering::Less);
        self.costs.insert(at, cost);
    }

    fn remove(&mut self, cost: f64) {
        match self.costs.binary_search_by(|c| c.total_cmp(&cost)) {
            Ok(at) => {
                self.costs.remove(at);
            }
            // Not there (cannot happen: built from the same samples); rebuilt when next
            // asked.
            Err(_) => self.objective = None,
        }
    }
}

impl PartialEq for Samples {
    /// Equal samples (whatever was computed from them).
    fn eq(&self, other: &Self) -> bool {
        self.samples == other.samples
    }
}

impl Samples {
    /// Samples from a list (as loaded from a dictionary).
    pub fn from_vec(samples: Vec<Sample>) -> Self {
        Samples {
            samples,
            ..Samples::default()
        }
    }

    /// Adds a sample, dropping the oldest beyond `window`.
    pub fn push(&mut self, sample: Sample, window: usize) {
        self.memo.set(None);
        let sorted = self.sorted.get_mut();
        self.samples.push(sample);
        if let Some(objective) = sorted.objective {
            sorted.insert(objective.cost(sample));
        }
        let window = window.max(1);
        if self.samples.len() > window {
            let extra = self.samples.len() - window;
            if let Some(objective) = sorted.objective {
                for old in &self.samples[..extra] {
                    sorted.remove(objective.cost(*old));
                }
            }
            self.samples.drain(..extra);
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Forgets every sample.
    pub fn clear(&mut self) {
        self.memo.set(None);
        self.samples.clear();
        self.sorted.get_mut().costs.clear();
    }

    /// The samples, oldest first.
    pub fn as_slice(&self) -> &[Sample] {
        &self.samples
    }

    /// The robust estimate of the cost under `objective`.
    pub fn estimate(&self, objective: Objective) -> Option<Estimate> {
        if let Some((o, e)) = self.memo.get() {
            if o == objective {
                return Some(e);
            }
        }
        let mut sorted = self.sorted.borrow_mut();
        if sorted.objective != Some(objective) {
            sorted.costs.clear();
            sorted
                .costs
                .extend(self.samples.iter().map(|s| objective.cost(*s)));
            sorted.costs.sort_unstable_by(f64::total_cmp);
            sorted.objective = Some(objective);
        }
        // Sorted by `total_cmp`, non-finite costs (NaN, infinities) lie at the ends.
        let (first, last) = (sorted.costs.first()?, sorted.costs.last()?);
        if !first.is_finite() || !last.is_finite() {
            return None;
        }
        let e = Estimate::of_sorted(&sorted.costs);
        self.memo.set(Some((objective, e)));
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The estimate of `costs`; `None` when empty or when a cost is not finite.
    fn estimate_of(costs: &[f64]) -> Option<Estimate> {
        let mut sorted = costs.to_vec();
        if sorted.is_empty() || sorted.iter().any(|c| !c.is_finite()) {
            return None;
        }
        sorted.sort_unstable_by(f64::total_cmp);
        Some(Estimate::of_sorted(&sorted))
    }

    fn sample(time: f64, cpu: f64) -> Sample {
        Sample {
            time_ns_per_byte: time,
            cpu_ns_per_byte: cpu,
        }
    }

    /// The median absolute deviation as defined: the median of the sorted deviations.
    fn naive_mad(costs: &[f64]) -> f64 {
        let mut sorted = costs.to_vec();
        sorted.sort_by(f64::total_cmp);
        let med = median_sorted(&sorted);
        let mut dev: Vec<f64> = sorted.iter().map(|c| (c - med).abs()).collect();
        dev.sort_by(f64::total_cmp);
        median_sorted(&dev)
    }

    #[test]
    fn the_one_pass_deviation_is_the_median_of_the_sorted_deviations() {
        let mut state = 7u64;
        for n in 1..=70 {
            for round in 0..50 {
                let costs: Vec<f64> = (0..n)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        // Ties and skew as well as spread.
                        let x = (state >> 40) % [5, 100, 1 << 20][round % 3];
                        x as f64 * if round % 2 == 0 { 1.0 } else { 0.37 }
                    })
                    .collect();
                let e = estimate_of(&costs).unwrap();
                assert_eq!(e.mad, naive_mad(&costs), "{costs:?}");
                assert_eq!(e.n, n);
            }
        }
        assert_eq!(estimate_of(&[1.0, f64::NAN]), None);
        assert_eq!(estimate_of(&[]), None);
    }

    #[test]
    fn the_sorted_window_follows_pushes_evictions_and_objectives() {
        let mut s = Samples::default();
        let mut state = 3u64;
        let mix = Objective::Weighted {
            time: 1.0,
            cpu: 0.25,
        };
        for i in 0..300 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let t = ((state >> 33) % 50) as f64;
            let c = ((state >> 45) % 7) as f64;
            s.push(sample(t, c), 1 + i % 17);
            let objective = [Objective::Time, Objective::Cpu, mix][(i / 7) % 3];
            let fresh = Samples::from_vec(s.as_slice().to_vec());
            assert_eq!(s.estimate(objective), fresh.estimate(objective), "at {i}");
            if i % 50 == 49 {
                s.clear();
                assert_eq!(s.estimate(objective), None);
            }
        }
    }

    #[test]
    fn a_remembered_estimate_follows_every_change_and_the_objective() {
        let mut s = Samples::default();
        assert_eq!(s.estimate(Objective::Time), None);
        s.push(sample(1.0, 10.0), 3);
        assert_eq!(s.estimate(Objective::Time).unwrap().median, 1.0);
        assert_eq!(s.estimate(Objective::Cpu).unwrap().median, 10.0);
        s.push(sample(3.0, 30.0), 3);
        assert_eq!(s.estimate(Objective::Time).unwrap().median, 2.0);
        s.push(sample(5.0, 50.0), 3);
        s.push(sample(7.0, 70.0), 3); // the window drops 1.0
        assert_eq!(s.estimate(Objective::Time).unwrap().median, 5.0);
        let mix = Objective::Weighted {
            time: 1.0,
            cpu: 0.5,
        };
        assert_eq!(s.estimate(mix).unwrap().median, 30.0);
        s.clear();
        assert_eq!(s.estimate(mix), None);
        // Equality ignores what was computed.
        let (mut a, mut b) = (Samples::default(), Samples::default());
        a.push(sample(1.0, 1.0), 3);
        b.push(sample(1.0, 1.0), 3);
        a.estimate(Objective::Time);
        assert_eq!(a, b);
    }
}
