//! Offload store: bit-exact round trips under a tight budget (checked through the store's
//! instrumentation), scheduling and prefetch, error propagation from a failing backend, and
//! removal of the swap file after drop and after a panic.

mod support;

use fastensor::offload::{Handle, OffloadConfig, OffloadStore};
use fastensor::{Engine, ErrorKind, HostBuffer, Registry};
use fastensor_testkit::faulty::{Fault, Faulty, Op, When};
use fastensor_testkit::stub::StubBackend;
use fastensor_testkit::MemoryBackend;
use std::path::Path;
use std::sync::Arc;
use support::gate::{Gate, Gated};

/// Deterministic content for tensor `seed` of `len` bytes.
fn tensor(seed: u64, len: usize) -> HostBuffer {
    let mut b = HostBuffer::new(len).unwrap();
    fastensor_testkit::data::fill(&mut b, seed);
    b
}

/// A store's settings in `dir`: a 1 MiB budget, and every tensor goes to the swap file.
fn swapping(dir: &Path) -> OffloadConfig {
    OffloadConfig::new(dir, 1 << 20).small_threshold(0)
}

/// A store over the memory engine in a new directory (alive as long as the store), with a
/// budget of `room` tensors of 8 KiB, prefetching `prefetch_depth` tensors, and the handles
/// of `n` tensors `l0`, `l1`, ... put in it by [`put_written`]: the last `room` of them are
/// still in memory.
fn written_store(
    room: u64,
    prefetch_depth: usize,
    n: u64,
) -> (tempfile::TempDir, OffloadStore, Vec<Handle>) {
    let dir = tempfile::tempdir().unwrap();
    let config = OffloadConfig::new(dir.path(), room * 8192)
        .small_threshold(0)
        .prefetch_depth(prefetch_depth);
    let store = OffloadStore::new(&memory_engine(), config).unwrap();
    let hs = put_written(&store, n, "l");
    (dir, store, hs)
}

/// Puts `n` tensors of 8 KiB, `{prefix}{i}` holding `tensor(i, 8192)`, and waits until they
/// are written.
fn put_written(store: &OffloadStore, n: u64, prefix: &str) -> Vec<Handle> {
    let hs = (0..n)
        .map(|i| store.put(tensor(i, 8192), format!("{prefix}{i}")).unwrap())
        .collect();
    store.flush();
    hs
}

fn memory_engine() -> Engine {
    Engine::builder()
        .registry(Registry::new())
        .backend(Arc::new(MemoryBackend::new()))
        .build()
        .unwrap()
}

fn faulty_engine(fault: Fault) -> (Engine, Faulty) {
    let faulty = Faulty::new("faulty", Arc::new(MemoryBackend::new())).with_fault(fault);
    let engine = Engine::builder()
        .registry(Registry::new())
        .backend(Arc::new(faulty.clone()))
        .pin("faulty")
        .build()
        .unwrap();
    (engine, faulty)
}

/// Sizes from tiny (kept in memory) to several pages, not multiples of 4096.
fn size_of(i: u64) -> usize {
    match i % 7 {
        0 => 100 + (i % 50) as usize,
        _ => 4096 + ((i * 7919) % 40_000) as usize,
    }
}

