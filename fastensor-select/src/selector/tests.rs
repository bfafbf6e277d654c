//! Deterministic tests of the selector's rules, on noiseless linear costs.

use super::*;
use fastensor_core::{CacheState, Direction, FileLocation, MemoryKind, Purpose};
use model::LinearCost;
use std::time::Duration;

fn ctx(bytes: u64) -> TransferContext {
    TransferContext {
        direction: Direction::Write,
        bytes,
        memory: MemoryKind::Host,
        location: FileLocation {
            fs_type: "ext4".into(),
            device: "259:1".into(),
        }
        .into(),
        in_flight: 1,
        purpose: Purpose::General,
        cache: CacheState::Unknown,
    }
}

/// A backend costing `latency_ns + bytes * per_byte_ns` per transfer, without noise.
#[derive(Clone, Copy)]
struct Linear(&'static str, f64, f64);

impl Linear {
    fn observation(&self, bytes: u64) -> Observation {
        let wall = Duration::from_nanos((self.1 + self.2 * bytes as f64) as u64);
        Observation {
            bytes,
            wall,
            cpu: Duration::ZERO,
        }
    }
}

/// An observation of `bytes` bytes taking `ns` nanoseconds (no CPU time).
fn taking(bytes: u64, ns: u64) -> Observation {
    Observation {
        bytes,
        wall: Duration::from_nanos(ns),
        cpu: Duration::ZERO,
    }
}

/// Measures every backend `n` times at `bytes` (the class ends up explored).
fn measure_all(s: &mut Selector, bytes: u64, backends: &[Linear], n: usize) {
    for _ in 0..n {
        for b in backends {
            s.record(&ctx(bytes), b.0, b.observation(bytes));
        }
    }
    assert!(s.choice_for(&ContextKey::of(&ctx(bytes))).is_some());
}

/// Runs transfers of `bytes` through the selector until it stops exploring; returns the
/// backends it explored, in order.
fn explore(s: &mut Selector, bytes: u64, backends: &[Linear]) -> Vec<&'static str> {
    let names: Vec<&str> = backends.iter().map(|b| b.0).collect();
    let mut explored = Vec::new();
    for _ in 0..100 {
        let choice = s.choose(&ctx(bytes), &names).unwrap();
        if !choice.exploring {
            return explored;
        }
        let b = backends.iter().find(|b| b.0 == choice.backend).unwrap();
        explored.push(b.0);
        s.record(&ctx(bytes), b.0, b.observation(bytes));
    }
    panic!("still exploring after 100 transfers");
}

fn state(s: &Selector, bytes: u64) -> &KeyState {
    &s.keys()[&ContextKey::of(&ctx(bytes))]
}

#[test]
fn an_answer_kept_while_its_epoch_stands_is_the_selectors_answer() {
    // A caller keeping answers as the engine does (a choice under `choices`, an
    // exploration under `state`, the latter per `stay`), through exploration, choices,
    // second looks and a drift: every kept answer it reuses is what the selector would
    // answer then.
    let names = ["a", "b", "c"];
    let mut s = Selector::new(SelectorConfig::default());
    type Kept = (u64, Option<&'static str>, Choice, Epochs);
    let mut kept: Vec<Kept> = Vec::new();
    let mut last: BTreeMap<u64, &'static str> = BTreeMap::new();
    let mut rng = 12345u64;
    let (mut reused, mut reused_exploring) = (0, 0);
    for t in 0..6000u32 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let bytes = [4096u64, 65536, 1 << 20][(rng >> 33) as usize % 3];
        let stay = last.get(&bytes).copied();
        let epochs = s.epochs();
        let standing = kept.iter().find(|(b, st, c, e)| {
            *b == bytes
                && if c.exploring {
                    *st == stay && e.state == epochs.state
                } else {
                    e.choices == epochs.choices
                }
        });
        let choice = match standing {
            Some((_, _, c, _)) => {
                let fresh = s.clone().choose_staying(&ctx(bytes), &names, stay).unwrap();
                assert_eq!(*c, fresh, "transfer {t}: a kept answer went stale");
                reused += 1;
                reused_exploring += usize::from(c.exploring);
                c.clone()
            }
            None => {
                let c = s.choose_staying(&ctx(bytes), &names, stay).unwrap();
                kept.retain(|(b, ..)| *b != bytes);
                kept.push((bytes, stay, c.clone(), s.epochs()));
                c
            }
        };
        // `a` is cheap per call, `c` per byte, `b` in between; `a` slows down 4x
        // half-way (drift). Noise up to 20%.
        let noise = 1.0 + ((rng >> 40) % 200) as f64 / 1000.0;
        let (lat, per_byte) = match choice.backend.as_str() {
            "a" if t < 3000 => (2_000.0, 1.0),
            "a" => (8_000.0, 4.0),
            "b" => (10_000.0, 0.5),
            _ => (40_000.0, 0.2),
        };
        let ns = ((lat + per_byte * bytes as f64) * noise) as u64;
        // One transfer in three recorded (as the engine records a stream's runs).
        if (rng >> 20) % 3 == 0 {
            s.record(&ctx(bytes), &choice.backend, taking(bytes, ns));
        }
        let name = names.iter().find(|n| **n == choice.backend).unwrap();
        last.insert(bytes, name);
    }
    // Most answers were reused, explorations' too, and the drift was noticed.
    assert!(reused > 4000, "{reused}");
    assert!(reused_exploring > 0, "{reused_exploring}");
    assert!(s.stats().reexplorations > 0);
}

