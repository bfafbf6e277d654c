//! Selection over runs of transfers: a path's warm-up, the first transfer through a new
//! handle, runs of small writes, and checkpoint loads as jobs.

use super::*;

/// Reads a file of 64 transfers of `size` bytes as one stream with an engine of two paths:
/// `a-direct` bypasses the page cache (it warms up in 2 reads), `b-buffered` keeps it (8 MiB
/// of warm-up) and costs 10x more. Returns the reads `b-buffered` made.
fn reads_of_a_slow_buffered_path(size: usize) -> u64 {
    let clock = VirtualClock::new();
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let caps = store.capabilities();
    let direct = Arc::new(
        Throttled::virtual_clock(
            "a-direct",
            store.clone(),
            Costs::uniform(Cost::new(10_000, 0.3)),
            &clock,
        )
        .with_capabilities(fastensor::Capabilities {
            bypasses_page_cache: true,
            ..caps
        }),
    );
    let buffered = Arc::new(Throttled::virtual_clock(
        "b-buffered",
        store,
        Costs::uniform(Cost::new(10_000, 3.0)),
        &clock,
    ));
    let engine = builder(&clock)
        .backend(direct.clone())
        .backend(buffered.clone())
        .build()
        .unwrap();
    let path = Path::new("/virtual/stream.bin");
    let data = vec![3u8; size];
    {
        let file = engine.open(path, OpenMode::Create).unwrap();
        for i in 0..64u64 {
            file.write_at(i * size as u64, &data).unwrap();
        }
    }
    let reads_before = buffered.calls();
    let file = engine.open(path, OpenMode::Read).unwrap();
    let mut buf = vec![0u8; size];
    for i in 0..64u64 {
        file.read_at(i * size as u64, &mut buf).unwrap();
    }
    drop(file);
    let dict = engine.dictionary();
    let read = dict
        .contexts
        .iter()
        .find(|c| c.direction == "read")
        .unwrap();
    assert_eq!(read.choice.as_deref(), Some("a-direct"));
    // The report counts every transfer, measured in runs or not: 64 writes and 64 reads.
    let usage = engine.report().usage;
    assert_eq!(usage.iter().map(|u| u.transfers).sum::<u64>(), 128);
    assert_eq!(
        usage.iter().map(|u| u.bytes).sum::<u64>(),
        128 * size as u64
    );
    buffered.calls() - reads_before
}

#[test]
fn a_slow_path_through_the_page_cache_is_ruled_out_by_its_warm_up() {
    // Measured warm, after 8 MiB of warm-up, `b-buffered` would read 8 MiB / size + 1
    // times (17 at 512 KiB); ruled out by its warm-up, it costs at most its first read
    // (through a new handle, not measured) and one warm-up run of 8 reads, which shows it
    // 10x behind.
    assert!(reads_of_a_slow_buffered_path(512 << 10) <= 9);
    // At 1 MiB and more, its first reads, far behind as well, fill the warm-up run early
    // (it holds at most 4 MiB): a second read at most.
    assert!(reads_of_a_slow_buffered_path(1 << 20) <= 2);
    // At 64 KiB, slow on every read, the one warm-up run rules it out too (a warm-up run of
    // small reads is judged without its slowest read, see `Run::far_test_wall`), far below
    // the 129 reads of 8 MiB of warm-up.
    assert!(reads_of_a_slow_buffered_path(64 << 10) <= 9);
}

#[test]
fn the_first_transfer_through_the_handle_opened_with_the_file_is_not_measured() {
    // 4 KiB writes: `a` costs 14 µs, `b` 201 µs. `a`'s handle is opened with the file, and
    // its first write pays a one-off set-up (as a mapping's first page faults do): 2 ms.
    let s = setup(SelectorConfig::default());
    let file = create(&s.engine, "first.bin");
    let page = vec![5u8; 4096];
    s.a.set_costs(Costs::uniform(Cost::new(2_000_000, 1.0)));
    file.write_at(0, &page).unwrap();
    assert_eq!(s.a.calls(), 1, "the exploration starts with `a`");
    s.a.set_costs(Costs::uniform(costs_a()));
    for i in 1..64u64 {
        file.write_at(i * 4096, &page).unwrap();
    }
    let dict = s.engine.dictionary();
    let write = dict
        .contexts
        .iter()
        .find(|c| c.direction == "write")
        .unwrap();
    // Measured, that first write would have dropped `a` at once (2 ms against 201 µs).
    assert_eq!(write.choice.as_deref(), Some("a"), "{}", s.engine.report());
}

