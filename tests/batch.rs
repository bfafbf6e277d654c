//! Batches through an engine file, with throttled backends on a virtual clock: one backend
//! is chosen for the batch's context, and its own batch path moves the batch.

mod common;

use common::{Hooked, Hooks};
use fastensor::core::ClockReading;
use fastensor::core::{ReadRequest, WriteRequest};
use fastensor::{Backend, Engine, OpenMode, Registry};
use fastensor_testkit::throttled::{Cost, Costs, Throttled, VirtualClock};
use fastensor_testkit::MemoryBackend;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Setup {
    engine: Engine,
    /// Per backend (`a`, `b`): the throttled backend, its batch calls, their requests.
    paths: Vec<(Arc<Throttled>, Arc<AtomicU64>, Arc<AtomicU64>)>,
}

/// `a` (14 µs per 4 KiB) and `b` (201 µs per 4 KiB) over one store.
fn setup() -> Setup {
    let clock = VirtualClock::new();
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let c = clock.clone();
    let mut builder = Engine::builder()
        .registry(Registry::new())
        .clock(move || ClockReading {
            wall: c.wall(),
            cpu: c.cpu(),
        });
    let mut paths = Vec::new();
    for (name, cost) in [
        ("a", Cost::new(10_000, 1.0)),
        ("b", Cost::new(200_000, 0.2)),
    ] {
        let t = Arc::new(Throttled::virtual_clock(
            name,
            store.clone(),
            Costs::uniform(cost),
            &clock,
        ));
        let (batches, batched): (Arc<AtomicU64>, Arc<AtomicU64>) = Default::default();
        let hooks = Hooks {
            batches: Some((batches.clone(), batched.clone())),
            ..Hooks::default()
        };
        builder = builder.backend(Arc::new(Hooked {
            inner: t.clone(),
            hooks,
        }));
        paths.push((t, batches, batched));
    }
    Setup {
        engine: builder.build().unwrap(),
        paths,
    }
}

const PAGE: usize = 4096;
const REQUESTS: usize = 1000;

/// Reads of every page of `back`, page `i` from file offset `i * PAGE`.
fn page_reads(back: &mut [u8]) -> Vec<ReadRequest<'_>> {
    back.chunks_mut(PAGE)
        .enumerate()
        .map(|(i, c)| ReadRequest::new((i * PAGE) as u64, c))
        .collect()
}

#[test]
fn a_batch_is_explored_in_pieces_then_moved_by_the_choices_own_batch() {
    let s = setup();
    let file = s
        .engine
        .open(Path::new("/virtual/batch.bin"), OpenMode::Create)
        .unwrap();
    // Written as one batch: pages of distinct bytes, in reverse order.
    let pages: Vec<Vec<u8>> = (0..REQUESTS).map(|i| vec![i as u8; PAGE]).collect();
    let writes: Vec<WriteRequest<'_>> = pages
        .iter()
        .enumerate()
        .rev()
        .map(|(i, p)| WriteRequest::new((i * PAGE) as u64, p.as_slice()))
        .collect();
    file.write_batch(&writes).unwrap();
    // Read back as one batch, every request filled with its page.
    let mut back = vec![0u8; REQUESTS * PAGE];
    let mut reads = page_reads(&mut back);
    file.read_batch(&mut reads).unwrap();
    assert!(reads.iter().all(|r| r.done == PAGE));
    drop(reads);
    for (i, page) in back.chunks(PAGE).enumerate() {
        assert!(page.iter().all(|&x| x == i as u8), "page {i}");
    }
    // Both batches found `a` (14x cheaper per 4 KiB), at a bounded cost: `b` carried at
    // most two exploring pieces (16 requests each) per batch.
    let dict = s.engine.dictionary();
    assert_eq!(dict.contexts.len(), 2, "{dict:?}");
    for ctx in &dict.contexts {
        assert_eq!(ctx.choice.as_deref(), Some("a"), "{dict:?}");
        assert_eq!(
            ctx.in_flight, 3,
            "a batch's requests are in flight together"
        );
    }
    let (b, b_batches, _) = &s.paths[1];
    assert!(b.calls() <= 2 * 2 * 16, "b carried {} requests", b.calls());
    assert!(b_batches.load(Ordering::Relaxed) <= 4);
    // Explored, a batch is one call of the choice's batch path, carrying every request.
    let (a, a_batches, a_batched) = &s.paths[0];
    let (calls, batches, batched) = (
        a.calls(),
        a_batches.load(Ordering::Relaxed),
        a_batched.load(Ordering::Relaxed),
    );
    let b_calls = b.calls();
    let mut reads = page_reads(&mut back);
    file.read_batch(&mut reads).unwrap();
    assert_eq!(a_batches.load(Ordering::Relaxed), batches + 1);
    assert_eq!(a_batched.load(Ordering::Relaxed), batched + REQUESTS as u64);
    assert_eq!(a.calls(), calls + REQUESTS as u64);
    assert_eq!(b.calls(), b_calls);
}

#[test]
fn an_empty_batch_moves_nothing_and_a_read_only_file_refuses_a_write_batch() {
    let s = setup();
    let path = Path::new("/virtual/empty.bin");
    let file = s.engine.open(path, OpenMode::Create).unwrap();
    file.write_batch(&[]).unwrap();
    file.read_batch(&mut []).unwrap();
    assert!(s.paths.iter().all(|(t, ..)| t.calls() == 0));
    drop(file);
    let file = s.engine.open(path, OpenMode::Read).unwrap();
    let page = vec![0u8; PAGE];
    let err = file
        .write_batch(&[WriteRequest::new(0, page.as_slice())])
        .unwrap_err();
    assert_eq!(err.kind(), fastensor::ErrorKind::PermissionDenied);
}
