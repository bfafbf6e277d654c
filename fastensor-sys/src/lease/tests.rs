use super::*;
use crate::filemap::{FileMap, Protection};
use std::io::Write;
use std::time::{Duration, Instant};

/// A file of `pages` pages, page `i` filled with the byte `i + 1`, and its path.
fn file_of_pages(pages: usize) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let mut f = File::create(&path).unwrap();
    for i in 0..pages {
        f.write_all(&[(i + 1) as u8; 4096]).unwrap();
    }
    (dir, path)
}

/// The offsets a map guards: one range.
fn guard(r: Range<u64>) -> Vec<Range<u64>> {
    vec![r]
}

fn open_writer(path: &std::path::Path) -> File {
    std::fs::OpenOptions::new().write(true).open(path).unwrap()
}

#[test]
fn a_break_moves_the_guarded_memory_out_of_the_file_before_the_writer_goes_on() {
    let (_dir, path) = file_of_pages(1024);
    let file = File::open(&path).unwrap();
    let lease = take(&file).unwrap();
    let before = stats();
    let mut map = FileMap::leased(&file, 1024 * 4096, lease, &guard(4096..1024 * 4096))
        .unwrap()
        .expect("not broken yet");
    assert_eq!(map.protection(), Protection::Leased);
    map[8192] = 77; // a page this process wrote (copied on write, still in the file's mapping)

    // A writer (of this process: it is held all the same) cuts the file and rewrites it.
    let started = Instant::now();
    let w = open_writer(&path);
    w.set_len(0).unwrap();
    (&w).write_all(&[0xEE; 4096 * 4]).unwrap();
    let held = started.elapsed();
    assert!(
        held < Duration::from_secs(10),
        "the writer was held {held:?}"
    );

    assert_eq!(map.protection(), Protection::Moved);
    assert_eq!(map[4096], 2);
    assert_eq!(map[8192], 77);
    assert_eq!(map[8193], 3);
    assert_eq!(map[1022 * 4096 + 4095], (1023 % 256) as u8);
    map[1023 * 4096] = 5; // and it stays writable
    let after = stats();
    assert!(after.breaks > before.breaks);
    assert!(after.bytes_moved >= before.bytes_moved + 1023 * 4096);
}

#[test]
fn a_truncation_through_the_path_is_held_as_well() {
    let (_dir, path) = file_of_pages(64);
    let file = File::open(&path).unwrap();
    let lease = take(&file).unwrap();
    let map = FileMap::leased(&file, 64 * 4096, lease, &guard(0..64 * 4096))
        .unwrap()
        .unwrap();
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; truncate(2) by path.
    assert_eq!(unsafe { libc::truncate(c_path.as_ptr(), 4096 * 3 + 5) }, 0);
    assert_eq!(map.protection(), Protection::Moved);
    assert!((0..64).all(|i| map[i * 4096 + 100] == (i + 1) as u8));
}

#[test]
fn a_file_open_for_writing_refuses_a_lease() {
    let (_dir, path) = file_of_pages(2);
    let _writer = open_writer(&path);
    let file = File::open(&path).unwrap();
    let refused = take(&file).unwrap_err();
    assert_eq!(refused.refusal, Refusal::OpenForWriting, "{refused}");
    assert!(
        refused.to_string().contains("open for writing"),
        "{refused}"
    );
}

#[test]
fn refusals_are_told_from_their_errors() {
    let of = |n| Refusal::of(&io::Error::from_raw_os_error(n));
    assert_eq!(of(libc::EAGAIN), Refusal::OpenForWriting);
    assert_eq!(of(libc::EACCES), Refusal::NotPermitted);
    assert_eq!(of(libc::EPERM), Refusal::NotPermitted);
    assert_eq!(of(libc::EINVAL), Refusal::Unsupported);
    assert_eq!(of(libc::EBADF), Refusal::Failed);
}

#[test]
fn a_lease_let_go_holds_no_writer() {
    let (_dir, path) = file_of_pages(4);
    let file = File::open(&path).unwrap();
    let map = FileMap::leased(&file, 4 * 4096, take(&file).unwrap(), &guard(0..4 * 4096))
        .unwrap()
        .unwrap();
    let before = stats().breaks;
    drop(map);
    let started = Instant::now();
    open_writer(&path).set_len(0).unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    // No break was answered (other tests may break their own leases meanwhile, so only
    // this lease's absence is checked: a second lease can be taken with a writer gone).
    let _ = before;
    assert!(take(&File::open(&path).unwrap()).is_ok());
}

#[test]
fn a_lease_broken_before_its_memory_is_guarded_guards_nothing() {
    let (_dir, path) = file_of_pages(4);
    let file = File::open(&path).unwrap();
    let lease = take(&file).unwrap();
    open_writer(&path).set_len(4096).unwrap();
    let map = FileMap::leased(&file, 4096, lease, &guard(0..4096)).unwrap();
    assert!(map.is_none(), "the file changed before it was mapped");
}

#[test]
fn an_unprotected_map_says_so() {
    let (_dir, path) = file_of_pages(2);
    let file = File::open(&path).unwrap();
    let map = FileMap::unprotected(&file, 8192).unwrap();
    assert_eq!(map.protection(), Protection::Unprotected);
    assert_eq!(map[4096], 2);
}

/// How fast a break moves resident memory (release build:
/// `cargo test --release -p fastensor-sys --lib break_throughput -- --ignored --nocapture`).
#[test]
#[ignore]
fn break_throughput() {
    let gib: usize = std::env::var("FASTENSOR_BREAK_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let len = gib << 30;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let mut f = File::create(&path).unwrap();
    let chunk = vec![7u8; 64 << 20];
    for _ in 0..len / chunk.len() {
        f.write_all(&chunk).unwrap();
    }
    drop(f);
    let file = File::open(&path).unwrap();
    let lease = take(&file).unwrap();
    let map = FileMap::leased(&file, len, lease, &guard(0..len as u64))
        .unwrap()
        .unwrap();
    crate::populate::populate_read(map.as_ptr(), len).unwrap();
    crate::populate::touch(map.as_ptr(), len).unwrap();
    let started = Instant::now();
    drop(open_writer(&path));
    let held = started.elapsed();
    assert_eq!(map.protection(), Protection::Moved);
    println!(
        "moved {gib} GiB in {held:?}: {:.2} GB/s",
        len as f64 / held.as_secs_f64() / 1e9
    );
}
