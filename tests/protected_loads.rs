//! A mapped load keeps its bytes whatever is done to its file: each load holds a read lease
//! on the file, and a writer that opens it (for writing, or truncating) waits until the
//! loaded tensors' pages are moved into memory of the process. Where no lease can be had
//! (a writer already has the file open) the load reads the file into memory of its own, or
//! maps it unprotected where the engine was told to.
//!
//! The writers here are threads of the test process itself: a lease is broken by any
//! process's open, this one's included. Every check reads the tensors directly: a page the
//! file took away would end the test process with `SIGBUS`.

mod common;

use common::views;
use fastensor::checkpoint::{self, Checkpoint, Placement};
use fastensor::{DType, Engine, TensorDesc};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// How long a writer may be held: moving a few MiB takes milliseconds.
const HELD_AT_MOST: Duration = Duration::from_secs(5);

fn tensors() -> Vec<(TensorDesc, Vec<u8>)> {
    [5 << 20, 2 << 20, 4097, 3]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let data: Vec<u8> = (0..len).map(|j| (j * 31 + i * 7 + 1) as u8).collect();
            (
                TensorDesc::new(format!("t{i}"), DType::U8, [len as u64]),
                data,
            )
        })
        .collect()
}

fn saved() -> (TempDir, PathBuf, Vec<(TensorDesc, Vec<u8>)>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let t = tensors();
    checkpoint::save(&Engine::builder().build().unwrap(), &path, &views(&t)).unwrap();
    (dir, path, t)
}

/// Drops the file's clean pages from the page cache.
fn evict(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
}

fn assert_intact(ckpt: &Checkpoint, t: &[(TensorDesc, Vec<u8>)], what: &str) {
    for (d, b) in t {
        if let Some((_, got)) = ckpt.tensor(&d.name) {
            assert!(got == &b[..], "{what}: tensor {} changed", d.name);
        }
    }
}

/// Something another program may do to a checkpoint file in place, named.
type Act = (&'static str, fn(&Path));

/// What another program may do to a checkpoint file in place.
fn acts() -> Vec<Act> {
    vec![
        ("copied over (O_TRUNC)", |p| {
            let mut f = std::fs::File::create(p).unwrap();
            f.write_all(&vec![0xAB; 9 << 20]).unwrap();
        }),
        ("rewritten in place", |p| {
            let f = OpenOptions::new().read(true).write(true).open(p).unwrap();
            f.write_all_at(&vec![0xCD; 6 << 20], 4096).unwrap();
        }),
        ("truncated to zero", |p| {
            OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(0)
                .unwrap();
        }),
        ("truncated to half by path", |p| {
            let len = std::fs::metadata(p).unwrap().len();
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: `truncate(2)` of a path given as a C string that lives for the call.
            let rc = unsafe { libc::truncate(c.as_ptr(), (len / 2) as libc::off_t) };
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        }),
    ]
}

#[test]
fn every_mapped_load_keeps_its_bytes_whatever_is_done_to_its_file() {
    let engine = Engine::builder().build().unwrap();
    for (act, run) in acts() {
        let (_dir, path, t) = saved();
        let all = checkpoint::load(&engine, &path).unwrap();
        let some = checkpoint::load_selected(&engine, &path, ["t1", "t3"]).unwrap();
        let (later, pending) = checkpoint::load_later(&engine, &path, None).unwrap();
        // A page this process wrote is its own, but a truncation would take it too.
        let (mut arena, entries, _) = checkpoint::load(&engine, &path).unwrap().into_parts();
        let at = entries[0].1.start + 4096;
        arena[at] = 0x55;
        for c in [&all, &some, &later] {
            assert_eq!(c.arena().placement(), Placement::Leased, "{act}");
        }
        let breaks = breaks_answered();

        let started = Instant::now();
        run(&path);
        let held = started.elapsed();
        assert!(held < HELD_AT_MOST, "{act}: the writer was held {held:?}");
        evict(&path);

        assert!(breaks_answered() > breaks, "{act}: no break was answered");
        for c in [&all, &some, &later] {
            assert_eq!(c.arena().placement(), Placement::Moved, "{act}");
            assert_intact(c, &t, act);
        }
        pending.unwrap().bring_in(later.arena()).unwrap();
        assert_intact(&later, &t, act);
        assert_eq!(arena.placement(), Placement::Moved, "{act}");
        assert_eq!(arena[at], 0x55, "{act}: a byte this process wrote");
        assert_eq!(arena[at + 1], t[0].1[4097], "{act}");
    }
}

/// Breaks answered in this process so far (the tests of this file run in parallel, so
/// only growth is checked).
fn breaks_answered() -> u64 {
    fastensor::sys::lease::stats().breaks
}

#[test]
fn a_verified_load_keeps_its_bytes_too() {
    let (dir, _, t) = saved();
    let engine = Engine::builder().build().unwrap();
    let path = dir.path().join("checked.safetensors");
    checkpoint::save_checked(&engine, &path, &views(&t), &Default::default()).unwrap();
    let ckpt = checkpoint::load_verified(&engine, &path, None).unwrap();
    assert_eq!(ckpt.arena().placement(), Placement::Leased);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    evict(&path);
    assert_eq!(ckpt.arena().placement(), Placement::Moved);
    assert_intact(&ckpt, &t, "verified, truncated");
}

#[test]
fn where_a_writer_has_the_file_open_the_load_reads_it_into_memory_of_its_own() {
    let (_dir, path, t) = saved();
    let writer = OpenOptions::new().write(true).open(&path).unwrap();
    let engine = Engine::builder().build().unwrap();
    let ckpt = checkpoint::load(&engine, &path).unwrap();
    assert_eq!(ckpt.arena().placement(), Placement::Read);
    let some = checkpoint::load_selected(&engine, &path, ["t0"]).unwrap();
    assert_eq!(some.arena().placement(), Placement::Read);
    let (later, pending) = checkpoint::load_later(&engine, &path, None).unwrap();
    assert!(pending.is_none(), "a read load is whole");
    writer.set_len(0).unwrap();
    evict(&path);
    for c in [&ckpt, &some, &later] {
        assert_intact(c, &t, "read, then truncated");
    }
}

#[test]
fn an_engine_told_to_maps_unprotected_where_no_lease_can_be_had_and_the_file_shows_through() {
    let (_dir, path, t) = saved();
    let writer = OpenOptions::new().write(true).open(&path).unwrap();
    let engine = Engine::builder().unprotected_maps(true).build().unwrap();
    let ckpt = checkpoint::load(&engine, &path).unwrap();
    assert_eq!(ckpt.arena().placement(), Placement::Unprotected);
    assert_intact(&ckpt, &t, "before");
    // Rewritten in place: the change shows through (what the opt-in accepts).
    let file = checkpoint::open(&engine, &path).unwrap();
    let header = file.header();
    let t0 = header
        .entries()
        .iter()
        .find(|e| e.desc.name == "t0")
        .unwrap();
    writer
        .write_all_at(&[0xEE; 4096], header.file_range(t0).start)
        .unwrap();
    assert_eq!(ckpt.tensor("t0").unwrap().1[0], 0xEE);

    // With a lease to be had, the same engine takes it.
    drop(writer);
    let leased = checkpoint::load(&engine, &path).unwrap();
    assert_eq!(leased.arena().placement(), Placement::Leased);
}
