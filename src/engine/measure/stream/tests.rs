//! Tests of read streams and their runs.
use super::*;

/// The readahead window of the streams tested here (a virtual disk's 8 MiB).
const WINDOW: u64 = 8 << 20;

fn read(bytes: u64, cache: CacheState) -> Measured {
    Measured {
        ctx: crate::engine::test_read(bytes, cache),
        bytes,
        wall: Duration::from_micros(10),
        cpu: Some(Duration::from_micros(1)),
    }
}

/// `s.begin` for a read of `len` at `off` in a stream that never reads through the page
/// cache: the bytes read before or not (`reread`), found in `state` by a probe counted in
/// `probes`.
fn begin_direct(
    s: &mut ReadStream,
    (off, len): (u64, usize),
    reread: bool,
    state: CacheState,
    probes: &std::cell::Cell<u32>,
) -> (CacheState, Option<usize>) {
    s.begin(
        off,
        len,
        || reread,
        || {
            probes.set(probes.get() + 1);
            state
        },
        || panic!("no stream here reads through the page cache"),
        |_| panic!("no stream here reads through the page cache"),
    )
}

#[test]
fn a_stream_carries_its_first_probe_and_a_cached_one_reprobes() {
    let mut s = ReadStream::new(WINDOW);
    let probes = std::cell::Cell::new(0);
    let begin = |s: &mut ReadStream, off: u64, len: usize, state: CacheState| {
        begin_direct(s, (off, len), true, state, &probes)
    };
    assert_eq!(
        begin(&mut s, 0, 4096, CacheState::Cold),
        (CacheState::Cold, None)
    );
    s.finish(false, 0..4096, 1, false, false, None);
    // Continues: no probe, cold carried, previous path known.
    let got = begin(&mut s, 4096, 4096, CacheState::Cached);
    assert_eq!(got, (CacheState::Cold, Some(1)));
    s.finish(true, 4096..8192, 1, false, false, None);
    // A jump starts a new stream: probed.
    let got = begin(&mut s, 1 << 30, 1 << 16, CacheState::Cached);
    assert_eq!(got, (CacheState::Cached, None));
    s.finish(
        false,
        (1 << 30)..(1 << 30) + (1 << 16),
        2,
        false,
        false,
        None,
    );
    // A cached stream re-probes reads of 64 KiB and more.
    let got = begin(&mut s, (1 << 30) + (1 << 16), 1 << 16, CacheState::Cold);
    assert_eq!(got, (CacheState::Cold, Some(2)));
    assert_eq!(probes.get(), 3);
}

#[test]
fn a_cold_stream_through_a_direct_path_reprobes_bytes_read_before() {
    const MIB: u64 = 1 << 20;
    let probes = std::cell::Cell::new(0);
    let begin = |s: &mut ReadStream, off: u64, reread: bool, state: CacheState| {
        begin_direct(s, (off, MIB as usize), reread, state, &probes)
    };
    // A second pass through a direct path: its first MiB cold, the next cached (an
    // earlier pass read it through the page cache), then cold again.
    let mut s = ReadStream::new(WINDOW);
    assert_eq!(
        begin(&mut s, 0, true, CacheState::Cold),
        (CacheState::Cold, None)
    );
    s.finish(false, 0..MIB, 0, false, false, None);
    let got = begin(&mut s, MIB, true, CacheState::Cached);
    assert_eq!(got, (CacheState::Cached, Some(0)));
    s.finish(true, MIB..2 * MIB, 0, false, false, None);
    let got = begin(&mut s, 2 * MIB, true, CacheState::Cold);
    assert_eq!(got, (CacheState::Cold, Some(0)));
    assert_eq!(probes.get(), 3);
    // First reads are not probed again: nothing cached them but this stream.
    let mut s = ReadStream::new(WINDOW);
    begin(&mut s, 0, false, CacheState::Cold);
    s.finish(false, 0..MIB, 0, false, false, None);
    let got = begin(&mut s, MIB, false, CacheState::Cached);
    assert_eq!(got, (CacheState::Cold, Some(0)));
    assert_eq!(probes.get(), 4);
    // A cold stream through the page cache, over bytes read before, is probed too, but
    // bytes found cached count only where they were read through the page cache before
    // (`through`), or else where bytes beyond its readahead's reach are cached as well
    // (`beyond`): its own readahead caches what follows it.
    let asked = std::cell::Cell::new(0);
    let begin_ahead = |s: &mut ReadStream, off: u64, state, through: bool, beyond: Option<bool>| {
        s.begin(
            off,
            MIB as usize,
            || true,
            || {
                probes.set(probes.get() + 1);
                state
            },
            || through,
            |_| {
                asked.set(asked.get() + 1);
                beyond
            },
        )
    };
    use CacheState::{Cached, Cold};
    for (through, beyond, then) in [
        (false, Some(false), Cold),
        (false, None, Cold),
        (false, Some(true), Cached),
        (true, Some(false), Cached),
    ] {
        let mut s = ReadStream::new(WINDOW);
        assert_eq!(begin_ahead(&mut s, 0, Cold, false, None), (Cold, None));
        s.finish(false, 0..MIB, 0, true, false, None);
        let got = begin_ahead(&mut s, MIB, Cached, through, beyond);
        assert_eq!(got, (then, Some(0)), "{through} {beyond:?}");
    }
    assert_eq!(probes.get(), 4 + 8);
    assert_eq!(asked.get(), 3);
}

