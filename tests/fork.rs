//! The engine in a child made by `fork(2)` (Python's `os.fork`, torch `DataLoader` workers):
//! the child inherits the parent's engine, its open files, its rings and pools, and locks
//! that threads of the parent (which do not exist in the child) may hold. Both processes
//! must go on moving the right bytes, and neither may hang.
//!
//! Every test forks, so they run one at a time (the static lock below): a child only has
//! the thread that forked, and that thread must not be racing another test's.

#[path = "../fastensor-sys/tests/child/mod.rs"]
mod child;

use child::fork;
use fastensor::checkpoint::{self, TensorView};
use fastensor::{DType, Engine, MemMut, TensorDesc};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Serializes the tests of this file (each forks).
static FORKING: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    FORKING.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long a child or the parent's side of a test may take before it counts as hung.
const HANG: Duration = Duration::from_secs(60);

/// `len` bytes of a pattern of `seed` that repeats every 4099 bytes: a read from a wrong
/// page-aligned offset, or of the other file, gets other bytes. (Made by copying, which is
/// fast in a debug build.)
fn bytes(len: usize, seed: u8) -> Vec<u8> {
    let block: Vec<u8> = (0..4099u32)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect();
    let mut v = block.repeat(len / block.len() + 1);
    v.truncate(len);
    v
}

/// Tensors whose sizes send reads through every path of the backends: a large aligned
/// one (zero copy, many requests), unaligned ones (staging, partial blocks), a tiny one.
fn tensors(seed: u8) -> Vec<(TensorDesc, Vec<u8>)> {
    [
        ("big", 6 << 20),
        ("odd", (1 << 20) + 4097),
        ("small", 3000),
        ("tiny", 7),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(name, len))| {
        (
            TensorDesc::new(name, DType::U8, [len as u64]),
            bytes(len, seed.wrapping_add(i as u8 * 17)),
        )
    })
    .collect()
}

fn save(engine: &Engine, path: &Path, seed: u8) -> Result<(), String> {
    let t = tensors(seed);
    let views: Vec<TensorView<'_>> = t
        .iter()
        .map(|(d, b)| TensorView::new(d.clone(), &b[..]))
        .collect();
    checkpoint::save(engine, path, &views).map_err(|e| format!("save: {e}"))
}

/// Loads `path` through `engine` and checks it holds the tensors of `seed`.
fn check_load(engine: &Engine, path: &Path, seed: u8) -> Result<(), String> {
    let ckpt = checkpoint::load(engine, path).map_err(|e| format!("load: {e}"))?;
    for (d, want) in tensors(seed) {
        let (_, got) = ckpt
            .tensor(&d.name)
            .ok_or_else(|| format!("{} missing", d.name))?;
        if got != &want[..] {
            return Err(format!(
                "{}: tensor {} holds other bytes",
                path.display(),
                d.name
            ));
        }
    }
    Ok(())
}

/// Reads every tensor of an open checkpoint and checks it holds the tensors of `seed`.
fn check_read(file: &checkpoint::CheckpointFile, seed: u8) -> Result<(), String> {
    let want = tensors(seed);
    let mut got: Vec<Vec<u8>> = want.iter().map(|(_, b)| vec![0u8; b.len()]).collect();
    let targets: Vec<(&str, MemMut<'_>)> = want
        .iter()
        .zip(got.iter_mut())
        .map(|((d, _), g)| (d.name.as_str(), MemMut::Host(&mut g[..])))
        .collect();
    file.read_into(targets)
        .map_err(|e| format!("read_into: {e}"))?;
    for ((d, w), g) in want.iter().zip(&got) {
        if w != g {
            return Err(format!("open file: tensor {} holds other bytes", d.name));
        }
    }
    Ok(())
}

/// Waits for the child `pid` until `deadline`; kills it and fails when it has not exited,
/// and fails when it did not exit with 0.
fn wait(pid: libc::pid_t, deadline: Instant) -> Result<(), String> {
    match child::wait(pid, deadline)? {
        0 => Ok(()),
        code => Err(format!("child {pid} failed (exit code {code})")),
    }
}

/// Runs `work` on a thread and gives up on it after [`HANG`] (a hung parent fails the test
/// rather than hanging the harness).
fn bounded<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    match rx.recv_timeout(HANG) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!("{what} hung")),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(format!("{what} panicked")),
    }
}