#[test]
fn thousands_round_trip_bit_exact_under_tight_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 256 << 10;
    let config = OffloadConfig::new(dir.path(), budget).small_threshold(1024);
    let store = OffloadStore::new(&memory_engine(), config).unwrap();
    let mut capacity_after_first = 0;
    for iter in 0..3u64 {
        let n = 2000u64;
        let mut handles = Vec::new();
        for i in 0..n {
            let seed = iter * 1_000_000 + i;
            handles.push(
                store
                    .put(tensor(seed, size_of(i)), format!("t{seed}"))
                    .unwrap(),
            );
        }
        for i in (0..n).rev() {
            let h = handles.pop().unwrap();
            let seed = iter * 1_000_000 + i;
            let got = store.get(&h).unwrap();
            assert!(
                got[..] == tensor(seed, size_of(i))[..],
                "tensor {seed} differs"
            );
        }
        store.flush();
        let s = store.stats();
        assert!(
            s.peak_held_bytes <= budget,
            "peak {} > budget {budget}",
            s.peak_held_bytes
        );
        assert!(s.peak_held_bytes > budget / 2, "the budget was used: {s:?}");
        assert_eq!((s.held_bytes, s.file_allocated, s.small_bytes), (0, 0, 0));
        if iter == 0 {
            capacity_after_first = s.file_capacity;
        } else {
            assert_eq!(s.file_capacity, capacity_after_first, "space is reused");
        }
    }
    let s = store.stats();
    assert_eq!(s.gets, 6000);
    assert!(
        s.gets_from_memory > 1000,
        "prefetch served most gets: {s:?}"
    );
    assert!(
        s.put_wait > std::time::Duration::ZERO,
        "backpressure happened"
    );
}

#[test]
fn real_disk_round_trip_leaves_no_name_for_the_swap_file() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 1 << 20;
    let engine = Engine::new().unwrap();
    let store = OffloadStore::new(
        &engine,
        OffloadConfig::new(dir.path(), budget).small_threshold(64 << 10),
    )
    .unwrap();
    let mut handles = Vec::new();
    for i in 0..400u64 {
        let len = 65536 + ((i * 4099) % 200_000) as usize;
        handles.push((i, len, store.put(tensor(i, len), format!("a{i}")).unwrap()));
    }
    while let Some((i, len, h)) = handles.pop() {
        assert!(
            store.get(&h).unwrap()[..] == tensor(i, len)[..],
            "tensor {i}"
        );
    }
    let s = store.stats();
    assert!(s.peak_held_bytes <= budget, "{s:?}");
    assert!(s.bytes_written > 40 << 20);
    // The swap file has no name: no kill can leave it behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    drop(store);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // Nothing went through the page cache, where it would hold the memory offload frees.
    for u in engine.report().usage {
        assert!(
            !["posix", "mmap"].contains(&u.name.as_str()),
            "{} moved {} bytes",
            u.name,
            u.bytes
        );
    }
}

#[test]
fn swap_file_removed_after_panic() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let result = std::panic::catch_unwind(move || {
        let store = OffloadStore::new(
            &Engine::new().unwrap(),
            OffloadConfig::new(&d, 1 << 20).small_threshold(64 << 10),
        )
        .unwrap();
        let _h = store.put(tensor(1, 100_000), "x").unwrap();
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        panic!("training step failed");
    });
    assert!(result.is_err());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn written_tensors_stay_in_memory_while_the_budget_has_room_the_oldest_leave_first() {
    let (_dir, store, hs) = written_store(4, 4, 10);
    let s = store.stats();
    // The last four put are kept; the six before made room for them, oldest first.
    assert_eq!((s.held_bytes, s.evictions), (4 * 8192, 6), "{s:?}");
    for i in (6..10).rev() {
        assert!(store.get(&hs[i]).unwrap()[..] == tensor(i as u64, 8192)[..]);
    }
    let s = store.stats();
    assert_eq!((s.gets_from_memory, s.gets_from_disk), (4, 0), "{s:?}");
    assert!(s.peak_held_bytes <= 4 * 8192);
}

#[test]
fn backward_order_prefetches_next_tensors() {
    let (_dir, store, hs) = written_store(4, 4, 10);
    assert!(store.get(&hs[9]).unwrap()[..] == tensor(9, 8192)[..]);
    store.flush();
    // Expected next: 8, 7, 6 (kept) and 5, read back into the room the 9th left.
    let s = store.stats();
    assert_eq!(
        (s.gets_from_disk, s.prefetches, s.held_bytes),
        (0, 1, 4 * 8192),
        "{s:?}"
    );
    for i in (0..9).rev() {
        store.flush();
        assert!(store.get(&hs[i]).unwrap()[..] == tensor(i as u64, 8192)[..]);
    }
    let s = store.stats();
    assert_eq!((s.gets_from_memory, s.gets_from_disk), (10, 0), "{s:?}");
    assert_eq!(
        s.prefetches, 6,
        "only the tensors not kept were read: {s:?}"
    );
}