#[test]
fn one_wait_does_not_decide_a_short_warm_up_run_through_the_page_cache() {
    let measured = |bytes: u64, micros: u64| Measured {
        ctx: crate::engine::test_read(bytes, CacheState::Cold),
        bytes,
        wall: Duration::from_micros(micros),
        cpu: None,
    };
    let run_of = |bytes: u64, walls: &[u64]| {
        let mut run = Run::start(measured(bytes, walls[0]), 0, Some(WINDOW));
        for &w in &walls[1..] {
            run.add(&measured(bytes, w));
        }
        run
    };
    // 8 reads of 64 KiB, one of which waited 5 ms for the device: judged as the other
    // seven, 10 µs a read, through a path that keeps the page cache.
    let waited = run_of(64 << 10, &[10, 10, 5000, 10, 10, 10, 10, 10]);
    assert_eq!(waited.far_test_wall(true), Some(Duration::from_micros(80)));
    assert_eq!(
        waited.far_test_wall(false),
        Some(Duration::from_micros(5070))
    );
    // Slow on every read: judged as slow.
    let slow = run_of(64 << 10, &[600; 8]);
    assert_eq!(slow.far_test_wall(true), Some(Duration::from_micros(4800)));
    // A single small read tells nothing; reads of 1 MiB are judged as they are.
    assert_eq!(run_of(64 << 10, &[5000]).far_test_wall(true), None);
    let large = run_of(1 << 20, &[5000, 300]);
    assert_eq!(large.far_test_wall(true), Some(Duration::from_micros(5300)));
}

#[test]
fn a_cold_first_pass_asks_whether_it_reads_again_once_a_mib() {
    const K64: u64 = 64 << 10;
    let asked = std::cell::Cell::new(0);
    let mut s = ReadStream::new(WINDOW);
    for i in 0..64u64 {
        let off = i * K64;
        let ask = || {
            asked.set(asked.get() + 1);
            false
        };
        let (cache, _) = s.begin(
            off,
            K64 as usize,
            ask,
            || CacheState::Cold,
            || false,
            |_| None,
        );
        assert_eq!(cache, CacheState::Cold);
        s.finish(i > 0, off..off + K64, 0, false, false, None);
    }
    // 4 MiB of first reads through a direct path: asked at 1, 2 and 3 MiB.
    assert_eq!(asked.get(), 3);
}

