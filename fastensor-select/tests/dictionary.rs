//! Estimator properties (proptest) and the dictionary's TOML round trip, corruption and
//! machine fingerprints. (Reading and saving by path: the facade's `profile` module.)

use fastensor_core::{CacheState, Direction, ErrorKind, FileLocation, Purpose, TransferContext};
use fastensor_select::{
    Dictionary, Estimate, Fingerprint, MachineFacts, Objective, Observation, Sample, Samples,
    Selector, SelectorConfig,
};
use proptest::prelude::*;
use std::time::Duration;

fn ctx(direction: Direction, bytes: u64, cache: CacheState) -> TransferContext {
    TransferContext {
        cache,
        ..TransferContext::host(direction, bytes, FileLocation::new("ext4", "259:1"))
    }
}

/// The estimate a window holding exactly `costs` (as wall-clock costs) gives.
fn estimate_of(costs: &[f64]) -> Option<Estimate> {
    let mut samples = Samples::default();
    for &cost in costs {
        let sample = Sample {
            time_ns_per_byte: cost,
            cpu_ns_per_byte: 0.0,
        };
        samples.push(sample, costs.len());
    }
    samples.estimate(Objective::Time)
}

fn trained() -> Selector {
    let mut s = Selector::new(SelectorConfig::default());
    for (i, bytes) in [4096u64, 1 << 20, 1 << 24].into_iter().enumerate() {
        for dir in [Direction::Read, Direction::Write] {
            let c = ctx(
                dir,
                bytes,
                if dir == Direction::Read {
                    CacheState::Cold
                } else {
                    CacheState::Unknown
                },
            );
            for round in 0..12u64 {
                let choice = s.choose(&c, &["x", "y", "z"]).unwrap();
                let per = match choice.backend.as_str() {
                    "x" => 10 + i as u64,
                    "y" => 12,
                    _ => 40,
                };
                let wall = Duration::from_nanos(bytes * per / 10 + round % 3);
                s.record(
                    &c,
                    &choice.backend,
                    Observation {
                        bytes,
                        wall,
                        cpu: wall / 3,
                    },
                );
            }
        }
    }
    s
}

#[test]
fn toml_round_trip_is_exact() {
    let s = trained();
    let dict = s.dictionary();
    let text = dict.to_toml();
    assert!(text.contains("version = 1"), "{text}");
    let back = Dictionary::parse(&text).unwrap();
    assert_eq!(back, dict);
    let loaded = Selector::from_dictionary(&back, SelectorConfig::default()).unwrap();
    assert_eq!(loaded.dictionary(), dict);
}

#[test]
fn corrupt_text_is_corrupt_and_another_version_unsupported() {
    for text in ["this is = = not toml", "version = 1\nobjective = 3", "version = 1\nobjective = \"time\"\n[fingerprint]\n[[context]]\ndirection = \"sideways\"\nmemory = \"host\"\nsize_class = 3\nin_flight = 0\ncache = \"cold\"\n"] {
        let err = Dictionary::parse(text).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    }
    let text = trained()
        .dictionary()
        .to_toml()
        .replace("version = 1", "version = 99");
    let err = Dictionary::parse(&text).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("version 99"), "{err}");
}

/// A machine described by hand: its kernel and one model for every device.
struct Facts(&'static str, &'static str);

impl MachineFacts for Facts {
    fn kernel_release(&self) -> String {
        self.0.to_string()
    }
    fn device_model(&self, _device: &str) -> String {
        self.1.to_string()
    }
}

#[test]
fn a_fingerprint_tells_another_kernel_or_device_model() {
    let here = Facts("6.1.0", "disk A");
    let location = FileLocation {
        fs_type: "ext4".into(),
        device: "259:1".into(),
    };
    let mut f = Fingerprint::of_machine(&here);
    f.add_location(&location, &here);
    f.add_location(&location, &here);
    f.add_location(&FileLocation::default(), &here);
    assert_eq!(f.devices.len(), 1, "{f:?}");
    assert_eq!(f.devices[0].model, "disk A");
    assert_eq!(f.mismatch(&f.current(&here)), None);
    let kernel = f.mismatch(&f.current(&Facts("6.2.0", "disk A"))).unwrap();
    assert!(kernel.contains("6.2.0"), "{kernel}");
    let disk = f.mismatch(&f.current(&Facts("6.1.0", "disk B"))).unwrap();
    assert!(disk.contains("259:1") && disk.contains("disk B"), "{disk}");
}