#[test]
fn exploration_stays_on_the_stream_path_while_it_needs_samples() {
    let mut s = Selector::new(SelectorConfig::default());
    let c = ctx(1 << 16);
    let names = ["a", "b", "c"];
    let mut order = Vec::new();
    let mut stay: Option<String> = None;
    for _ in 0..40 {
        let choice = s.choose_staying(&c, &names, stay.as_deref()).unwrap();
        if !choice.exploring {
            break;
        }
        // Equal costs: every candidate is a contender and needs confirm_samples.
        let obs = Linear(names[0], 1000.0, 1.0).observation(1 << 16);
        s.record(&c, &choice.backend, obs);
        order.push(choice.backend.clone());
        stay = Some(choice.backend);
    }
    // Runs of consecutive transfers, not alternation: every path is measured once, the
    // last one then in one run, and the others in one run each.
    let switches = order.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(switches, 4, "{order:?}");
    assert_eq!(order[..3], ["a", "b", "c"]);
    // A slow first path is dropped after its one sample once another one is measured.
    let mut s = Selector::new(SelectorConfig::default());
    let mut stay: Option<String> = None;
    let mut slow_samples = 0;
    for _ in 0..40 {
        let choice = s.choose_staying(&c, &names, stay.as_deref()).unwrap();
        if !choice.exploring {
            break;
        }
        let slow = choice.backend == "a";
        slow_samples += usize::from(slow);
        let obs = Linear("x", 1000.0, if slow { 5.0 } else { 1.0 }).observation(1 << 16);
        s.record(&c, &choice.backend, obs);
        stay = Some(choice.backend);
    }
    assert_eq!(slow_samples, 1);
    // Without `stay`, the fewest-samples rule alternates.
    let mut s = Selector::new(SelectorConfig::default());
    let first: Vec<String> = (0..3)
        .map(|_| {
            let b = s.choose(&c, &names).unwrap().backend;
            s.record(&c, &b, Linear("a", 1000.0, 1.0).observation(1 << 16));
            b
        })
        .collect();
    assert_eq!(first, ["a", "b", "c"]);
}

#[test]
fn every_stream_path_is_measured_once_before_one_is_confirmed() {
    // `a` and `b` are slow (6 and 5 per byte), `c` fast (1), and measured in name order.
    // After one sample each of `a` and `b`, `b` leads; kept on the stream until
    // confirmed, it took 6 samples before `c` was measured once. Now `c` comes next, and
    // both slow paths are dropped after one sample.
    let mut s = Selector::new(SelectorConfig::default());
    let c = ctx(1 << 16);
    let names = ["a", "b", "c"];
    let cost = |name: &str| match name {
        "a" => 6.0,
        "b" => 5.0,
        _ => 1.0,
    };
    let mut stay: Option<String> = None;
    let mut order = Vec::new();
    for _ in 0..40 {
        let choice = s.choose_staying(&c, &names, stay.as_deref()).unwrap();
        if !choice.exploring {
            break;
        }
        let obs = Linear("x", 1000.0, cost(&choice.backend)).observation(1 << 16);
        s.record(&c, &choice.backend, obs);
        order.push(choice.backend.clone());
        stay = Some(choice.backend);
    }
    assert_eq!(order[..3], ["a", "b", "c"], "{order:?}");
    assert!(order[3..].iter().all(|b| b == "c"), "{order:?}");
    assert_eq!(state(&s, 1 << 16).choice(), Some("c"));
}

#[test]
fn a_cold_read_is_explored_through_a_path_that_bypasses_the_page_cache_first() {
    let read = |cache: CacheState| TransferContext {
        direction: Direction::Read,
        cache,
        ..ctx(8 << 20)
    };
    let names = ["a-buffered", "b-direct"];
    let first = |cache: CacheState| {
        let mut s = Selector::new(SelectorConfig::default());
        s.reuse_mut().set_keeping(["a-buffered"]);
        let c = read(cache);
        let one = s.choose(&c, &names).unwrap().backend;
        s.record(&c, &one, Linear("x", 1000.0, 1.0).observation(8 << 20));
        let two = s.choose(&c, &names).unwrap().backend;
        [one, two]
    };
    // Cold: the direct path first; with a sample to compare with, the other one.
    assert_eq!(first(CacheState::Cold), ["b-direct", "a-buffered"]);
    // Elsewhere, name order (no estimates, no priors).
    assert_eq!(first(CacheState::Cached), ["a-buffered", "b-direct"]);
}