#[test]
fn a_cached_stream_through_the_page_cache_asks_what_is_cached_beyond_its_readahead() {
    const MIB: u64 = 1 << 20;
    // A stream of 8 MiB reads that starts cached and goes on through a path that keeps
    // the page cache, over bytes cached some other way than by reading them through the
    // page cache (written, say). `cached_to`: where those cached bytes end; the probe
    // finds every read cached (the stream's readahead is ahead of it).
    let run = |cached_to: u64, reads: u64| {
        let asked = std::cell::RefCell::new(Vec::new());
        let mut s = ReadStream::new(WINDOW);
        let mut states = Vec::new();
        for i in 0..reads {
            let off = i * 8 * MIB;
            let (cache, _) = s.begin(
                off,
                (8 * MIB) as usize,
                || true,
                || CacheState::Cached,
                || false,
                |range| {
                    asked.borrow_mut().push(range.start / MIB);
                    (range.end <= 1 << 30).then_some(range.end <= cached_to)
                },
            );
            states.push(cache);
            s.finish(i > 0, off..off + 8 * MIB, 0, true, false, None);
        }
        (states, asked.into_inner())
    };
    // Cached up to 64 MiB. The first read starts the stream (nothing asked); the read
    // at 8 MiB asks about 32-33 MiB (16 MiB past its end), cached, which vouches for
    // the reads ending by 33 MiB; the read at 32 MiB asks about 56-57, and the read at
    // 56 MiB about 80-81, not cached: it turns the stream cold (its bytes were cached,
    // but so close to where the cached bytes end that its readahead cannot be told
    // apart). The reads after it, still found cached (their own readahead's), ask
    // again, and stay cold.
    let (states, asked) = run(64 * MIB, 10);
    use CacheState::{Cached, Cold};
    assert_eq!(
        states,
        vec![Cached, Cached, Cached, Cached, Cached, Cached, Cached, Cold, Cold, Cold]
    );
    assert_eq!(asked, vec![32, 56, 80, 88, 96]);
    // Near the end of the file nothing can be told: the stream stays as it was (cached).
    let (states, _) = run(2 << 30, 128);
    assert!(states.iter().all(|&c| c == Cached));
}

/// Path 0 owns a cold stream; path 1 takes it over while exploring for `reads` reads of
/// 64 KiB; then path 0 takes it back, exploiting. Returns the reads of path 1 kept in
/// the runs that ended, those runs' lengths, and the lengths of its warm-up runs.
fn take_over(keeps_cache: bool, reads: u32) -> (u32, Vec<u32>, Vec<u32>) {
    let mut s = ReadStream::new(WINDOW);
    let mut runs = Vec::new();
    let mut end = 0u64;
    let cold = || Some(read(1 << 16, CacheState::Cold));
    s.finish(false, 0..1 << 16, 0, keeps_cache, false, cold());
    end += 1 << 16;
    for _ in 0..reads {
        let out = s.finish(true, end..end + (1 << 16), 1, keeps_cache, true, cold());
        end += 1 << 16;
        runs.extend(out.into_iter().flatten().filter(|r| r.path == 1));
    }
    // Exploiting, the path that takes the stream back warms up first too: its read is
    // not measured.
    let out = s.finish(true, end..end + (1 << 16), 0, keeps_cache, false, cold());
    assert!(out.iter().flatten().all(|r| r.path == 1));
    runs.extend(out.into_iter().flatten());
    let [run, held] = s.take_runs();
    assert!(run.is_none() && held.is_none());
    let lens = |warm_up: bool| -> Vec<u32> {
        runs.iter()
            .filter(|r| r.warm_up == warm_up)
            .map(|r| r.transfers)
            .collect()
    };
    (lens(false).iter().sum(), lens(false), lens(true))
}

#[test]
fn an_exploring_path_is_measured_once_it_has_warmed_up_in_the_stream() {
    // Through the page cache: the first 32 reads of 64 KiB (2 MiB, less than 8 MiB) are
    // the warm-up (offered in runs of 8 reads), the next 16 are kept in one run (a
    // readahead window is 8 MiB).
    assert_eq!(take_over(true, 48), (16, vec![16], vec![8, 8, 8, 8]));
    // 8 MiB past the warm-up, a run through the page cache ends.
    assert_eq!(
        take_over(true, 32 + 160),
        (160, vec![160], vec![8, 8, 8, 8])
    );
    // A direct path warms up in two reads and is measured in runs of 8.
    assert_eq!(take_over(false, 20), (18, vec![8, 8, 2], vec![2]));
    // A warm-up cut short by a switch ends there.
    assert_eq!(take_over(true, 10), (0, vec![], vec![8, 2]));
}

#[test]
fn a_chosen_path_is_measured_once_it_has_warmed_up_in_a_stream_it_took_over() {
    // Path 0 (direct) starts a cold stream of 1 MiB reads, measured at once; path 1
    // (through the page cache), chosen, takes it over for 12 reads.
    let mut s = ReadStream::new(WINDOW);
    let mut recorded = Vec::new();
    for i in 0..16u64 {
        let (path, keeps_cache) = if i < 4 { (0, false) } else { (1, true) };
        let range = (i << 20)..((i + 1) << 20);
        let m = read(1 << 20, CacheState::Cold);
        let out = s.finish(i > 0, range, path, keeps_cache, false, Some(m));
        recorded.extend(out.into_iter().flatten());
    }
    recorded.extend(s.take_runs().into_iter().flatten());
    let runs: Vec<(usize, u32, bool)> = recorded
        .iter()
        .map(|r| (r.path, r.transfers, r.warm_up))
        .collect();
    // Path 0's 4 reads in one run; path 1's first 8 MiB offered as warm-up runs of 4
    // MiB (far behind the leader, they rule it out), its last 4 reads measured.
    assert_eq!(
        runs,
        vec![(0, 4, false), (1, 4, true), (1, 4, true), (1, 4, false)]
    );
}