#[test]
fn hint_order_and_explicit_prefetch() {
    let (_dir, store, hs) = written_store(4, 4, 10);
    store.prefetch(&[&hs[3]]);
    store.flush();
    assert!(store.get(&hs[3]).unwrap()[..] == tensor(3, 8192)[..]);
    assert_eq!(store.stats().gets_from_memory, 1);
    // Forward order instead of backward.
    let order: Vec<&_> = hs.iter().collect();
    store.hint_order(&order);
    store.flush();
    assert_eq!(store.stats().held_bytes, 4 * 8192, "first four of the hint");
    for (i, h) in hs.iter().enumerate() {
        assert!(store.get(h).unwrap()[..] == tensor(i as u64, 8192)[..]);
    }
    let s = store.stats();
    assert_eq!(s.gets, 11);
    assert!(s.gets_from_memory >= 5, "{s:?}");
}

#[test]
fn write_failure_surfaces_on_get_and_next_put() {
    let (engine, faulty) = faulty_engine(Fault::new(Op::Write, When::Nth(5), ErrorKind::Io));
    let dir = tempfile::tempdir().unwrap();
    let config = swapping(dir.path()).io_threads(1);
    let store = OffloadStore::new(&engine, config).unwrap();
    // The failed write of act-4 surfaces on the first put after it completes: one of the
    // later puts below, or the one after the flush. A put that reports it stores nothing.
    let mut reported = None;
    let mut hs = Vec::new();
    for i in 0..10u64 {
        match store.put(tensor(i, 8192), format!("act-{i}")) {
            Ok(h) => hs.push(h),
            Err(e) => {
                assert!(i > 4 && reported.is_none(), "put {i}: {e}");
                // Its own tensor is not lost silently.
                let own = format!("tensor `act-{i}` was not stored");
                assert!(e.to_string().contains(&own), "{e}");
                reported = Some(e);
                hs.push(store.put(tensor(i, 8192), format!("act-{i}")).unwrap());
            }
        }
    }
    store.flush();
    assert_eq!(faulty.injected(), 1);
    let err = match reported {
        Some(e) => e,
        None => store.put(tensor(99, 8192), "next").unwrap_err(),
    };
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(err.to_string().contains("`act-4`"), "{err}");
    assert!(err.to_string().contains("was not stored"), "{err}");
    store.put(tensor(99, 8192), "after").unwrap();
    for (i, h) in hs.iter().enumerate().rev() {
        match store.get(h) {
            Ok(b) => {
                assert_ne!(i, 4);
                assert!(b[..] == tensor(i as u64, 8192)[..]);
            }
            Err(e) => {
                assert_eq!(i, 4, "only act-4 failed: {e}");
                assert_eq!(e.kind(), ErrorKind::Io);
                assert!(e.to_string().contains("`act-4`"), "{e}");
                assert_eq!(e.backend(), Some("faulty"));
            }
        }
    }
    assert_eq!(store.stats().errors, 1);
}

#[test]
fn read_failure_surfaces_on_get() {
    let (engine, faulty) = faulty_engine(Fault::new(Op::Read, When::From(1), ErrorKind::Io));
    let dir = tempfile::tempdir().unwrap();
    // Room for one tensor: the last one put stays in memory, the others are read back.
    let config = OffloadConfig::new(dir.path(), 8192).small_threshold(0);
    let store = OffloadStore::new(&engine, config).unwrap();
    let hs = put_written(&store, 6, "feat-");
    assert!(store.get(&hs[5]).unwrap()[..] == tensor(5, 8192)[..]);
    for (i, h) in hs.iter().enumerate().take(5).rev() {
        let e = store.get(h).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e.to_string().contains(&format!("`feat-{i}`")), "{e}");
    }
    assert!(faulty.injected() >= 1);
}