#[test]
fn a_choice_that_slid_behind_a_surviving_candidate_gives_way() {
    let mut s = Selector::new(SelectorConfig::default());
    let c = ctx(1 << 20);
    let names = ["a", "b"];
    let cost = |ns: u64| taking(1 << 20, ns);
    // `b` overlaps `a` (not separated) but is more than 10% slower: 3 samples settle
    // it, while `a`, the leader, is confirmed with 6.
    for ns in [1000, 1000, 1300] {
        s.record(&c, "a", cost(ns));
    }
    for ns in [1200, 1250, 1250] {
        s.record(&c, "b", cost(ns));
    }
    for _ in 0..3 {
        s.record(&c, "a", cost(1000));
    }
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("a"));
    // `a` slides to 1.9x, each step below the drift factor (1.5 x its slowest): `b`
    // leads and needs confirming samples.
    let mut explored_b = 0;
    for _ in 0..40 {
        let choice = s.choose(&c, &names).unwrap();
        let ns = if choice.backend == "a" { 1900 } else { 1250 };
        explored_b += usize::from(choice.exploring && choice.backend == "b");
        s.record(&c, &choice.backend, cost(ns));
    }
    assert_eq!(explored_b, 3);
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("b"));
}

#[test]
fn a_severe_slowdown_explores_again_after_two_transfers_a_milder_one_after_five() {
    let c = ctx(8 << 20);
    let backends = [Linear("a", 0.0, 0.25), Linear("b", 0.0, 0.5)];
    let cost = |ns: u64| taking(8 << 20, ns);
    let median = 0.25 * (8 << 20) as f64;
    let explored = |slow: f64, outliers: &[usize]| {
        let mut s = Selector::new(SelectorConfig::default());
        explore(&mut s, 8 << 20, &backends);
        assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("a"));
        let mut n = 0;
        while s.stats().reexplorations == 0 {
            n += 1;
            assert!(n < 20, "no drift after {n} slow transfers");
            let ns = if outliers.contains(&n) { 4.0 } else { slow };
            s.record(&c, "a", cost((ns * median) as u64));
        }
        n
    };
    // 4x: two transfers; 2x (slow, not severe): drift_count (5).
    assert_eq!(explored(4.0, &[]), 2);
    assert_eq!(explored(2.0, &[]), 5);
    // One severe transfer among milder ones is no evidence on its own.
    assert_eq!(explored(2.0, &[1, 3]), 5);
    // A lone severe outlier between ordinary transfers explores nothing.
    let mut s = Selector::new(SelectorConfig::default());
    explore(&mut s, 8 << 20, &backends);
    for ns in [1.0, 4.0, 1.0, 4.0, 1.0, 1.0] {
        s.record(&c, "a", cost((ns * median) as u64));
    }
    assert_eq!(s.stats().reexplorations, 0);
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("a"));
}

#[test]
fn dropped_candidates_are_looked_at_again_ever_more_rarely_and_win_once_faster() {
    let c = ctx(64 << 10);
    let names = ["direct", "buffered"];
    let cost = |ns: u64| taking(64 << 10, ns);
    // `buffered` costs `buffered_ns` for as long as it is measured (twice `direct`'s
    // 100 µs while memory had to be faulted in again); returns the transfers at which
    // it was measured.
    let run = |transfers: usize, buffered_ns: u64| {
        let mut s = Selector::new(SelectorConfig::default());
        for _ in 0..3 {
            s.record(&c, "buffered", cost(200_000));
        }
        for _ in 0..6 {
            s.record(&c, "direct", cost(100_000));
        }
        assert!(state(&s, 64 << 10).candidates["buffered"].is_dropped());
        assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("direct"));
        let mut looks = Vec::new();
        for i in 0..transfers {
            let choice = s.choose(&c, &names).unwrap();
            let ns = if choice.backend == "buffered" {
                looks.push(i);
                buffered_ns
            } else {
                100_000
            };
            s.record(&c, &choice.backend, cost(ns));
        }
        (s, looks)
    };
    // Still 2x slower: one sample per look, the first after `RELOOK_AFTER` transfers of
    // `direct`, each later one after twice as many as the one before: the looks cost a
    // number of samples logarithmic in the context's life (9 in 64 * 2^9 transfers).
    let after = config::RELOOK_AFTER as usize;
    let (s, looks) = run(after << 9, 200_000);
    assert_eq!(looks[0], after, "{looks:?}");
    for (k, w) in looks.windows(2).enumerate() {
        assert_eq!(w[1] - w[0] - 1, after << (k + 1), "{looks:?}");
    }
    assert!(looks.len() <= 10, "{looks:?}");
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("direct"));
    // Now 10x faster (memory at hand): the first look finds it and it is chosen.
    let (s, looks) = run(400, 10_000);
    assert_eq!(looks[0], after);
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("buffered"));
}

#[test]
fn a_choice_gives_way_only_to_a_leader_clearly_better() {
    let mut s = Selector::new(SelectorConfig::default());
    let c = ctx(1 << 20);
    let names = ["a", "b"];
    let cost = |ns: u64| taking(1 << 20, ns);
    // `b` overlaps `a` and is more than 10% slower: 3 samples settle it; `a`, the
    // leader, is confirmed with 6.
    for ns in [1000, 1000, 1150, 1000, 1000, 1000] {
        s.record(&c, "a", cost(ns));
    }
    for _ in 0..3 {
        s.record(&c, "b", cost(1120));
    }
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("a"));
    // `a` settles at 1150: `b` leads by under 3%, and `a` stays the choice.
    for _ in 0..12 {
        let choice = s.choose(&c, &names).unwrap();
        assert_eq!((choice.backend.as_str(), choice.exploring), ("a", false));
        s.record(&c, "a", cost(1150));
    }
    // At 1250 `a` is clearly behind: `b` gets its confirming samples and the choice.
    let mut explored_b = 0;
    for _ in 0..40 {
        let choice = s.choose(&c, &names).unwrap();
        let ns = if choice.backend == "a" { 1250 } else { 1120 };
        explored_b += usize::from(choice.exploring && choice.backend == "b");
        s.record(&c, &choice.backend, cost(ns));
    }
    assert_eq!(explored_b, 3);
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("b"));
}