#[test]
fn a_large_first_transfer_far_behind_the_leader_rules_its_path_out() {
    // 8 MiB writes: `a` 1.9 ms, `b` 8.4 ms (4.5 times `a`).
    let s = setup(SelectorConfig::default());
    s.a.set_costs(Costs::uniform(costs_b()));
    s.b.set_costs(Costs::uniform(costs_a()));
    let file = create(&s.engine, "first-far.bin");
    let data = vec![3u8; 8 << 20];
    for i in 0..8u64 {
        file.write_at(i << 23, &data).unwrap();
    }
    // `a` first (unmeasured, then measured: the leader), then `b` once: its first write,
    // far behind, drops it (left unmeasured, a second write would have been needed).
    assert_eq!(s.b.calls(), 1, "{}", s.engine.report());
    let dict = s.engine.dictionary();
    let write = &dict.contexts[0];
    assert_eq!(write.choice.as_deref(), Some("a"), "{}", s.engine.report());
}

/// An engine over one store with a path that keeps the page cache, `buffered`, and one that
/// bypasses it, `direct`, each costing `call_ns` a call.
fn buffered_and_direct(
    buffered_ns: u64,
    direct_ns: u64,
) -> (Engine, Arc<Throttled>, Arc<Throttled>) {
    let clock = VirtualClock::new();
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let caps = store.capabilities();
    let buffered = Arc::new(Throttled::virtual_clock(
        "buffered",
        store.clone(),
        Costs::uniform(Cost::new(buffered_ns, 0.0)),
        &clock,
    ));
    let direct = Arc::new(
        Throttled::virtual_clock(
            "direct",
            store,
            Costs::uniform(Cost::new(direct_ns, 0.0)),
            &clock,
        )
        .with_capabilities(fastensor::Capabilities {
            bypasses_page_cache: true,
            ..caps
        }),
    );
    let engine = builder(&clock)
        .backend(buffered.clone())
        .backend(direct.clone())
        .build()
        .unwrap();
    (engine, buffered, direct)
}

#[test]
fn small_writes_are_recorded_in_runs_but_a_direct_paths_explorations_one_by_one() {
    // `buffered` 14 µs a write, `direct` 201 µs.
    let (engine, buffered, direct) = buffered_and_direct(14_000, 201_000);
    let file = create(&engine, "write-runs.bin");
    let data = vec![7u8; 4096];
    let writes = 400u64;
    for i in 0..writes {
        file.write_at(i * 4096, &data).unwrap();
    }
    let before_drop = engine.selector_stats();
    drop(file);
    let stats = engine.selector_stats();
    assert_eq!(
        engine.report().dictionary.contexts[0].choice.as_deref(),
        Some("buffered")
    );
    // `direct` wrote twice: its first write through a new handle (measuring nothing) and
    // one sample, which dropped it.
    assert_eq!(direct.calls(), 2, "{stats:?}");
    // Every other write went through `buffered`, exploring or chosen, and was recorded in
    // runs of 8 (its first write through a new handle measures nothing; dropping the file
    // records the run in progress): one observation per 8 writes, and `direct`'s one.
    let measured = buffered.calls() - 1;
    assert_eq!(buffered.calls() + direct.calls(), writes);
    let buffered_observations = stats.observations - 1;
    assert!(
        buffered_observations >= measured / 8 && buffered_observations <= measured.div_ceil(8) + 2,
        "{stats:?}"
    );
    assert!(stats.observations > before_drop.observations, "{stats:?}");
}

#[test]
fn a_page_cache_path_with_occasional_slow_writes_is_judged_over_a_run() {
    // `buffered` writes 64 KiB in 16 µs, but one write in 8 waits for memory (250 µs), and
    // its first measured write is one of those: 45 µs a write on average, against 130 µs
    // for `direct`. Judged on that write alone, it would have been dropped, and written
    // nothing until a look at it, hundreds of writes later.
    let (engine, buffered, direct) = buffered_and_direct(16_000, 130_000);
    let file = create(&engine, "spiky.bin");
    let data = vec![1u8; 64 << 10];
    for i in 0..600u64 {
        let ns = if buffered.calls() % 8 == 1 {
            250_000
        } else {
            16_000
        };
        buffered.set_costs(Costs::uniform(Cost::new(ns, 0.0)));
        file.write_at(i * (64 << 10), &data).unwrap();
    }
    drop(file);
    let report = engine.report();
    assert_eq!(
        report.dictionary.contexts[0].choice.as_deref(),
        Some("buffered"),
        "{report}"
    );
    // Its first write through a new handle, one sample, and a second look (a candidate
    // dropped on one sample within 3 times the choice gets one).
    assert_eq!(direct.calls(), 3, "{report}");
}