#[test]
fn a_tensor_larger_than_the_budget_is_written_through_never_held() {
    let dir = tempfile::tempdir().unwrap();
    let store = OffloadStore::new(
        &memory_engine(),
        OffloadConfig::new(dir.path(), 1 << 16).small_threshold(64 << 10),
    )
    .unwrap();
    let small = store.put(tensor(1, 1 << 15), "small").unwrap();
    let huge = store.put(tensor(0, (1 << 17) + 5), "huge").unwrap();
    // Written before `put` returned, and never counted in the budget.
    let s = store.stats();
    assert_eq!(s.written_through, 1);
    assert!(s.bytes_written >= (1 << 17) + 5, "{s:?}");
    assert!(s.peak_held_bytes <= 1 << 16, "{s:?}");
    assert!(store.get(&huge).unwrap()[..] == tensor(0, (1 << 17) + 5)[..]);
    assert!(store.get(&small).unwrap()[..] == tensor(1, 1 << 15)[..]);
    assert!(store.stats().peak_held_bytes <= 1 << 16);
}

#[test]
fn a_tensor_written_through_that_fails_is_not_stored_and_says_so() {
    let (engine, _faulty) = faulty_engine(Fault::new(Op::Write, When::Nth(1), ErrorKind::Io));
    let dir = tempfile::tempdir().unwrap();
    let store = OffloadStore::new(
        &engine,
        OffloadConfig::new(dir.path(), 1 << 16).small_threshold(64 << 10),
    )
    .unwrap();
    let e = store.put(tensor(0, 1 << 17), "huge").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.to_string().contains("`huge`"), "{e}");
    assert_eq!(store.stats().file_allocated, 0, "its file space is freed");
}

/// Memory owned elsewhere, with a flag set when the store gives it back.
struct Lent {
    bytes: Vec<u8>,
    returned: Arc<std::sync::atomic::AtomicBool>,
}

impl fastensor::offload::ForeignBytes for Lent {
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.returned
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn foreign_memory_is_written_in_place_kept_while_there_is_room_and_given_back() {
    use fastensor::offload::Payload;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let store = OffloadStore::new(
        &memory_engine(),
        OffloadConfig::new(dir.path(), 1 << 20).small_threshold(64 << 10),
    )
    .unwrap();
    let lend = |seed: u64, len: usize| {
        let returned = Arc::new(AtomicBool::new(false));
        let bytes = tensor(seed, len)[..].to_vec();
        let lent = Lent {
            bytes: bytes.clone(),
            returned: returned.clone(),
        };
        (Payload::foreign(lent), bytes, returned)
    };
    // Written, and kept (the budget has room): a get takes a copy, and the owner has its
    // memory back.
    let (payload, bytes, returned) = lend(7, 300_000);
    let h = store.put(payload, "lent").unwrap();
    store.flush();
    assert!(!returned.load(Ordering::SeqCst));
    assert_eq!(store.stats().held_bytes, 300_000);
    assert_eq!(&store.get(&h).unwrap()[..], &bytes[..]);
    assert!(returned.load(Ordering::SeqCst));
    let s = store.stats();
    assert_eq!(
        (s.bytes_written, s.bytes_read, s.held_bytes),
        (300_000, 0, 0)
    );
    assert!(s.write_time > std::time::Duration::ZERO);
    // Given back when a later put needs the room; read back from disk then.
    let (first, first_bytes, first_returned) = lend(8, 600_000);
    let h1 = store.put(first, "first").unwrap();
    let (second, _, _) = lend(9, 600_000);
    let _h2 = store.put(second, "second").unwrap();
    store.flush();
    assert!(first_returned.load(Ordering::SeqCst));
    assert_eq!(&store.get(&h1).unwrap()[..], &first_bytes[..]);
    assert_eq!(store.stats().bytes_read, 600_000);
}

/// A backend that bypasses the page cache but opens no file (as `O_DIRECT` on a file system
/// without it).
fn no_direct() -> StubBackend {
    StubBackend::new("no-direct").capabilities(fastensor::Capabilities {
        bypasses_page_cache: true,
        ..Default::default()
    })
}

#[test]
fn a_store_keeps_page_cache_backends_where_no_direct_one_opens_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::builder()
        .registry(Registry::new())
        .backend(Arc::new(no_direct()))
        .backend(Arc::new(MemoryBackend::new()))
        .build()
        .unwrap();
    let store = OffloadStore::new(
        &engine,
        OffloadConfig::new(dir.path(), 4 << 20).small_threshold(64 << 10),
    )
    .unwrap();
    let len = 2 << 20; // above the small threshold: written to the swap file
    let h = store.put(tensor(7, len), "a").unwrap();
    store.flush();
    assert!(store.get(&h).unwrap()[..] == tensor(7, len)[..]);
    assert!(store.stats().bytes_written >= len as u64);
}