#[test]
fn a_candidate_dropped_on_one_outlier_gets_a_second_look() {
    let c = ctx(8 << 20);
    let names = ["direct", "buffered"];
    let cost = |ns: u64| taking(8 << 20, ns);
    // `buffered` costs 2000; `direct` was measured once at `first`, and costs `then` when
    // measured again. Returns the selector and the backends of 100 transfers.
    let run = |first: u64, then: u64| {
        let mut s = Selector::new(SelectorConfig::default());
        s.record(&c, "buffered", cost(2000));
        s.record(&c, "direct", cost(first));
        assert!(state(&s, 8 << 20).candidates["direct"].is_dropped());
        let mut used = Vec::new();
        for _ in 0..100 {
            let choice = s.choose(&c, &names).unwrap();
            let ns = if choice.backend == "direct" {
                then
            } else {
                2000
            };
            s.record(&c, &choice.backend, cost(ns));
            used.push(choice.backend);
        }
        (s, used)
    };
    // `direct` really costs 1000 but its one sample was a 5x outlier: dropped at once.
    // `buffered` is confirmed (6 samples) and runs 64 transfers; then `direct` is
    // measured again and taken.
    let (s, used) = run(5000, 1000);
    let first_direct = used.iter().position(|b| b == "direct").unwrap();
    assert_eq!(first_direct, 5 + 64);
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("direct"));
    assert!(used[first_direct..].iter().all(|b| b == "direct"));
    // A candidate whose second sample is slow too stays dropped.
    let (s, _) = run(5000, 5000);
    let st = state(&s, 8 << 20);
    assert!(st.candidates["direct"].is_dropped());
    assert_eq!(st.choice(), Some("buffered"));
    // A candidate measured more than 3x behind the choice gets no second look.
    let (s, used) = run(7000, 7000);
    assert!(used.iter().all(|b| b == "buffered"));
    assert_eq!(state(&s, 8 << 20).candidates["direct"].samples.len(), 1);
}

#[test]
fn a_warm_up_measurement_counts_only_when_far_behind_the_leader() {
    let mut s = Selector::new(SelectorConfig::default());
    let c = ctx(1 << 20);
    let cost = |ns: u64| taking(1 << 20, ns);
    // No leader yet: nothing to be far behind.
    assert!(!s.record_if_far(&c, "mapped", cost(9000)));
    s.record(&c, "direct", cost(1000));
    // 3x (a readahead ramp can cost that): not recorded; nor is the leader's own.
    assert!(!s.record_if_far(&c, "mapped", cost(3000)));
    assert!(!s.record_if_far(&c, "direct", cost(9000)));
    assert!(!state(&s, 1 << 20).candidates.contains_key("mapped"));
    // 7x: recorded, and the path is dropped without being measured warm.
    assert!(s.record_if_far(&c, "mapped", cost(7000)));
    let st = state(&s, 1 << 20);
    assert!(st.candidates["mapped"].is_dropped());
    assert_eq!(st.candidates["direct"].samples.len(), 1);
}

#[test]
fn rereads_make_a_cold_read_through_the_page_cache_worth_its_extra_cost() {
    let read_of = |bytes: u64, cache: CacheState| TransferContext {
        direction: Direction::Read,
        cache,
        ..ctx(bytes)
    };
    let read = |cache: CacheState| read_of(8 << 20, cache);
    // posix: cold 0.45 ns/B, cached 0.10; uring: cold 0.30 (bypasses the cache).
    let cost = |name: &'static str, cache: CacheState| match (name, cache) {
        ("posix", CacheState::Cached) => Linear(name, 0.0, 0.10),
        ("posix", _) => Linear(name, 0.0, 0.45),
        (_, _) => Linear(name, 0.0, 0.30),
    };
    // `cached_bytes`: the size class where cached reads were measured.
    let run_with = |rate: f64, cached_bytes: u64| {
        let mut s = Selector::new(SelectorConfig::default());
        s.reuse_mut().set_keeping(["posix"]);
        s.reuse_mut().set_rate(rate);
        for _ in 0..8 {
            let b = cost("posix", CacheState::Cached);
            let c = read_of(cached_bytes, CacheState::Cached);
            s.record(&c, "posix", b.observation(cached_bytes));
        }
        let names = ["posix", "uring"];
        for _ in 0..40 {
            let c = s.choose(&read(CacheState::Cold), &names).unwrap();
            let b = cost(
                if c.backend == "posix" {
                    "posix"
                } else {
                    "uring"
                },
                CacheState::Cold,
            );
            s.record(&read(CacheState::Cold), &c.backend, b.observation(8 << 20));
        }
        s.choice_for(&ContextKey::of(&read(CacheState::Cold)))
            .map(str::to_string)
    };
    let run = |rate: f64| run_with(rate, 8 << 20);
    // Nothing read again: the faster cold read wins.
    assert_eq!(run(0.0).as_deref(), Some("uring"));
    // Everything read again: 0.45 + 0.10 against 2 x 0.30.
    assert_eq!(run(1.0).as_deref(), Some("posix"));
    // Half read again: 0.50 against 0.45.
    assert_eq!(run(0.5).as_deref(), Some("uring"));
    // Cached reads measured in another size class only (this one was read cold through
    // a direct path, never cached): the nearest class stands in.
    assert_eq!(run_with(1.0, 1 << 20).as_deref(), Some("posix"));
}

