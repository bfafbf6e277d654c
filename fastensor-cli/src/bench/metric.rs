//! A measured value or the reason there is none, and the statistics of a cell's samples.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// A value that may be unavailable. JSON: `{"available": true, "value": 1.5}` or
/// `{"available": false, "reason": "..."}`; never a made-up number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// True when `value` holds a measurement.
    pub available: bool,
    /// The measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// Why there is no value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Metric {
    /// A measured value.
    pub fn value(v: f64) -> Self {
        Metric {
            available: true,
            value: Some(v),
            reason: None,
        }
    }

    /// No value, and why.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Metric {
            available: false,
            value: None,
            reason: Some(reason.into()),
        }
    }

    /// The value when available.
    pub fn get(&self) -> Option<f64> {
        self.value.filter(|_| self.available)
    }
}

/// Median of a slice (NaN when empty).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Largest transfer whose per-request latency percentiles are reported.
pub const LATENCY_MAX_BYTES: u64 = 1 << 20;

/// p50 and p99 of per-request latencies (seconds), in microseconds, through an HDR histogram
/// (3 significant digits). Unavailable for transfers over [`LATENCY_MAX_BYTES`].
pub fn latency_percentiles(bytes: u64, seconds: &[f64]) -> (Metric, Metric) {
    if bytes > LATENCY_MAX_BYTES {
        let why =
            || Metric::unavailable("latency percentiles are kept for requests of 1 MiB or less");
        return (why(), why());
    }
    if seconds.is_empty() {
        let why = || Metric::unavailable("no timed requests");
        return (why(), why());
    }
    let mut h = match Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3) {
        Ok(h) => h,
        Err(e) => {
            let why = || Metric::unavailable(format!("histogram: {e}"));
            return (why(), why());
        }
    };
    for &s in seconds {
        let ns = (s * 1e9).round().clamp(1.0, 600e9) as u64;
        h.saturating_record(ns);
    }
    let us = |q: f64| Metric::value(h.value_at_quantile(q) as f64 / 1e3);
    (us(0.5), us(0.99))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn percentiles_for_small_requests_only() {
        let lat: Vec<f64> = (1..=100).map(|i| i as f64 * 1e-6).collect();
        let (p50, p99) = latency_percentiles(4096, &lat);
        assert!((p50.get().unwrap() - 50.0).abs() < 0.1, "{p50:?}");
        assert!((p99.get().unwrap() - 99.0).abs() < 0.1, "{p99:?}");
        let (big, _) = latency_percentiles(2 << 20, &lat);
        assert!(!big.available && big.value.is_none() && big.reason.is_some());
        let json = serde_json::to_value(&big).unwrap();
        assert_eq!(json["available"], false);
        assert!(json.get("value").is_none());
    }
}