/// An engine whose only backend holds its first write at the gate returned: later writes
/// stay queued behind it until the gate is released.
fn gated_engine() -> (Engine, Gate) {
    let (gated, gate) = Gated::new("gated", Arc::new(MemoryBackend::new()));
    let engine = Engine::builder()
        .registry(Registry::new())
        .backend(Arc::new(gated))
        .pin("gated")
        .build()
        .unwrap();
    (engine, gate)
}

#[test]
fn a_discarded_tensor_is_not_written_if_its_write_had_not_started() {
    let dir = tempfile::tempdir().unwrap();
    // Every tensor written at once: the first write starts with its put.
    let config = swapping(dir.path()).io_threads(1).write_behind(0);
    let (engine, gate) = gated_engine();
    let store = OffloadStore::new(&engine, config).unwrap();
    let first = store.put(tensor(1, 8192), "first").unwrap();
    // The single I/O thread is in the first write, held at the gate; the second waits in the
    // queue.
    gate.wait_entered();
    let second = store.put(tensor(2, 8192), "second").unwrap();
    store.discard(&second);
    assert_eq!(
        store.stats().held_bytes,
        8192,
        "only the first is still held"
    );
    gate.release();
    store.flush();
    let s = store.stats();
    // The first, expected next, stays in memory once written.
    assert_eq!((s.bytes_written, s.held_bytes), (8192, 8192), "{s:?}");
    let err = store.get(&second).unwrap_err();
    assert!(err.to_string().contains("second"), "{err}");
    assert!(store.get(&first).unwrap()[..] == tensor(1, 8192)[..]);
    assert_eq!(store.stats().gets_from_memory, 1);
    drop(second);
    assert_eq!(store.stats().file_allocated, 8192);
}

#[test]
fn expect_backward_prefetches_the_last_tensors_before_any_get() {
    // Room for three: the last three put are kept; the last one is then freed unused,
    // which leaves room for one more.
    let (_dir, store, mut hs) = written_store(3, 3, 8);
    drop(hs.pop());
    assert_eq!(
        store.stats().prefetches,
        0,
        "nothing is read back while puts go on"
    );
    store.expect_backward();
    store.flush();
    // Expected first: 6, 5 and 4, in memory now: kept since their puts, or read back (a
    // put that found the budget full of writes in flight dropped a kept one to make room).
    let s = store.stats();
    assert_eq!(s.held_bytes, 3 * 8192, "{s:?}");
    assert!((1..=3).contains(&s.prefetches), "{s:?}");
    for i in (0..7).rev() {
        store.flush(); // the reads the last get started are done: no race with this one
        assert!(store.get(&hs[i]).unwrap()[..] == tensor(i as u64, 8192)[..]);
    }
    let s = store.stats();
    assert_eq!(s.gets_from_disk, 0, "every get was prefetched: {s:?}");
}