#[test]
fn the_second_look_judges_with_rereads() {
    // Everything is read again. posix (keeps the cache): cold 0.45 ns/B, cached 0.10,
    // but its first cold sample was a 1.0 outlier; uring (bypasses it): 0.30 cold. Raw,
    // that sample is 3.3x uring's cost, too far for a second look; judged with the
    // next read it is 1.10 against 0.60, within 3x, and posix (0.55 against 0.60) wins.
    let read = |cache: CacheState| TransferContext {
        direction: Direction::Read,
        cache,
        ..ctx(8 << 20)
    };
    let mut s = Selector::new(SelectorConfig::default());
    s.reuse_mut().set_keeping(["posix"]);
    s.reuse_mut().set_rate(1.0);
    for _ in 0..8 {
        s.record(
            &read(CacheState::Cached),
            "posix",
            taking(8 << 20, (0.10 * (8 << 20) as f64) as u64),
        );
    }
    let cold = read(CacheState::Cold);
    let mut posix_reads = 0;
    for _ in 0..120 {
        let c = s.choose(&cold, &["posix", "uring"]).unwrap();
        let per_byte = match (c.backend.as_str(), posix_reads) {
            ("posix", 0) => 1.0,
            ("posix", _) => 0.45,
            _ => 0.30,
        };
        if c.backend == "posix" {
            posix_reads += 1;
        }
        s.record(
            &cold,
            &c.backend,
            taking(8 << 20, (per_byte * (8 << 20) as f64) as u64),
        );
    }
    assert!(posix_reads > 1, "posix never measured again");
    assert_eq!(s.choice_for(&ContextKey::of(&cold)), Some("posix"));
}

#[test]
fn an_unseen_cold_read_class_judges_predictions_with_rereads() {
    let read = |bytes: u64, cache: CacheState| TransferContext {
        direction: Direction::Read,
        cache,
        ..ctx(bytes)
    };
    let mut s = Selector::new(SelectorConfig::default());
    s.reuse_mut().set_keeping(["posix", "mmap"]);
    s.reuse_mut().set_rate(1.0);
    // ns per byte: posix 0.45 cold / 0.10 cached; mmap 2.0 cold; uring 0.30 cold.
    let costs = [("posix", 0.45), ("mmap", 2.0), ("uring", 0.30)];
    for _ in 0..8 {
        let c = read(1 << 20, CacheState::Cached);
        s.record(&c, "posix", Linear("posix", 0.0, 0.10).observation(1 << 20));
    }
    for bytes in [1u64 << 20, 2 << 20] {
        for _ in 0..8 {
            for (name, per_byte) in costs {
                let c = read(bytes, CacheState::Cold);
                s.record(&c, name, Linear(name, 0.0, per_byte).observation(bytes));
            }
        }
    }
    let names = ["mmap", "posix", "uring"];
    s.choose(&read(8 << 20, CacheState::Cold), &names).unwrap();
    let key = ContextKey::of(&read(8 << 20, CacheState::Cold));
    let state = &s.keys()[&key];
    // posix judged 0.45 + 0.10 against uring's 2 x 0.30: explored; mmap 2.0 + 0.10 is
    // more than twice uring's judged cost: not explored.
    assert!(!state.candidates["posix"].is_dropped());
    assert!(!state.candidates["uring"].is_dropped());
    assert!(state.candidates["mmap"].is_dropped());
}

#[test]
fn a_wall_only_record_carries_the_last_measured_cpu_cost() {
    let mut s = Selector::new(SelectorConfig::default());
    let c = ctx(1 << 20);
    // Nothing measured yet: no CPU assumed.
    let none = s.record_wall_only(&c, "a", 1 << 20, Duration::from_micros(100));
    assert_eq!(none, Duration::ZERO);
    let obs = Observation {
        bytes: 1 << 20,
        wall: Duration::from_micros(100),
        cpu: Duration::from_nanos(2 << 20),
    };
    s.record(&c, "a", obs);
    // 2 ns per byte carried over to a transfer twice as big.
    let cpu = s.record_wall_only(&c, "a", 2 << 20, Duration::from_micros(200));
    assert_eq!(cpu, Duration::from_nanos(4 << 20));
    let key = ContextKey::of(&c);
    let samples = s.keys()[&key].candidates["a"].samples.as_slice().to_vec();
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[2].cpu_ns_per_byte, 2.0);
    assert_eq!(s.stats().observations, 3);
}

