//! Robust estimates of a candidate's cost: median and median absolute deviation (MAD) of a
//! bounded window of recent samples, so that one slow outlier moves nothing.

use crate::Objective;
use std::cell::Cell;

/// One measured transfer, normalised per byte.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Wall-clock nanoseconds per byte (the inverse of GB/s).
    pub time_ns_per_byte: f64,
    /// CPU nanoseconds per byte (all threads of the process).
    pub cpu_ns_per_byte: f64,
}

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
    /// The estimate of `costs`; `None` when empty or when a cost is not finite.
    pub fn of(costs: &[f64]) -> Option<Estimate> {
        Self::of_vec(costs.to_vec())
    }

    /// [`Estimate::of`] on costs the caller no longer needs: sorts them in place and reuses
    /// the buffer for the deviations, so an estimate allocates nothing beyond `costs`.
    fn of_vec(mut costs: Vec<f64>) -> Option<Estimate> {
        if costs.is_empty() || costs.iter().any(|c| !c.is_finite()) {
            return None;
        }
        costs.sort_by(f64::total_cmp);
        let (n, min, max) = (costs.len(), costs[0], costs[costs.len() - 1]);
        let med = median_sorted(&costs);
        for c in costs.iter_mut() {
            *c = (*c - med).abs();
        }
        costs.sort_by(f64::total_cmp);
        Some(Estimate {
            n,
            median: med,
            mad: median_sorted(&costs),
            min,
            max,
        })
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
fn median_sorted(sorted: &[f64]) -> f64 {
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
}

impl PartialEq for Samples {
    /// Equal samples (whatever was computed from them).
    fn eq(&self, other: &Self) -> bool {
        self.samples == other.samples
    }
}

impl Samples {
    /// No samples.
    pub fn new() -> Self {
        Self::default()
    }

    /// Samples from a list (as loaded from a dictionary).
    pub fn from_vec(samples: Vec<Sample>) -> Self {
        Samples {
            samples,
            memo: Cell::new(None),
        }
    }

    /// Adds a sample, dropping the oldest beyond `window`.
    pub fn push(&mut self, sample: Sample, window: usize) {
        self.memo.set(None);
        self.samples.push(sample);
        let window = window.max(1);
        if self.samples.len() > window {
            let extra = self.samples.len() - window;
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
        let e = Estimate::of_vec(self.samples.iter().map(|s| objective.cost(*s)).collect())?;
        self.memo.set(Some((objective, e)));
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(time: f64, cpu: f64) -> Sample {
        Sample {
            time_ns_per_byte: time,
            cpu_ns_per_byte: cpu,
        }
    }

    #[test]
    fn a_remembered_estimate_follows_every_change_and_the_objective() {
        let mut s = Samples::new();
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
        let (mut a, mut b) = (Samples::new(), Samples::new());
        a.push(sample(1.0, 1.0), 3);
        b.push(sample(1.0, 1.0), 3);
        a.estimate(Objective::Time);
        assert_eq!(a, b);
    }
}