#[test]
fn readahead_windows_are_recorded_in_pairs() {
    // A cold stream of 1 MiB reads: through the page cache, windows of 8 reads wait for
    // the device (2 ms a read) and the next ones find it read ahead (0.2 ms), in turn.
    let record = |keeps_cache: bool, reads: u64| {
        let mut s = ReadStream::new(WINDOW);
        let mut recorded = Vec::new();
        for i in 0..=reads {
            // The last read goes through another path: the stream's run ends.
            let path = usize::from(i == reads);
            let slow = (i / 8) % 2 == 0;
            let m = Measured {
                wall: Duration::from_micros(if slow { 2000 } else { 200 }),
                ..read(1 << 20, CacheState::Cold)
            };
            let range = (i << 20)..((i + 1) << 20);
            let out = s.finish(i > 0, range, path, keeps_cache, false, Some(m));
            recorded.extend(out.into_iter().flatten().filter(|r| r.path == 0));
        }
        recorded.extend(s.take_runs().into_iter().flatten().filter(|r| r.path == 0));
        recorded
            .iter()
            .map(|r| (r.bytes >> 20, r.wall.as_micros()))
            .collect::<Vec<_>>()
    };
    // Each window with the one before (the first one only so): every pair costs the
    // stream's mean, 1.1 ms a read.
    assert_eq!(record(true, 40), vec![(16, 17600); 4]);
    // A first window held back, and the last full window, are recorded with the run
    // that ends the pairing; a held window alone when the stream has no other run of
    // its path.
    assert_eq!(record(true, 12), vec![(12, 16800)]);
    assert_eq!(record(true, 20), vec![(16, 17600), (12, 9600)]);
    assert_eq!(record(true, 8), vec![(8, 16000)]);
    let mut s = ReadStream::new(WINDOW);
    for i in 0..8u64 {
        let out = s.finish(
            i > 0,
            (i << 20)..((i + 1) << 20),
            0,
            true,
            false,
            Some(read(1 << 20, CacheState::Cold)),
        );
        assert!(out.iter().all(Option::is_none));
    }
    s.begin(
        1 << 30,
        1 << 20,
        || false,
        || CacheState::Cold,
        || false,
        |_| None,
    );
    let out = s.finish(
        false,
        (1 << 30)..(1 << 30) + (1 << 20),
        0,
        true,
        false,
        None,
    );
    let lone: Vec<u64> = out.iter().flatten().map(|r| r.bytes >> 20).collect();
    assert_eq!(
        lone,
        vec![8],
        "a new stream records the last one's held window"
    );
    // Direct runs (4 MiB, nothing read ahead) are recorded as they are.
    assert_eq!(record(false, 40).len(), 10);
    assert!(record(false, 40).iter().all(|&(mib, _)| mib == 4));
}

#[test]
fn a_direct_read_taking_over_from_a_path_through_the_page_cache_is_not_measured() {
    let mut s = ReadStream::new(WINDOW);
    let mut recorded = Vec::new();
    let mut end = 0;
    // A stream of mixed sizes: 4 KiB reads through path 0 (through the page cache), a
    // 1 MiB read through path 1 (direct) after them, then another one.
    for (i, (len, path, keeps_cache)) in [
        (4096u64, 0, true),
        (4096, 0, true),
        (1 << 20, 1, false),
        (1 << 20, 1, false),
        (1 << 20, 1, false),
    ]
    .into_iter()
    .enumerate()
    {
        let out = s.finish(
            i > 0,
            end..end + len,
            path,
            keeps_cache,
            false,
            Some(read(len, CacheState::Cold)),
        );
        end += len;
        recorded.extend(out.into_iter().flatten());
    }
    recorded.extend(s.take_runs().into_iter().flatten());
    let direct: Vec<u32> = recorded
        .iter()
        .filter(|r| r.path == 1)
        .map(|r| r.transfers)
        .collect();
    // The first 1 MiB read waited for path 0's readahead, and path 1 warms up in two
    // reads: only the third is measured (the first two, far behind, could rule it out).
    assert_eq!(direct, [2, 1]);
    assert_eq!(
        recorded
            .iter()
            .filter(|r| r.path == 1)
            .map(|r| r.warm_up)
            .collect::<Vec<_>>(),
        [true, false]
    );
}