#[test]
fn model_skips_a_candidate_6x_worse_in_three_classes() {
    let a = Linear("a", 10_000.0, 0.3);
    let b = Linear("b", 60_000.0, 1.8); // 6x a at every size
    let mut s = Selector::new(SelectorConfig::default());
    for bytes in [4 << 10, 64 << 10, 1 << 20] {
        measure_all(&mut s, bytes, &[a, b], 6);
    }
    // The old rule would explore b at 8 MiB: 6 < 1.3 * 2^3.
    let cfg = SelectorConfig::default();
    assert!(6.0 < cfg.elimination_factor * 8.0);
    let before = s.stats().explorations;
    let explored = explore(&mut s, 8 << 20, &[a, b]);
    assert!(!explored.contains(&"b"), "{explored:?}");
    // Only a is measured, as often as a leader needs (`confirm_samples`).
    assert_eq!(s.stats().explorations - before, 6, "{explored:?}");
    let st = state(&s, 8 << 20);
    assert!(st.candidates["b"].is_dropped());
    assert!(st.candidates["b"].samples.is_empty());
    assert_eq!(st.choice(), Some("a"));
    // b's prediction is its model's cost at 8 MiB (per byte): 6x a's.
    let prior = st.candidates["b"].status.prior().unwrap();
    let expected = 60_000.0 / (8 << 20) as f64 + 1.8;
    assert!(
        (prior - expected).abs() < 1e-3 * expected,
        "{prior} {expected}"
    );
}

#[test]
fn model_never_eliminates_a_candidate_without_history() {
    let a = Linear("a", 10_000.0, 0.3);
    let b = Linear("b", 60_000.0, 1.8);
    let c = Linear("c", 10_000.0, 0.35);
    let mut s = Selector::new(SelectorConfig::default());
    for bytes in [4 << 10, 64 << 10, 1 << 20] {
        measure_all(&mut s, bytes, &[a, b], 6);
    }
    // Seeded on the first choice: b is dropped, c (never measured) is not.
    s.choose(&ctx(8 << 20), &["a", "b", "c"]).unwrap();
    let st = state(&s, 8 << 20);
    assert!(st.candidates["b"].is_dropped());
    assert!(!st.candidates["c"].is_dropped());
    assert_eq!(st.candidates["c"].status.prior(), None);
    let explored = explore(&mut s, 8 << 20, &[a, b, c]);
    assert!(explored.contains(&"c"), "{explored:?}");
    assert!(!explored.contains(&"b"), "{explored:?}");
    assert_eq!(s.choice_for(&ContextKey::of(&ctx(8 << 20))), Some("a"));
}

#[test]
fn model_predicts_a_crossover_to_the_bandwidth_candidate() {
    // a: cheap calls, slow bytes; b: expensive calls, fast bytes. a wins at 4 KiB and
    // 64 KiB (2.8x), b wins at 1 MiB (a costs 2.6x b).
    let a = Linear("a", 10_000.0, 1.0);
    let b = Linear("b", 200_000.0, 0.2);
    let mut s = Selector::new(SelectorConfig::default());
    for bytes in [4 << 10, 64 << 10] {
        measure_all(&mut s, bytes, &[a, b], 6);
        assert_eq!(s.choice_for(&ContextKey::of(&ctx(bytes))), Some("a"));
    }
    let explored = explore(&mut s, 1 << 20, &[a, b]);
    // The model orders b first: its prediction is the better one.
    assert_eq!(explored.first(), Some(&"b"), "{explored:?}");
    let st = state(&s, 1 << 20);
    assert!(!st.candidates["b"].is_dropped());
    assert_eq!(st.choice(), Some("b"));
}

#[test]
fn one_known_class_keeps_the_distance_rule() {
    let a = Linear("a", 10_000.0, 0.3);
    let b = Linear("b", 60_000.0, 1.8); // 6x a
    let known = 4 << 10;
    // One class away the limit is 1.3 * 2 = 2.6: b is not explored.
    let mut s = Selector::new(SelectorConfig::default());
    measure_all(&mut s, known, &[a, b], 6);
    let explored = explore(&mut s, known * 2, &[a, b]);
    assert!(!explored.contains(&"b"), "{explored:?}");
    let st = state(&s, known * 2);
    assert!(st.candidates["b"].is_dropped());
    assert!(st.candidates["b"].status.prior().is_some());
    // Three classes away it is 1.3 * 8 = 10.4: b is explored (after a, by its prior).
    let mut s = Selector::new(SelectorConfig::default());
    measure_all(&mut s, known, &[a, b], 6);
    let explored = explore(&mut s, known * 8, &[a, b]);
    assert_eq!(explored.first(), Some(&"a"), "{explored:?}");
    assert!(explored.contains(&"b"), "{explored:?}");
    assert_eq!(s.stats().inherited_keys, 1);
}