#[test]
fn handles_dropped_without_gets_start_no_reads() {
    // A graph freed without backward: its handles go, the last put first. The room each
    // kept tensor leaves must not start reads of tensors about to go too.
    let (_dir, store, mut hs) = written_store(2, 2, 8);
    store.expect_backward();
    store.flush();
    let before = store.stats().bytes_read;
    while let Some(h) = hs.pop() {
        drop(h);
        store.flush();
    }
    let s = store.stats();
    assert_eq!((s.bytes_read, s.held_bytes), (before, 0), "{s:?}");
}

#[test]
fn discarding_moves_the_prefetch_past_the_tensor() {
    let (_dir, store, hs) = written_store(2, 2, 6);
    // The caller had the last two in memory: the prefetch goes on with the ones before.
    store.discard(&hs[5]);
    store.discard(&hs[4]);
    store.flush();
    // The read of the fifth may have started before it was discarded: it is dropped once
    // done, and the two before it are held.
    let s = store.stats();
    assert_eq!(s.held_bytes, 2 * 8192, "{s:?}");
    assert!(store.get(&hs[3]).unwrap()[..] == tensor(3, 8192)[..]);
    assert!(store.get(&hs[2]).unwrap()[..] == tensor(2, 8192)[..]);
    assert_eq!(store.stats().gets_from_disk, 0);
}

/// Memory owned elsewhere that its owner may change after lending it (a tensor changed in
/// place).
struct Changing {
    bytes: Arc<[std::sync::atomic::AtomicU8]>,
}

impl fastensor::offload::ForeignBytes for Changing {
    fn bytes(&self) -> &[u8] {
        // SAFETY: AtomicU8 has the size, alignment and bit validity of u8; the store only
        // reads these bytes, and a change made meanwhile by the owner is what this test is
        // about (the store must not return it from `get_written`).
        unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<u8>(), self.bytes.len()) }
    }
}

impl Changing {
    /// Puts 20,000 bytes of memory owned by the test in `store` ("changed"), optionally
    /// flushed; then changes every byte. The handle, and the bytes as they were put.
    fn put_then_change(store: &OffloadStore, flush: bool) -> (Handle, HostBuffer) {
        use std::sync::atomic::{AtomicU8, Ordering};
        let original = tensor(3, 20_000);
        let bytes: Arc<[AtomicU8]> = original.iter().map(|&b| AtomicU8::new(b)).collect();
        let lent = fastensor::offload::Payload::foreign(Changing {
            bytes: bytes.clone(),
        });
        let h = store.put(lent, "changed").unwrap();
        if flush {
            store.flush();
        }
        for b in bytes.iter() {
            b.fetch_add(1, Ordering::SeqCst);
        }
        (h, original)
    }
}

#[test]
fn get_written_returns_the_bytes_as_put_when_the_owner_changed_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let store = OffloadStore::new(&memory_engine(), swapping(dir.path())).unwrap();
    let (h, original) = Changing::put_then_change(&store, true);
    // Kept in memory after its write, but that memory changed: the bytes come from disk.
    assert!(store.get_written(&h).unwrap()[..] == original[..]);
    assert_eq!(store.stats().bytes_read, 20_000);
}

#[test]
fn the_last_tensors_put_are_never_written() {
    // Room for four, two of them unwritten (the default: the budget less half of it, at
    // most four tensors, for the writes in flight).
    let dir = tempfile::tempdir().unwrap();
    let config = OffloadConfig::new(dir.path(), 4 * 8192).small_threshold(0);
    let store = OffloadStore::new(&memory_engine(), config).unwrap();
    let hs: Vec<Handle> = (0..6)
        .map(|i| store.put(tensor(i, 8192), format!("t{i}")).unwrap())
        .collect();
    store.expect_backward();
    for (i, h) in hs.iter().enumerate().rev() {
        assert!(
            store.get(h).unwrap()[..] == tensor(i as u64, 8192)[..],
            "t{i}"
        );
    }
    let s = store.stats();
    assert_eq!(s.bytes_never_written, 2 * 8192, "{s:?}");
    assert_eq!(s.bytes_written, 4 * 8192, "{s:?}");
    assert!(s.peak_held_bytes <= 4 * 8192, "{s:?}");
}

