//! A load is one job with one decision: a load into new host memory maps the file (no
//! backend choice, nothing read through a backend), a load into existing memory goes
//! through one backend chosen once, and a cold read into fresh memory never explores a
//! page-cache backend. The mapped load's guarantees: a file replaced by rename leaves the
//! loaded tensors as they were; one truncated in place waits until the tensors' pages are
//! moved into memory of the process (the read lease: `tests/protected_loads.rs`); mapped
//! unprotected (opt-in), a cut is an error during the load. A later load (`load_later`)
//! maps the file and leaves its pages to `PendingPages::bring_in`.

mod common;

use common::{buffers, targets, views};
use fastensor::checkpoint::{self, Placement};
use fastensor::engine::NewLoads;
use fastensor::{DType, Engine, TensorDesc};
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// Tensors of a few sizes with distinct bytes.
fn tensors() -> Vec<(TensorDesc, Vec<u8>)> {
    [3 << 20, 1 << 20, 40_000, 4097, 7, 0]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let data: Vec<u8> = (0..len).map(|j| (j * 7 + i * 13) as u8).collect();
            (
                TensorDesc::new(format!("t{i}"), DType::U8, [len as u64]),
                data,
            )
        })
        .collect()
}

fn save(engine: &Engine, path: &Path, t: &[(TensorDesc, Vec<u8>)]) {
    checkpoint::save(engine, path, &views(t)).unwrap();
}

/// [`tensors`] saved (by a fresh engine) as `c.safetensors` in a new directory.
fn saved() -> (TempDir, PathBuf, Vec<(TensorDesc, Vec<u8>)>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let t = tensors();
    save(&fresh_engine(), &path, &t);
    (dir, path, t)
}

/// Drops the file's pages from the page cache (so that reads are cold).
fn evict(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
}

fn fresh_engine() -> Engine {
    Engine::builder().build().unwrap()
}

fn backend_bytes(engine: &Engine) -> Vec<(String, u64)> {
    engine
        .report()
        .usage
        .into_iter()
        .filter(|u| u.bytes > 0)
        .map(|u| (u.name, u.bytes))
        .collect()
}

#[test]
fn a_fresh_engines_load_maps_the_file_and_chooses_no_backend() {
    let (_dir, path, t) = saved();
    evict(&path);

    let engine = fresh_engine();
    let ckpt = checkpoint::load(&engine, &path).unwrap();
    assert!(ckpt.arena().is_mapped());
    for (d, b) in &t {
        assert_eq!(ckpt.tensor(&d.name).unwrap().1, &b[..], "{}", d.name);
    }
    assert_eq!(engine.new_loads(), (1, 0));
    let stats = engine.selector_stats();
    assert_eq!((stats.choices, stats.explorations), (0, 0));
    assert_eq!(backend_bytes(&engine), vec![]);

    let some = checkpoint::load_selected(&engine, &path, ["t3", "t0"]).unwrap();
    assert_eq!(some.len(), 2);
    assert_eq!(some.tensor("t3").unwrap().1, &t[3].1[..]);
    assert_eq!(engine.new_loads(), (2, 0));
    let missing = checkpoint::load_selected(&engine, &path, ["t1", "nope"]).unwrap_err();
    assert_eq!(missing.kind(), fastensor::ErrorKind::NotFound);
}

#[test]
fn a_pinned_engine_reads_into_memory_of_its_own_through_its_backend() {
    let (_dir, path, t) = saved();
    let engine = Engine::builder().pin("posix").build().unwrap();
    let ckpt = checkpoint::load(&engine, &path).unwrap();
    assert!(!ckpt.arena().is_mapped());
    assert_eq!(ckpt.tensor("t0").unwrap().1, &t[0].1[..]);
    assert_eq!(engine.new_loads(), (0, 1));
    assert_eq!(engine.read_jobs(), 1);
    let used: Vec<String> = backend_bytes(&engine).into_iter().map(|(n, _)| n).collect();
    assert_eq!(used, vec!["posix".to_string()]);
}