/// A checkpoint of `count` tensors of `len` bytes, written through `engine` at `path`
/// (made on disk by a plain engine, then copied into the engine's in-memory store).
fn save_tensors(engine: &Engine, path: &Path, count: usize, len: usize) {
    use fastensor::checkpoint::{self, TensorView};
    let data = vec![7u8; len];
    let descs: Vec<fastensor::TensorDesc> = (0..count)
        .map(|i| fastensor::TensorDesc::new(format!("t{i}"), fastensor::DType::U8, [len as u64]))
        .collect();
    let views: Vec<TensorView<'_>> = descs
        .iter()
        .map(|d| TensorView::new(d.clone(), &data))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("c.safetensors");
    checkpoint::save(&Engine::new().unwrap(), &disk, &views).unwrap();
    let bytes = std::fs::read(&disk).unwrap();
    let file = engine.open(path, OpenMode::Create).unwrap();
    file.write_at(0, &bytes[..]).unwrap();
}

/// Loads every tensor of a checkpoint of `count` × `len` bytes into existing buffers.
fn load_into_buffers(engine: &Engine, path: &Path, count: usize, len: usize) {
    let mut bufs = vec![vec![0u8; len]; count];
    let names: Vec<String> = (0..count).map(|i| format!("t{i}")).collect();
    let targets: Vec<(&str, fastensor::MemMut<'_>)> = names
        .iter()
        .zip(bufs.iter_mut())
        .map(|(n, b)| (n.as_str(), fastensor::MemMut::Host(&mut b[..])))
        .collect();
    fastensor::checkpoint::load_into(engine, path, targets).unwrap();
    assert!(bufs.iter().all(|b| b.iter().all(|&x| x == 7)));
}

#[test]
fn a_checkpoint_load_is_one_job_that_explores_only_when_small() {
    let s = setup(SelectorConfig::default());
    let small = Path::new("/virtual/small.safetensors");
    let large = Path::new("/virtual/large.safetensors");
    // Reads of 4 MiB either way: 4 of them (16 MiB, small enough to explore with) or 20
    // (80 MiB, never an exploration's measurement).
    save_tensors(&s.engine, small, 4, 4 << 20);
    save_tensors(&s.engine, large, 20, 4 << 20);
    let explorations = |e: &Engine| e.selector_stats().explorations;

    // The header is a read of its own (these in-memory files have no plain descriptor to
    // read it through): at most one more choice, of at most 64 KiB.
    let header = 64 << 10;
    let moved = |s: &Setup| (s.a.bytes(), s.b.bytes());
    let (before, (a0, b0)) = (explorations(&s.engine), moved(&s));
    load_into_buffers(&s.engine, large, 20, 4 << 20);
    assert!(
        explorations(&s.engine) <= before + 1,
        "a large job explored"
    );
    let (a1, b1) = moved(&s);
    let (da, db) = (a1 - a0, b1 - b0);
    assert!(
        da.min(db) <= header && da.max(db) >= 80 << 20,
        "{da} / {db}"
    );
    assert_eq!(s.engine.read_jobs(), 1);

    for _ in 0..40 {
        load_into_buffers(&s.engine, small, 4, 4 << 20);
    }
    assert!(
        explorations(&s.engine) > before + 1,
        "small jobs never explored"
    );
    assert_eq!(s.engine.read_jobs(), 41);

    // Now the context is known: the large job goes through its best path, `b`, whole.
    let (a0, b0) = moved(&s);
    load_into_buffers(&s.engine, large, 20, 4 << 20);
    let (a1, b1) = moved(&s);
    assert!(
        b1 - b0 >= 80 << 20 && a1 - a0 <= header,
        "{} / {}",
        a1 - a0,
        b1 - b0
    );
    assert_eq!(best_of(4 << 20), "b");
}