#[test]
fn only_reads_from_the_device_through_the_page_cache_run_long() {
    let lens = |keeps_cache: bool, cache: CacheState| {
        let mut s = ReadStream::new(WINDOW);
        let mut lens = Vec::new();
        for i in 0..300u64 {
            let range = i * 4096..(i + 1) * 4096;
            let out = s.finish(i > 0, range, 0, keeps_cache, false, Some(read(4096, cache)));
            lens.extend(out.into_iter().flatten().map(|r| r.transfers));
        }
        lens.len()
    };
    // 300 reads of 4 KiB: one run in progress through the page cache from the device,
    // runs of 8 otherwise.
    assert_eq!(lens(true, CacheState::Cold), 0);
    assert_eq!(lens(true, CacheState::Cached), 37);
    assert_eq!(lens(false, CacheState::Cold), 37);
}

#[test]
fn runs_gather_reads_of_one_path_and_context() {
    let mut s = ReadStream::new(WINDOW);
    let mut recorded = Vec::new();
    let mut end = 0;
    // 20 reads of 4 KiB through path 0, continuing: runs of 8.
    for i in 0..20 {
        let out = s.finish(
            i > 0,
            end..end + 4096,
            0,
            false,
            false,
            Some(read(4096, CacheState::Cold)),
        );
        end += 4096;
        recorded.extend(out.into_iter().flatten());
    }
    assert_eq!(
        recorded.iter().map(|r| r.transfers).collect::<Vec<_>>(),
        [8, 8]
    );
    assert_eq!(recorded[0].bytes, 8 * 4096);
    assert_eq!(recorded[0].wall, Duration::from_micros(80));
    // A switch of path ends the run of 4; the new path warms up in two reads, then
    // starts its own run.
    for i in 0..3 {
        let out = s.finish(
            true,
            end..end + 4096,
            1,
            false,
            false,
            Some(read(4096, CacheState::Cold)),
        );
        end += 4096;
        let ended: Vec<(u32, usize, bool)> = out
            .iter()
            .flatten()
            .map(|r| (r.transfers, r.path, r.warm_up))
            .collect();
        let expected: &[(u32, usize, bool)] = match i {
            0 => &[(4, 0, false)],
            1 => &[],
            _ => &[(2, 1, true)],
        };
        assert_eq!(ended, expected);
    }
    // Another size class ends a run too; a big read is a run of its own at once.
    let out = s.finish(
        true,
        end..end + (8 << 20),
        1,
        false,
        false,
        Some(read(8 << 20, CacheState::Cold)),
    );
    assert_eq!(out[0].as_ref().map(|r| r.transfers), Some(1));
    assert_eq!(out[1].as_ref().map(|r| r.bytes), Some(8 << 20));
    // The CPU time of the reads that read it stands for the whole run (scaled to its
    // bytes); with none read, the run's is unknown.
    let unread = || {
        let mut m = read(4096, CacheState::Cold);
        m.cpu = None;
        m
    };
    s.finish(false, 0..4096, 0, false, false, Some(unread()));
    s.finish(
        true,
        4096..8192,
        0,
        false,
        false,
        Some(read(4096, CacheState::Cold)),
    );
    let run = s.take_runs()[0].clone().unwrap();
    assert_eq!(run.transfers, 2);
    assert_eq!(run.cpu(), Some(Duration::from_micros(2)));
    s.finish(false, 0..4096, 0, false, false, Some(unread()));
    s.finish(true, 4096..8192, 0, false, false, Some(unread()));
    assert_eq!(s.take_runs()[0].as_ref().unwrap().cpu(), None);
    // An unmeasured read ends the run in progress.
    s.finish(
        false,
        0..4096,
        0,
        false,
        false,
        Some(read(4096, CacheState::Cold)),
    );
    let out = s.finish(true, 4096..8192, 0, false, false, None);
    assert_eq!(out[0].as_ref().map(|r| r.transfers), Some(1));
    assert!(s.take_runs().iter().all(Option::is_none));
}