#[test]
fn cached_and_cold_reads_are_different_contexts() {
    let mut s = Selector::new(SelectorConfig::default());
    for cache in [CacheState::Cold, CacheState::Cached] {
        let c = ctx(Direction::Read, 1 << 20, cache);
        for _ in 0..20 {
            let ch = s.choose(&c, &["page", "direct"]).unwrap();
            let fast = (cache == CacheState::Cached) == (ch.backend == "page");
            let wall = Duration::from_micros(if fast { 100 } else { 400 });
            s.record(
                &c,
                &ch.backend,
                Observation {
                    bytes: 1 << 20,
                    wall,
                    cpu: Duration::ZERO,
                },
            );
        }
    }
    let choices: Vec<_> = s
        .keys()
        .iter()
        .map(|(k, v)| (k.cache, v.choice().unwrap().to_owned()))
        .collect();
    assert_eq!(
        choices,
        vec![
            (CacheState::Cached, "page".to_string()),
            (CacheState::Cold, "direct".to_string())
        ]
    );
}

proptest! {
    #[test]
    fn median_lies_within_the_samples_and_ignores_order(mut v in prop::collection::vec(0.0f64..1e6, 1..40), seed in any::<u64>()) {
        let e = estimate_of(&v).unwrap();
        prop_assert!(e.min <= e.median && e.median <= e.max);
        prop_assert!(e.mad >= 0.0 && e.mad <= e.max - e.min);
        // Permutation invariance.
        let n = v.len();
        v.rotate_left((seed as usize) % n);
        prop_assert_eq!(estimate_of(&v).unwrap(), e);
    }

    #[test]
    fn estimate_scales_with_the_data(v in prop::collection::vec(1.0f64..1e6, 1..40), k in 0.001f64..1000.0) {
        let e = estimate_of(&v).unwrap();
        let scaled: Vec<f64> = v.iter().map(|x| x * k).collect();
        let s = estimate_of(&scaled).unwrap();
        prop_assert!((s.median - e.median * k).abs() <= 1e-9 * s.median.abs().max(1.0));
        prop_assert!((s.mad - e.mad * k).abs() <= 1e-9 * s.median.abs().max(1.0));
    }

    #[test]
    fn a_minority_of_outliers_does_not_move_the_median_outside_the_clean_range(
        clean in prop::collection::vec(100.0f64..200.0, 3..30),
        outlier in 1e6f64..1e12,
        count in 0usize..30,
    ) {
        let bad = count.min((clean.len() - 1) / 2);
        let mut all = clean.clone();
        all.extend(std::iter::repeat_n(outlier, bad));
        let e = estimate_of(&all).unwrap();
        let lo = clean.iter().cloned().fold(f64::MAX, f64::min);
        let hi = clean.iter().cloned().fold(f64::MIN, f64::max);
        prop_assert!(e.median >= lo && e.median <= hi, "median {} outside [{lo}, {hi}]", e.median);
    }

    #[test]
    fn constant_samples_have_no_spread(x in 0.0f64..1e9, n in 1usize..20) {
        let e = estimate_of(&vec![x; n]).unwrap();
        prop_assert_eq!(e.median, x);
        prop_assert_eq!(e.mad, 0.0);
    }

    #[test]
    fn selector_picks_the_cheapest_of_well_separated_candidates(costs in prop::collection::vec(1u64..1000, 2..6), noise in 0u64..5) {
        // Candidates whose costs differ by at least 2x apart from noise: the selector ends
        // on the cheapest, within a bounded number of explorations.
        let mut costs = costs;
        costs.sort();
        costs.dedup();
        let costs: Vec<u64> = costs.iter().enumerate().map(|(i, c)| c * 100 * (1 << i)).collect();
        let names: Vec<String> = (0..costs.len()).map(|i| format!("b{}", costs.len() - i)).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut s = Selector::new(SelectorConfig::default());
        let c = ctx(Direction::Write, 1 << 20, CacheState::Unknown);
        for round in 0..(8 * costs.len() as u64) {
            let ch = s.choose(&c, &refs).unwrap();
            let i = names.iter().position(|n| *n == ch.backend).unwrap();
            let wall = Duration::from_nanos(costs[i] + (round * 7919) % (noise + 1));
            s.record(&c, &ch.backend, Observation { bytes: 1 << 20, wall, cpu: Duration::ZERO });
        }
        prop_assert_eq!(s.choose(&c, &refs).unwrap().backend, names[0].clone());
        prop_assert!(s.stats().explorations <= (6 * costs.len()) as u64);
    }
}

