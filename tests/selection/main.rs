//! Engine selection with throttled backends of known costs on a virtual clock: no sleeping,
//! exact durations, deterministic results. Paths warming up, runs of transfers and
//! checkpoint jobs: `runs.rs`.

mod runs;

use fastensor::core::ClockReading;
use fastensor::select::SelectorConfig;
use fastensor::{Backend, Engine, EngineBuilder, EngineFile, OpenMode, Registry};
use fastensor_testkit::throttled::{Cost, Costs, Throttled, VirtualClock};
use fastensor_testkit::MemoryBackend;
use std::path::Path;
use std::sync::Arc;

struct Setup {
    engine: Engine,
    a: Arc<Throttled>,
    b: Arc<Throttled>,
}

/// Creates the in-memory file `/virtual/{name}` through `engine`.
fn create(engine: &Engine, name: &str) -> EngineFile {
    engine
        .open(&Path::new("/virtual").join(name), OpenMode::Create)
        .unwrap()
}

/// `a`: cheap calls, slow bytes; `b`: expensive calls, fast bytes. Both over one store.
fn costs_a() -> Cost {
    Cost::new(10_000, 1.0)
}
fn costs_b() -> Cost {
    Cost::new(200_000, 0.2)
}

/// `a` and `b` over one in-memory store, timed by `clock`.
fn pair(clock: &VirtualClock) -> (Arc<Throttled>, Arc<Throttled>) {
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let a = Arc::new(Throttled::virtual_clock(
        "a",
        store.clone(),
        Costs::uniform(costs_a()),
        clock,
    ));
    let b = Arc::new(Throttled::virtual_clock(
        "b",
        store,
        Costs::uniform(costs_b()),
        clock,
    ));
    (a, b)
}

/// An engine builder with no compiled-in backend, whose clock is `clock`.
fn builder(clock: &VirtualClock) -> EngineBuilder {
    let c = clock.clone();
    Engine::builder()
        .registry(Registry::new())
        .clock(move || ClockReading {
            wall: c.wall(),
            cpu: c.cpu(),
        })
}

fn setup(config: SelectorConfig) -> Setup {
    let clock = VirtualClock::new();
    let (a, b) = pair(&clock);
    let engine = builder(&clock)
        .backend(a.clone())
        .backend(b.clone())
        .selector_config(config)
        .build()
        .unwrap();
    Setup { engine, a, b }
}

fn best_of(bytes: u64) -> &'static str {
    let (ta, _) = costs_a().of(bytes);
    let (tb, _) = costs_b().of(bytes);
    if ta <= tb {
        "a"
    } else {
        "b"
    }
}