fn scratch() -> tempfile::TempDir {
    // Not tmpfs where the target directory is on disk: the direct backends need O_DIRECT.
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// The backends this build registers and this machine runs, by name.
fn backend_names() -> Vec<String> {
    Engine::new().unwrap().backend_names()
}

/// Parent and child each load their own file, in a loop, through an engine pinned to one
/// backend that the parent used before the fork; the parent also keeps one file open
/// across the fork, read on both sides. Each must see its own file's bytes.
#[test]
fn parent_and_child_load_their_own_files_after_a_fork_on_every_backend() {
    let _serial = serial();
    let dir = scratch();
    let a = dir.path().join("a.safetensors");
    let b = dir.path().join("b.safetensors");
    let writer = Engine::new().unwrap();
    save(&writer, &a, 1).unwrap();
    save(&writer, &b, 2).unwrap();
    let names = backend_names();
    assert!(!names.is_empty());
    println!("backends: {}", names.join(", "));
    for name in names {
        let engine = Engine::builder().pin(name.clone()).build().unwrap();
        // Rings, pools and handles that the child inherits.
        for _ in 0..3 {
            check_load(&engine, &a, 1).unwrap();
        }
        let open_a = Arc::new(checkpoint::open(&engine, &a).unwrap());
        check_read(&open_a, 1).unwrap();

        let (child_engine, child_open, child_b) = (engine.clone(), open_a.clone(), b.clone());
        let pid = fork(move || {
            for _ in 0..20 {
                check_load(&child_engine, &child_b, 2)?;
                check_read(&child_open, 1)?;
            }
            Ok(())
        });
        let deadline = Instant::now() + HANG;
        let (parent_engine, parent_a) = (engine.clone(), a.clone());
        let parent = bounded("the parent's loads", move || {
            for _ in 0..20 {
                check_load(&parent_engine, &parent_a, 1)?;
                check_read(&open_a, 1)?;
            }
            Ok(())
        });
        let child = wait(pid, deadline);
        if let Err(e) = parent.and(child) {
            panic!("backend {name}: {e}");
        }
        // The parent's engine still works after the child is gone.
        check_load(&engine, &a, 1).unwrap_or_else(|e| panic!("backend {name}: {e}"));
    }
}

/// Forks while another thread of the parent loads through the mapped path (the I/O thread
/// pool busy, its queue's lock possibly held at the fork): the child makes a pool of its
/// own, loads, and never waits for the parent's threads.
#[test]
fn mapped_loads_and_the_thread_pool_work_in_a_child_forked_while_they_run() {
    let _serial = serial();
    let dir = scratch();
    let a = dir.path().join("a.safetensors");
    let engine = Engine::new().unwrap();
    save(&engine, &a, 3).unwrap();
    check_load(&engine, &a, 3).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (loader_engine, loader_path, loader_stop) = (engine.clone(), a.clone(), stop.clone());
    let loader = std::thread::spawn(move || {
        while !loader_stop.load(Ordering::Relaxed) {
            check_load(&loader_engine, &loader_path, 3)?;
        }
        Ok::<(), String>(())
    });
    for _ in 0..8 {
        let (child_engine, child_path) = (engine.clone(), a.clone());
        let pid = fork(move || {
            for _ in 0..3 {
                check_load(&child_engine, &child_path, 3)?;
            }
            Ok(())
        });
        wait(pid, Instant::now() + HANG).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    loader.join().unwrap().unwrap();
    assert!(engine.new_loads().0 > 8);
}

/// Forks while another thread saves in a loop (the fork may catch it holding any lock of
/// the engine, a ring, a pool): each child saves once and loads back what it saved, and
/// must neither hang nor fail; the parent's saves must not fail either.
#[test]
fn a_fork_while_another_thread_saves_leaves_a_working_child() {
    let _serial = serial();
    let dir = scratch();
    for name in backend_names() {
        let engine = Engine::builder().build().unwrap();
        if name != "mmap" {
            // mmap is read-only: saves go through the others (the engine picks).
            engine.pin(Some(&name)).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (done_tx, done) = mpsc::channel();
        // A token each time the saver starts a save (dropped while one is waiting).
        let (started_tx, started) = mpsc::sync_channel(1);
        {
            let (engine, stop) = (engine.clone(), stop.clone());
            let path = dir.path().join(format!("loop-{name}.safetensors"));
            std::thread::spawn(move || {
                let mut n = 0;
                let result = loop {
                    if stop.load(Ordering::Relaxed) {
                        break Ok(n);
                    }
                    let _ = started_tx.try_send(());
                    if let Err(e) =
                        save(&engine, &path, 3).and_then(|()| check_load(&engine, &path, 3))
                    {
                        break Err(e);
                    }
                    n += 1;
                };
                let _ = done_tx.send(result);
            });
        }
        let mut failures = Vec::new();
        for i in 0..12 {
            // Fork once the saver has started another save; none started since the last fork
            // is left over to count.
            while started.try_recv().is_ok() {}
            if started.recv_timeout(HANG).is_err() {
                break; // the saver has stopped: `done` says why
            }
            // This delay is the scenario, not an ordering: it varies how far into the save the
            // fork lands, and whatever the save holds then, the child must work.
            std::thread::sleep(Duration::from_millis(3 * (i % 7)));
            let (child_engine, path) = (
                engine.clone(),
                dir.path().join(format!("child-{name}-{i}.safetensors")),
            );
            let pid = fork(move || {
                save(&child_engine, &path, 4)?;
                check_load(&child_engine, &path, 4)
            });
            if let Err(e) = wait(pid, Instant::now() + HANG) {
                failures.push(format!("fork {i}: {e}"));
            }
        }
        stop.store(true, Ordering::Relaxed);
        match done.recv_timeout(HANG) {
            Ok(Ok(n)) => println!("{name}: the parent saved {n} times meanwhile"),
            Ok(Err(e)) => failures.push(format!("parent: {e}")),
            Err(_) => failures.push("the parent's saves hung or panicked".to_string()),
        }
        assert!(failures.is_empty(), "backend {name}: {failures:#?}");
    }
}