#[test]
fn knobs_round_trip_and_old_files_load_without_them() {
    let mut s = trained();
    let old_text = s.dictionary().to_toml();
    assert!(!old_text.contains("knobs"), "{old_text}");
    assert!(Dictionary::parse(&old_text).unwrap().knobs.is_empty());
    let mut knobs = std::collections::BTreeMap::new();
    knobs.insert(
        "posix-direct".to_string(),
        [("threads".to_string(), "2".to_string())]
            .into_iter()
            .collect(),
    );
    s.set_knobs(knobs.clone());
    let text = s.dictionary().to_toml();
    assert!(text.contains("[knobs.posix-direct]"), "{text}");
    let back = Dictionary::parse(&text).unwrap();
    assert_eq!(back.knobs, knobs);
    let again = Selector::from_dictionary(&back, SelectorConfig::default()).unwrap();
    assert_eq!(again.knobs(), &knobs);
}

#[test]
fn durable_writes_are_their_own_context_and_round_trip() {
    let mut s = Selector::new(SelectorConfig::default());
    let plain = ctx(Direction::Write, 1 << 20, CacheState::Unknown);
    let durable = TransferContext {
        purpose: Purpose::Checkpoint,
        ..plain.clone()
    };
    // Buffered ("cache") writes are cheap until they must reach the device.
    for _ in 0..20 {
        for (c, cache_cost, direct_cost) in [(&plain, 1u64, 4u64), (&durable, 9, 4)] {
            let choice = s.choose(c, &["cache", "direct"]).unwrap();
            let per = if choice.backend == "cache" {
                cache_cost
            } else {
                direct_cost
            };
            let wall = Duration::from_micros(100 * per);
            let obs = Observation {
                bytes: 1 << 20,
                wall,
                cpu: wall / 2,
            };
            s.record(c, &choice.backend, obs);
        }
    }
    let (kp, kd) = (
        fastensor_select::ContextKey::of(&plain),
        fastensor_select::ContextKey::of(&durable),
    );
    assert!(!kp.durable && kd.durable);
    assert_eq!(s.choice_for(&kp), Some("cache"));
    assert_eq!(s.choice_for(&kd), Some("direct"));
    // Reads are never durable, whatever their purpose.
    let read = TransferContext {
        direction: Direction::Read,
        ..durable.clone()
    };
    assert!(!fastensor_select::ContextKey::of(&read).durable);
    let dict = s.dictionary();
    let text = dict.to_toml();
    assert_eq!(text.matches("durable = true").count(), 1, "{text}");
    assert_eq!(Dictionary::parse(&text).unwrap(), dict);
}

#[test]
fn a_candidate_ruled_out_by_the_model_keeps_its_second_look_across_a_save_and_load() {
    // a: 10 µs + 0.3 ns/B; b: twice that at every size. After 64 KiB and 1 MiB are explored,
    // the cost model rules b out at 4 MiB without measuring it.
    let cost = |name: &str, bytes: u64| {
        let ns = (10_000.0 + 0.3 * bytes as f64) * if name == "b" { 2.0 } else { 1.0 };
        let wall = Duration::from_nanos(ns as u64);
        Observation {
            bytes,
            wall,
            cpu: Duration::ZERO,
        }
    };
    let run = |s: &mut Selector, bytes: u64, n: usize| -> Vec<String> {
        let c = ctx(Direction::Write, bytes, CacheState::Unknown);
        (0..n)
            .map(|_| {
                let choice = s.choose(&c, &["a", "b"]).unwrap();
                s.record(&c, &choice.backend, cost(&choice.backend, bytes));
                choice.backend
            })
            .collect()
    };
    let mut s = Selector::new(SelectorConfig::default());
    run(&mut s, 64 << 10, 20);
    run(&mut s, 1 << 20, 20);
    let used = run(&mut s, 4 << 20, 10);
    assert!(used.iter().all(|b| b == "a"), "{used:?}");
    let text = s.dictionary().to_toml();
    assert!(text.contains("prior = "), "{text}");
    let saved = Dictionary::parse(&text).unwrap();
    let mut loaded = Selector::from_dictionary(&saved, SelectorConfig::default()).unwrap();
    // The loaded choice runs 64 transfers; then b, predicted within 3x, is measured once.
    let used = run(&mut loaded, 4 << 20, 100);
    let bs: Vec<usize> = (0..used.len()).filter(|&i| used[i] == "b").collect();
    assert_eq!(bs, [64], "{used:?}");
}