/// A store over the memory engine in a new directory (alive as long as the store) with a
/// budget of `room` tensors of 8 KiB, all of which may stay unwritten.
fn unwritten_store(room: u64) -> (tempfile::TempDir, OffloadStore) {
    let dir = tempfile::tempdir().unwrap();
    let config = OffloadConfig::new(dir.path(), room * 8192)
        .small_threshold(0)
        .write_behind(room * 8192);
    let store = OffloadStore::new(&memory_engine(), config).unwrap();
    (dir, store)
}

#[test]
fn a_put_that_needs_the_room_of_unwritten_tensors_writes_them() {
    // The whole budget may stay unwritten: a put that finds it full starts the writes of
    // the oldest and waits for them (rather than forever).
    let (_dir, store) = unwritten_store(2);
    let hs: Vec<Handle> = (0..5)
        .map(|i| store.put(tensor(i, 8192), format!("t{i}")).unwrap())
        .collect();
    let s = store.stats();
    assert_eq!(
        (s.bytes_written, s.held_bytes),
        (3 * 8192, 2 * 8192),
        "{s:?}"
    );
    for (i, h) in hs.iter().enumerate() {
        assert!(store.get(h).unwrap()[..] == tensor(i as u64, 8192)[..]);
    }
    assert_eq!(store.stats().bytes_never_written, 2 * 8192);
}

#[test]
fn flush_writes_the_unwritten_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let store = OffloadStore::new(&memory_engine(), swapping(dir.path())).unwrap();
    let h = store.put(tensor(7, 8192), "t").unwrap();
    assert_eq!(
        store.stats().bytes_written,
        0,
        "unwritten while the budget has room"
    );
    store.flush();
    assert_eq!(store.stats().bytes_written, 8192);
    assert!(store.get(&h).unwrap()[..] == tensor(7, 8192)[..]);
    assert_eq!(store.stats().bytes_never_written, 0);
}

#[test]
fn get_written_refuses_an_unwritten_tensor_whose_owner_changed_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = OffloadStore::new(&memory_engine(), swapping(dir.path())).unwrap();
    let (h, _) = Changing::put_then_change(&store, false);
    // Never written: the bytes it had when put are nowhere, and the store says so.
    let err = store.get_written(&h).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Changed, "{err}");
    assert!(err.to_string().contains("changed"), "{err}");
}