#[test]
fn finds_the_crossover_with_bounded_exploration() {
    let s = setup(SelectorConfig::default());
    let file = create(&s.engine, "crossover.bin");
    let sizes: Vec<usize> = (12..=24).map(|k| 1usize << k).collect();
    let mut buf = vec![0u8; 1 << 24];
    let round = |round: u8, buf: &mut Vec<u8>| {
        for &n in &sizes {
            buf[..n].fill(round);
            file.write_at(0, &buf[..n]).unwrap();
            assert_eq!(file.read_at(0, &mut buf[..n]).unwrap(), n);
        }
    };
    for r in 0..15 {
        round(r, &mut buf);
    }
    let report = s.engine.report();
    let mut crossover_seen = (false, false);
    for ctx in &report.dictionary.contexts {
        let bytes = 1u64 << ctx.size_class;
        let expected = best_of(bytes);
        assert_eq!(
            ctx.choice.as_deref(),
            Some(expected),
            "size {bytes} {}",
            ctx.direction
        );
        if expected == "a" {
            crossover_seen.0 = true;
        } else {
            crossover_seen.1 = true;
        }
        // Far from the crossover (16x and more) the loser is dropped, not confirmed.
        let (ta, tb) = (costs_a().of(bytes).0, costs_b().of(bytes).0);
        if ta.max(tb) > 4 * ta.min(tb) {
            let loser = ctx.candidates.iter().find(|c| c.name != expected).unwrap();
            assert!(
                loser.eliminated,
                "size {bytes}: {}",
                fastensor::profile::Table(&report.dictionary)
            );
        }
    }
    assert!(
        crossover_seen.0 && crossover_seen.1,
        "both sides of the crossover are in range"
    );
    // Exploration is bounded by a stated budget: at most `confirm_samples` measurements per
    // candidate and context.
    let contexts = report.dictionary.contexts.len() as u64;
    let budget = contexts * 2 * SelectorConfig::default().confirm_samples as u64;
    assert!(
        report.stats.explorations <= budget,
        "explorations {} over {budget}",
        report.stats.explorations
    );
    // Once explored, every transfer goes through the best backend of its size.
    let (a0, b0) = (s.a.calls(), s.b.calls());
    for r in 15..20 {
        round(r, &mut buf);
    }
    let through_a = sizes.iter().filter(|&&n| best_of(n as u64) == "a").count() as u64;
    let through_b = sizes.len() as u64 - through_a;
    assert_eq!(s.a.calls() - a0, 5 * 2 * through_a, "{report}");
    assert_eq!(s.b.calls() - b0, 5 * 2 * through_b, "{report}");
}

#[test]
fn drift_triggers_exploration_again() {
    let s = setup(SelectorConfig::default());
    let file = create(&s.engine, "drift.bin");
    let data = vec![1u8; 1 << 20]; // 1 MiB: b is best (210 µs vs 1058 µs)
    for _ in 0..30 {
        file.write_at(0, &data).unwrap();
    }
    assert_eq!(s.engine.selector_stats().reexplorations, 0);
    assert_eq!(
        s.engine.report().dictionary.contexts[0].choice.as_deref(),
        Some("b")
    );
    // b's device slows down tenfold: after drift_count slow transfers the context is explored
    // again and a wins.
    s.b.set_costs(Costs::uniform(Cost::new(2_000_000, 2.0)));
    for _ in 0..30 {
        file.write_at(0, &data).unwrap();
    }
    let stats = s.engine.selector_stats();
    assert!(stats.reexplorations >= 1);
    assert_eq!(
        s.engine.report().dictionary.contexts[0].choice.as_deref(),
        Some("a")
    );
    assert!(s.engine.report().dictionary.contexts[0].reexplorations >= 1);
}

#[test]
fn a_choice_that_slides_gradually_behind_a_dropped_path_is_explored_again() {
    let s = setup(SelectorConfig::default());
    let file = create(&s.engine, "slide.bin");
    let data = vec![1u8; 1 << 20]; // 1 MiB: b is best (410 µs vs 1058 µs), a is dropped
    for _ in 0..30 {
        file.write_at(0, &data).unwrap();
    }
    let ctx = || s.engine.report().dictionary.contexts[0].clone();
    assert_eq!(ctx().choice.as_deref(), Some("b"));
    // b slows down by 20% a step: no observation is 1.5x the slowest recent one (no drift),
    // but its median ends far behind a's, which was dropped: a is measured again and wins.
    let mut per_byte = 0.2;
    for _ in 0..12 {
        per_byte *= 1.2;
        s.b.set_costs(Costs::uniform(Cost::new(200_000, per_byte)));
        for _ in 0..8 {
            file.write_at(0, &data).unwrap();
        }
    }
    let c = ctx();
    assert_eq!(c.choice.as_deref(), Some("a"), "{}", s.engine.report());
    assert!(c.reexplorations >= 1);
}

#[test]
fn pinning_overrides_the_selector() {
    let s = setup(SelectorConfig::default());
    let file = create(&s.engine, "pin.bin");
    s.engine.pin(Some("a")).unwrap();
    let data = vec![1u8; 1 << 22];
    for _ in 0..5 {
        file.write_at(0, &data).unwrap();
    }
    assert_eq!(s.b.calls(), 0);
    assert!(s.engine.pin(Some("nope")).is_err());
    s.engine.pin(None).unwrap();
    file.pin(Some("b")).unwrap();
    file.write_at(0, &data).unwrap();
    assert_eq!(s.b.calls(), 1);
}