#[test]
fn classes_explored_side_by_side_seed_each_other_as_they_learn() {
    let a = Linear("a", 10_000.0, 0.3);
    let b = Linear("b", 60_000.0, 1.8); // 6x a
    let mut s = Selector::new(SelectorConfig::default());
    let record = |s: &mut Selector, bytes: u64| {
        s.record(&ctx(bytes), "a", a.observation(bytes));
        s.record(&ctx(bytes), "b", b.observation(bytes));
        // One sample each: b is dropped, the class is still exploring.
        assert!(s.choice_for(&ContextKey::of(&ctx(bytes))).is_none());
    };
    // 256 KiB is first seen when only 64 KiB has samples (one class, not explored): b
    // is not ruled out, the exploration starts with a.
    record(&mut s, 64 << 10);
    let first = s.choose(&ctx(256 << 10), &["a", "b"]).unwrap();
    assert_eq!((first.backend.as_str(), first.exploring), ("a", true));
    assert!(!state(&s, 256 << 10).candidates["b"].is_dropped());
    // 1 MiB gets its first samples too: b's cost model now rules it out at 256 KiB.
    record(&mut s, 1 << 20);
    let explored = explore(&mut s, 256 << 10, &[a, b]);
    assert!(!explored.contains(&"b"), "{explored:?}");
    let b_state = &state(&s, 256 << 10).candidates["b"];
    assert!(b_state.is_dropped() && b_state.status.seeded() && b_state.samples.is_empty());
    assert_eq!(s.stats().inherited_keys, 1);
}

#[test]
fn the_model_rules_out_only_within_four_classes_of_a_measurement() {
    let a = Linear("a", 10_000.0, 0.3);
    let b = Linear("b", 60_000.0, 1.8); // 6x a
    let explored_at = |bytes: u64| {
        let mut s = Selector::new(SelectorConfig::default());
        for known in [16 << 10, 64 << 10] {
            measure_all(&mut s, known, &[a, b], 6);
        }
        explore(&mut s, bytes, &[a, b])
    };
    // 1 MiB is 4 classes above 64 KiB: ruled out; 2 MiB, 5 classes: measured.
    assert!(!explored_at(1 << 20).contains(&"b"));
    assert!(explored_at(2 << 20).contains(&"b"));
}

#[test]
fn a_candidate_the_model_ruled_out_gets_a_second_look() {
    let a = Linear("a", 10_000.0, 0.3);
    let b = Linear("b", 20_000.0, 0.6); // 2x a: ruled out, but within 3x
    let mut s = Selector::new(SelectorConfig::default());
    for bytes in [64 << 10, 1 << 20] {
        measure_all(&mut s, bytes, &[a, b], 6);
    }
    let c = ctx(4 << 20);
    let mut used = Vec::new();
    for _ in 0..300 {
        let choice = s.choose(&c, &["a", "b"]).unwrap();
        let obs = if choice.backend == "a" { a } else { b }.observation(4 << 20);
        s.record(&c, &choice.backend, obs);
        used.push(choice.backend);
    }
    // a is confirmed (6 samples) and runs 64 transfers; then b is measured once, and
    // dropped again; a later look measures it once more after 128 transfers of a (the
    // next would come after 256).
    let bs: Vec<usize> = (0..used.len()).filter(|&i| used[i] == "b").collect();
    assert_eq!(bs, [6 + 64, 6 + 64 + 1 + 128], "{used:?}");
    let b_state = &state(&s, 4 << 20).candidates["b"];
    assert!(b_state.is_dropped() && !b_state.status.seeded());
    assert_eq!(b_state.samples.len(), 1);
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("a"));
}

#[test]
fn a_cost_seen_only_far_behind_is_not_extrapolated_to_other_classes() {
    let a = Linear("a", 10_000.0, 0.3);
    let b = Linear("b", 10_000.0, 0.2); // better than a everywhere
    let mut s = Selector::new(SelectorConfig::default());
    measure_all(&mut s, 4 << 10, &[a, b], 6);
    // At 64 KiB, b is seen only while warming up, waiting 40 times its cost behind
    // what a left in flight: ruled out there...
    assert!(s.choose(&ctx(64 << 10), &["a", "b"]).unwrap().exploring);
    for _ in 0..6 {
        s.record(&ctx(64 << 10), "a", a.observation(64 << 10));
    }
    let mut waited = b.observation(64 << 10);
    waited.wall *= 40;
    assert!(s.record_if_far(&ctx(64 << 10), "b", waited));
    assert!(state(&s, 64 << 10).candidates["b"].is_dropped());
    assert!(state(&s, 64 << 10).candidates["b"].status == Status::DroppedFar);
    // ...but 1 MiB (within the model's reach of 64 KiB) does not take that as its cost.
    let explored = explore(&mut s, 1 << 20, &[a, b]);
    assert!(explored.contains(&"b"), "{explored:?}");
    assert_eq!(s.choice_for(&ContextKey::of(&ctx(1 << 20))), Some("b"));
    // A fair sample clears the mark.
    s.record(&ctx(64 << 10), "b", b.observation(64 << 10));
    assert_ne!(
        state(&s, 64 << 10).candidates["b"].status,
        Status::DroppedFar
    );
}

#[test]
fn linear_fit_is_clamped_and_exact_on_lines() {
    let exact = LinearCost::through((1.0, 12.0), (3.0, 16.0), (3.0, 16.0));
    assert_eq!(
        exact,
        LinearCost {
            latency: 10.0,
            per_byte: 2.0
        }
    );
    assert_eq!(exact.per_byte_at(10.0), 3.0);
    // A falling total: pure latency through the nearer point.
    let falling = LinearCost::through((1.0, 12.0), (3.0, 9.0), (3.0, 9.0));
    assert_eq!(falling.latency, 9.0);
    assert_eq!(falling.per_byte, 0.0);
    // A negative latency: a pure per-byte cost through the nearer point.
    let steep = LinearCost::through((1.0, 1.0), (3.0, 9.0), (3.0, 9.0));
    assert_eq!(steep.latency, 0.0);
    assert_eq!(steep.per_byte, 3.0);
}