#[test]
fn puts_from_two_threads_start_the_writes_their_room_needs_whenever_they_wake() {
    // The whole budget may stay unwritten: a put that waits starts the writes the room needs
    // each time it looks again (another put may have taken the room the last writes freed
    // and left only unwritten tensors behind).
    let (_dir, store) = unwritten_store(4);
    let seed = |t: u64, i: u64| t * 1000 + i;
    let handles: Vec<Vec<Handle>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let store = &store;
                s.spawn(move || {
                    (0..200u64)
                        .map(|i| store.put(tensor(seed(t, i), 8192), format!("t{t}-{i}")))
                        .collect::<fastensor::Result<Vec<Handle>>>()
                        .unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(store.stats().peak_held_bytes <= 4 * 8192);
    for (t, hs) in handles.iter().enumerate() {
        for (i, h) in hs.iter().enumerate().rev() {
            assert!(store.get(h).unwrap()[..] == tensor(seed(t as u64, i as u64), 8192)[..]);
        }
    }
}

/// A tensor whose 1 MiB chunks are, in turn: a float dropout mask (0 or 1/0.9), random
/// bytes, zeros, a boolean mask, mostly zeros, random bytes; `len` bytes in all.
fn patchwork(seed: u64, len: usize) -> HostBuffer {
    let mut b = tensor(seed, len);
    let scale = (1.0f32 / 0.9).to_ne_bytes();
    for (i, chunk) in b.chunks_mut(1 << 20).enumerate() {
        match i % 6 {
            0 => {
                for (j, w) in chunk.chunks_exact_mut(4).enumerate() {
                    let keep = !(j as u64 * 7 + seed).is_multiple_of(10);
                    w.copy_from_slice(&if keep { scale } else { [0; 4] });
                }
            }
            2 => chunk.fill(0),
            3 => chunk.iter_mut().for_each(|x| *x &= 1),
            4 => {
                for (j, w) in chunk.chunks_exact_mut(4).enumerate() {
                    if j % 19 != 0 {
                        w.fill(0);
                    }
                }
            }
            _ => {}
        }
    }
    b
}

#[test]
fn packed_chunks_come_back_bit_exact_from_a_real_disk_and_cross_fewer_bytes() {
    for pack in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::new().unwrap();
        let budget = 8 << 20;
        let config = OffloadConfig::new(dir.path(), budget)
            .small_threshold(64 << 10)
            .write_behind(0)
            .pack(pack);
        let store = OffloadStore::new(&engine, config).unwrap();
        // Lengths around chunk and page boundaries, one larger than the budget (written
        // through), the last chunk of some not a multiple of a word.
        let lens = [
            6 << 20,
            (5 << 20) + 4096 + 12,
            (3 << 20) + 3,
            (12 << 20) + 100,
            1 << 20,
            (2 << 20) - 4,
            (7 << 20) + 65536,
        ];
        let mut handles: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let h = store
                    .put(patchwork(i as u64, len), format!("p{i}"))
                    .unwrap();
                (i, len, h)
            })
            .collect();
        store.flush();
        while let Some((i, len, h)) = handles.pop() {
            let got = store.get(&h).unwrap();
            assert!(
                got[..] == patchwork(i as u64, len)[..],
                "tensor {i}, pack {pack}"
            );
        }
        let s = store.stats();
        assert!(s.peak_held_bytes <= budget, "{s:?}");
        assert!(s.bytes_read > 20 << 20, "most came back from disk: {s:?}");
        if pack {
            // Four chunks of six pack to a bitmap or less: well under three quarters.
            assert!(s.file_bytes_written < s.bytes_written / 4 * 3, "{s:?}");
            assert!(s.file_bytes_read < s.bytes_read / 4 * 3, "{s:?}");
        } else {
            assert!(s.file_bytes_written >= s.bytes_written, "{s:?}");
            assert!(s.file_bytes_read >= s.bytes_read, "{s:?}");
        }
    }
}

#[test]
fn a_packed_read_that_fails_surfaces_on_get() {
    let (engine, _faulty) = faulty_engine(Fault::new(Op::Read, When::From(0), ErrorKind::Io));
    let dir = tempfile::tempdir().unwrap();
    let store = OffloadStore::new(&engine, swapping(dir.path()).write_behind(0)).unwrap();
    let len = 3 << 20; // larger than the budget: written through, then read by the get
    let h = store.put(patchwork(1, len), "mask").unwrap();
    assert!(store.stats().file_bytes_written < (len / 2) as u64);
    let err = store.get(&h).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("mask"), "{err}");
}

#[test]
fn is_written_turns_true_once_the_write_has_finished_and_never_before() {
    let dir = tempfile::tempdir().unwrap();
    let config = swapping(dir.path()).io_threads(1).write_behind(0);
    let (engine, gate) = gated_engine();
    let store = OffloadStore::new(&engine, config).unwrap();
    let first = store.put(tensor(1, 8192), "first").unwrap();
    // Its write is in flight (held at the gate): its bytes are not on disk yet.
    gate.wait_entered();
    assert!(!store.is_written(&first));
    gate.release();
    store.flush();
    assert!(store.is_written(&first), "written, and kept in memory");
    // A tensor left unwritten (write-behind) is not, nor a handle of another store.
    let dir2 = tempfile::tempdir().unwrap();
    let other = OffloadStore::new(&memory_engine(), swapping(dir2.path())).unwrap();
    let unwritten = other.put(tensor(2, 8192), "unwritten").unwrap();
    assert!(!other.is_written(&unwritten));
    assert!(!store.is_written(&unwritten));
    assert!(!other.is_written(&first));
}