#[test]
fn cpu_objective_prefers_the_backend_that_spares_the_cpu() {
    let clock = VirtualClock::new();
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    // "busy" is faster but burns CPU on every byte; "idle" is slower and spares the CPU.
    let busy = Throttled::virtual_clock(
        "busy",
        store.clone(),
        Costs::uniform(Cost::new(1_000, 0.3).with_cpu(1_000, 0.3)),
        &clock,
    );
    let idle = Throttled::virtual_clock(
        "idle",
        store,
        Costs::uniform(Cost::new(1_000, 0.5).with_cpu(1_000, 0.01)),
        &clock,
    );
    let run = |objective| {
        let engine = builder(&clock)
            .backend(Arc::new(busy.clone()))
            .backend(Arc::new(idle.clone()))
            .objective(objective)
            .build()
            .unwrap();
        let file = create(&engine, "cpu.bin");
        let data = vec![0u8; 1 << 20];
        for _ in 0..20 {
            file.write_at(0, &data).unwrap();
        }
        engine.report().dictionary.contexts[0]
            .choice
            .clone()
            .unwrap()
    };
    assert_eq!(run(fastensor::Objective::Time), "busy");
    assert_eq!(run(fastensor::Objective::Cpu), "idle");
}

#[test]
fn profile_round_trip_through_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("profile.toml");
    let clock = VirtualClock::new();
    let (a, b) = pair(&clock);
    let build = || {
        builder(&clock)
            .backend(a.clone())
            .backend(b.clone())
            .profile(&profile)
            .build()
            .unwrap()
    };
    let engine = build();
    assert!(engine.load_warning().is_none());
    let file = create(&engine, "p.bin");
    let data = vec![0u8; 4096];
    // Enough writes to end the exploration (`a`'s are measured in runs of 8).
    for _ in 0..64 {
        file.write_at(0, &data).unwrap();
    }
    drop(file);
    engine.save_profile().unwrap();
    let saved = engine.dictionary();
    // A second engine starts from the profile: no exploration at all.
    let again = build();
    assert!(again.load_warning().is_none());
    assert_eq!(again.dictionary(), saved);
    let file = create(&again, "p.bin");
    let calls_b = b.calls();
    for _ in 0..10 {
        file.write_at(0, &data).unwrap();
    }
    assert_eq!(again.selector_stats().explorations, 0);
    assert_eq!(b.calls(), calls_b, "a is the choice for 4 KiB");
}

#[test]
fn engine_is_send_and_sync_and_works_from_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Engine>();
    assert_send_sync::<fastensor::EngineFile>();
    let s = setup(SelectorConfig::default());
    let file = Arc::new(create(&s.engine, "threads.bin"));
    file.write_at(0, &vec![0u8; 8 * 65536]).unwrap();
    std::thread::scope(|scope| {
        for t in 0..8u8 {
            let file = file.clone();
            scope.spawn(move || {
                let data = vec![t + 1; 65536];
                for _ in 0..20 {
                    file.write_at(u64::from(t) * 65536, &data).unwrap();
                    let mut back = vec![0u8; 65536];
                    file.read_at(u64::from(t) * 65536, &mut back).unwrap();
                    assert_eq!(back, data);
                }
            });
        }
    });
    // Every transfer is observed but for a few exploring reads that took over another
    // thread's stream (those measure the other path's state); the chosen writes in runs of
    // up to 8 (the last one recorded when the file is dropped).
    drop(file);
    let observations = s.engine.selector_stats().observations;
    assert!(
        observations >= 8 * 20 * 3 / 4 + 8 * 20 / 8,
        "{observations}"
    );
}