#[test]
fn a_profile_that_measured_reading_faster_makes_new_loads_read() {
    let (dir, path, t) = saved();
    let profile = dir.path().join("profile.toml");
    for (placement, mapped) in [("read", false), ("mapped", true)] {
        let mut dictionary = fresh_engine().dictionary();
        dictionary.knobs.insert(
            "engine".to_string(),
            [("new_loads".to_string(), placement.to_string())].into(),
        );
        fastensor::profile::save(&dictionary, &profile).unwrap();
        let engine = Engine::builder().profile(&profile).build().unwrap();
        let want = if mapped {
            NewLoads::Mapped
        } else {
            NewLoads::Read
        };
        assert_eq!(engine.measured_new_loads(), Some(want));
        let ckpt = checkpoint::load(&engine, &path).unwrap();
        assert_eq!(ckpt.arena().is_mapped(), mapped, "{placement}");
        assert_eq!(ckpt.tensor("t1").unwrap().1, &t[1].1[..]);
    }
    assert_eq!(fresh_engine().measured_new_loads(), None);
}

#[test]
fn a_load_into_existing_memory_is_one_job_through_one_backend() {
    let (_dir, path, t) = saved();
    for _ in 0..3 {
        evict(&path);
        let engine = fresh_engine();
        let mut bufs = buffers(&t, 1);
        checkpoint::load_into(&engine, &path, targets(&t, &mut bufs)).unwrap();
        for ((d, want), got) in t.iter().zip(&bufs) {
            assert_eq!(got, want, "{}", d.name);
        }
        assert_eq!(engine.read_jobs(), 1);
        // The header is read plainly; the job's reads make at most one choice.
        assert!(engine.selector_stats().choices <= 1);
        assert_eq!(
            backend_bytes(&engine).len(),
            1,
            "{:?}",
            backend_bytes(&engine)
        );
    }
}

#[test]
fn a_cold_read_into_fresh_memory_never_explores_a_page_cache_backend() {
    let (_dir, path, t) = saved();
    let engine = Engine::builder().mapped_loads(false).build().unwrap();
    for _ in 0..12 {
        evict(&path);
        let ckpt = checkpoint::load(&engine, &path).unwrap();
        assert!(!ckpt.arena().is_mapped());
        assert_eq!(ckpt.tensor("t0").unwrap().1, &t[0].1[..]);
    }
    assert_eq!(engine.new_loads(), (0, 12));
    assert_eq!(engine.read_jobs(), 12);
    for (name, bytes) in backend_bytes(&engine) {
        assert!(
            name != "posix" && name != "mmap",
            "{bytes} bytes went through {name}, a page-cache backend, into fresh memory"
        );
    }
}

#[test]
fn mapped_tensors_keep_their_bytes_when_the_file_is_replaced_by_rename() {
    let (_dir, path, t) = saved();
    let engine = fresh_engine();
    let ckpt = checkpoint::load(&engine, &path).unwrap();
    // Saves replace the file by rename: the mapping keeps the old file alive.
    let other: Vec<(TensorDesc, Vec<u8>)> = t
        .iter()
        .map(|(d, b)| (d.clone(), b.iter().map(|x| !x).collect()))
        .collect();
    save(&engine, &path, &other);
    std::fs::remove_file(&path).unwrap();
    for (d, b) in &t {
        assert_eq!(ckpt.tensor(&d.name).unwrap().1, &b[..], "{}", d.name);
    }
}

#[test]
fn a_file_cut_in_place_under_a_load_is_an_error_and_later_reads_of_the_cut_raise_sigbus() {
    let (dir, path, _) = saved();
    // A file cut before the load: the header's tensors no longer fit.
    let cut = dir.path().join("cut.safetensors");
    std::fs::copy(&path, &cut).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&cut).unwrap();
    f.set_len(f.metadata().unwrap().len() - 5000).unwrap();
    let err = checkpoint::load(&fresh_engine(), &cut).unwrap_err();
    assert_eq!(err.kind(), fastensor::ErrorKind::Corrupt, "{err}");

    // Cut after the load: a child process reads the cut pages and dies of SIGBUS (in a
    // child, so that this test process lives).
    let ckpt = checkpoint::load(&fresh_engine(), &path).unwrap();
    let (_, first) = ckpt.tensor("t0").unwrap();
    // SAFETY: the child only cuts the file and reads the mapping, then exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(4096).unwrap();
        std::hint::black_box(first[first.len() - 1]);
        // SAFETY: leaves the child at once (no destructors of the parent's state).
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for the child made above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFSIGNALED(status), "status {status}");
    assert_eq!(libc::WTERMSIG(status), libc::SIGBUS);
}

/// Whether the page holding byte `at` of `mem` is in memory (`mincore`).
fn resident(mem: &[u8], at: usize) -> bool {
    let page = (mem.as_ptr() as usize + at) & !4095;
    let mut vec = [0u8; 1];
    // SAFETY: `page` is the page-aligned start of a page of a live mapping; `mincore` writes
    // one byte of `vec` for it.
    let r = unsafe { libc::mincore(page as *mut libc::c_void, 4096, vec.as_mut_ptr()) };
    assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
    vec[0] & 1 == 1
}

