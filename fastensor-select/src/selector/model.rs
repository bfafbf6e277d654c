//! The cost model, pure: a candidate's cost per transfer is `latency + bytes * per_byte`,
//! fitted through two explored size classes and evaluated with its range of uncertainty.

use super::config::MIN_UNCERTAINTY;
use crate::{ContextKey, Estimate};

/// A candidate's cost in one explored size class: the class's first byte count, the median
/// cost per byte, and how uncertain that median is taken to be (relative).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClassCost {
    size_class: u8,
    bytes: f64,
    per_byte: f64,
    uncertainty: f64,
}

impl ClassCost {
    pub(crate) fn new(key: &ContextKey, est: &Estimate) -> Self {
        ClassCost {
            size_class: key.size_class,
            // Every class stands at its first byte count: transfers sit at about the same
            // place within their classes, so the fit is consistent with the prediction.
            bytes: key.size_class_start() as f64,
            per_byte: est.median,
            uncertainty: (2.0 * est.relative_spread()).clamp(MIN_UNCERTAINTY, 1.0),
        }
    }

    /// The cost of one transfer of the class (costs are per byte).
    fn total(&self) -> f64 {
        self.per_byte * self.bytes
    }
}

/// A transfer of `b` bytes costs `latency + b * per_byte`, both non-negative.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LinearCost {
    pub(crate) latency: f64,
    pub(crate) per_byte: f64,
}

impl LinearCost {
    /// The line through two classes' transfer costs `(bytes, total)`, clamped to
    /// non-negative terms while still passing through `near` (the point nearer the target):
    /// a falling total becomes a pure latency, a negative latency a pure per-byte cost.
    pub(crate) fn through(p: (f64, f64), q: (f64, f64), near: (f64, f64)) -> Self {
        let per_byte = (q.1 - p.1) / (q.0 - p.0);
        let latency = p.1 - per_byte * p.0;
        if per_byte < 0.0 {
            LinearCost {
                latency: near.1.max(0.0),
                per_byte: 0.0,
            }
        } else if latency < 0.0 {
            LinearCost {
                latency: 0.0,
                per_byte: (near.1 / near.0).max(0.0),
            }
        } else {
            LinearCost { latency, per_byte }
        }
    }

    /// The cost per byte of a transfer of `bytes`.
    pub(crate) fn per_byte_at(&self, bytes: f64) -> f64 {
        self.latency / bytes + self.per_byte
    }
}

/// A candidate's predicted cost per byte in a new size class: the fitted line's value and
/// its range over the uncertainty of the two classes it goes through.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Prediction {
    pub(crate) centre: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
    /// Size classes between the target and the nearest class measured.
    pub(crate) reach: u8,
}

impl Prediction {
    /// The prediction at `target` bytes (size class `class`) from the classes where the
    /// candidate was measured (sorted by class, `class` not among them); `None` with fewer
    /// than two. The line goes through the nearest classes below and above the target, or
    /// the two nearest ones when all are on one side.
    pub(crate) fn of(points: &[ClassCost], class: u8, target: f64) -> Option<Prediction> {
        if points.len() < 2 {
            return None;
        }
        let above = points.iter().position(|p| p.size_class > class);
        let (p, q) = match above {
            Some(0) => (points[0], points[1]),
            Some(i) => (points[i - 1], points[i]),
            None => (points[points.len() - 2], points[points.len() - 1]),
        };
        let p_nearer = p.size_class.abs_diff(class) <= q.size_class.abs_diff(class);
        let predict = |tp: f64, tq: f64| {
            let (pp, qq) = ((p.bytes, tp), (q.bytes, tq));
            let near = if p_nearer { pp } else { qq };
            LinearCost::through(pp, qq, near).per_byte_at(target)
        };
        let centre = predict(p.total(), q.total());
        // The prediction is monotone in each class's cost: its range is at the corners.
        let (mut low, mut high) = (centre, centre);
        for dp in [-1.0, 1.0] {
            for dq in [-1.0, 1.0] {
                let v = predict(
                    p.total() * (1.0 + dp * p.uncertainty),
                    q.total() * (1.0 + dq * q.uncertainty),
                );
                low = low.min(v);
                high = high.max(v);
            }
        }
        let reach = p
            .size_class
            .abs_diff(class)
            .min(q.size_class.abs_diff(class));
        Some(Prediction {
            centre,
            low,
            high,
            reach,
        })
    }
}
