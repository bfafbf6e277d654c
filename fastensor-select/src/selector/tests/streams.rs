//! Exploration along a stream of transfers: kept answers, runs on one path, the first path of a cold read.

use super::*;

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
        if (rng >> 20).is_multiple_of(3) {
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
    // Runs of consecutive transfers, not alternation: every path is measured once, in
    // name order, and then each needs at most one further run for its remaining samples.
    assert_eq!(order[..3], ["a", "b", "c"]);
    for name in names {
        let runs = order
            .iter()
            .enumerate()
            .filter(|&(i, b)| b == name && (i == 0 || order[i - 1] != *b))
            .count();
        assert!((1..=2).contains(&runs), "{name}: {runs} runs in {order:?}");
    }
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
    let read = |cache: CacheState| read_ctx(8 << 20, cache);
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