#[test]
fn far_extrapolation_from_noisy_small_classes_eliminates_nothing() {
    // a wins at 64 MiB (0.2 vs 0.3 ns per byte), but latency-bound classes of 4 and 8 KiB
    // say little about it: measured 8% low at 4 KiB and 8% high at 8 KiB, a's line
    // through them costs 0.64 ns per byte at 64 MiB, more than twice b's 0.30. The
    // prediction's range (and its reach: 13 classes) leave a to be measured.
    let a = Linear("a", 10_000.0, 0.2);
    let b = Linear("b", 5_000.0, 0.3);
    let mut s = Selector::new(SelectorConfig::default());
    for (bytes, skew) in [(4u64 << 10, 0.92), (8 << 10, 1.08)] {
        let mut skewed = a.observation(bytes);
        skewed.wall = skewed.wall.mul_f64(skew);
        for _ in 0..6 {
            s.record(&ctx(bytes), "a", skewed);
            s.record(&ctx(bytes), "b", b.observation(bytes));
        }
    }
    let explored = explore(&mut s, 64 << 20, &[a, b]);
    assert!(explored.contains(&"a"), "{explored:?}");
    assert_eq!(s.choice_for(&ContextKey::of(&ctx(64 << 20))), Some("a"));
}

#[test]
fn a_choice_that_slides_gradually_behind_a_dropped_path_gives_way_to_it() {
    // The engine test's costs: `a` 10 µs + 1 ns/B, `b` 200 µs + 0.2 ns/B at 1 MiB; `b`
    // then slows by 20% a step, never 1.5x its slowest recent sample (no drift).
    let (bytes, names) = (1u64 << 20, ["a", "b"]);
    let c = ctx(bytes);
    let mut s = Selector::new(SelectorConfig::default());
    let a = Linear("a", 10_000.0, 1.0);
    let mut b = Linear("b", 200_000.0, 0.2);
    let step = |s: &mut Selector, b: &Linear| {
        let choice = s.choose(&c, &names).unwrap();
        let cost = if choice.backend == "a" { a } else { *b };
        s.record(&c, &choice.backend, cost.observation(bytes));
    };
    for _ in 0..30 {
        step(&mut s, &b);
    }
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("b"));
    assert!(state(&s, bytes).candidates["a"].is_dropped());
    for _ in 0..12 {
        b.2 *= 1.2;
        for _ in 0..8 {
            step(&mut s, &b);
        }
    }
    assert_eq!(s.choice_for(&ContextKey::of(&c)), Some("a"));
    assert!(s.stats().reexplorations >= 1);
}

/// Runs transfers of `bytes` until the exploration ends; each backend `(name, wall ns, cpu
/// ns)` costs the same every time. Returns the final choice.
fn explore_with_cpu(s: &mut Selector, bytes: u64, backends: &[(&'static str, u64, u64)]) -> String {
    let names: Vec<&str> = backends.iter().map(|b| b.0).collect();
    for _ in 0..100 {
        let choice = s.choose(&ctx(bytes), &names).unwrap();
        if !choice.exploring {
            return choice.backend.to_string();
        }
        let b = backends.iter().find(|b| b.0 == choice.backend).unwrap();
        let obs = Observation {
            bytes,
            wall: Duration::from_nanos(b.1),
            cpu: Duration::from_nanos(b.2),
        };
        s.record(&ctx(bytes), b.0, obs);
    }
    panic!("still exploring after 100 transfers");
}

#[test]
fn paths_tied_on_time_go_to_the_one_that_costs_less_cpu() {
    let mut s = Selector::new(SelectorConfig::default());
    // `cached` is 1% faster but takes 40% more CPU: tied on time, `direct` leads.
    let chosen = explore_with_cpu(
        &mut s,
        4 << 20,
        &[
            ("cached", 9_900_000, 1_400_000),
            ("direct", 10_000_000, 1_000_000),
        ],
    );
    assert_eq!(chosen, "direct");
}

#[test]
fn a_path_clearly_faster_wins_whatever_its_cpu_cost() {
    let mut s = Selector::new(SelectorConfig::default());
    let chosen = explore_with_cpu(
        &mut s,
        4 << 20,
        &[
            ("cached", 8_000_000, 3_000_000),
            ("direct", 10_000_000, 1_000_000),
        ],
    );
    assert_eq!(chosen, "cached");
}

#[test]
fn under_the_cpu_objective_ties_on_time_do_not_matter() {
    let config = SelectorConfig {
        objective: Objective::Cpu,
        ..SelectorConfig::default()
    };
    let mut s = Selector::new(config);
    let chosen = explore_with_cpu(
        &mut s,
        4 << 20,
        &[
            ("cached", 9_900_000, 1_400_000),
            ("direct", 10_000_000, 1_500_000),
        ],
    );
    assert_eq!(chosen, "cached");
}