#[test]
fn a_later_load_maps_the_file_first_and_brings_its_pages_in_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.safetensors");
    let big: Vec<u8> = (0..32u32 << 20).map(|j| (j % 251) as u8).collect();
    let t = vec![
        (TensorDesc::new("big", DType::U8, [big.len() as u64]), big),
        (
            TensorDesc::new("small", DType::U8, [5]),
            vec![1, 2, 3, 4, 5],
        ),
    ];
    save(&fresh_engine(), &path, &t);
    evict(&path);

    let engine = fresh_engine();
    let (ckpt, pending) = checkpoint::load_later(&engine, &path, None).unwrap();
    let pending = pending.expect("a fresh engine maps new loads");
    assert!(ckpt.arena().is_mapped());
    assert!(pending.bytes() >= (32 << 20) + 5);
    let (_, bytes) = ckpt.tensor("big").unwrap();
    let tail = bytes.len() - 1;
    assert!(
        !resident(bytes, tail),
        "the pages came in before they were asked for"
    );
    pending.bring_in(ckpt.arena()).unwrap();
    assert!(resident(bytes, tail));
    for (d, b) in &t {
        assert_eq!(ckpt.tensor(&d.name).unwrap().1, &b[..], "{}", d.name);
    }
    assert_eq!(engine.new_loads(), (1, 0), "one mapped load");
}

#[test]
fn a_later_load_by_name_pinned_or_cut_behaves_as_a_load() {
    let (dir, path, t) = saved();
    let engine = fresh_engine();
    let (some, pending) = checkpoint::load_later(&engine, &path, Some(&["t3", "t0"])).unwrap();
    pending.unwrap().bring_in(some.arena()).unwrap();
    assert_eq!(some.len(), 2);
    assert_eq!(some.tensor("t3").unwrap().1, &t[3].1[..]);
    assert_eq!(some.tensor("t0").unwrap().1, &t[0].1[..]);
    let missing = checkpoint::load_later(&engine, &path, Some(&["t1", "nope"])).unwrap_err();
    assert_eq!(missing.kind(), fastensor::ErrorKind::NotFound);

    // Pages of one checkpoint are not brought in through another's arena.
    let (a, pending_a) = checkpoint::load_later(&engine, &path, None).unwrap();
    let (b, _) = checkpoint::load_later(&engine, &path, None).unwrap();
    let err = pending_a.unwrap().bring_in(b.arena()).unwrap_err();
    assert_eq!(err.kind(), fastensor::ErrorKind::InvalidInput, "{err}");
    drop(a);

    // A pinned engine reads the whole load at once: nothing is pending.
    let pinned = Engine::builder().pin("posix").build().unwrap();
    let (ckpt, pending) = checkpoint::load_later(&pinned, &path, None).unwrap();
    assert!(pending.is_none() && !ckpt.arena().is_mapped());
    assert_eq!(ckpt.tensor("t1").unwrap().1, &t[1].1[..]);

    // A file cut in place before its pages are in: the lease moves them into memory of
    // the process first, and the load keeps its bytes.
    let cut = dir.path().join("cut.safetensors");
    std::fs::copy(&path, &cut).unwrap();
    evict(&cut);
    let (ckpt, pending) = checkpoint::load_later(&engine, &cut, None).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&cut).unwrap();
    f.set_len(8192).unwrap();
    pending.unwrap().bring_in(ckpt.arena()).unwrap();
    assert_eq!(ckpt.tensor("t1").unwrap().1, &t[1].1[..]);

    // Mapped unprotected (opt-in; here because a writer has the file open, so no lease can
    // be had): the cut is an error naming the file, not a signal.
    std::fs::copy(&path, &cut).unwrap();
    evict(&cut);
    let unprotected = Engine::builder().unprotected_maps(true).build().unwrap();
    let (ckpt, pending) = checkpoint::load_later(&unprotected, &cut, None).unwrap();
    assert_eq!(ckpt.arena().placement(), Placement::Unprotected);
    f.set_len(8192).unwrap();
    let err = pending.unwrap().bring_in(ckpt.arena()).unwrap_err();
    assert_eq!(err.kind(), fastensor::ErrorKind::Changed, "{err}");
    assert!(err.to_string().contains("cut.safetensors"), "{err}");
}
