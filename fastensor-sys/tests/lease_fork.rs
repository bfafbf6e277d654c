//! A `fork` child keeps the memory it inherited from a leased mapping, through its own
//! lease (`lease::inherit`). In a test binary of its own: a child inherits every descriptor
//! of the process, those other tests hold open for writing included (which would refuse
//! their leases while the child lives).

use fastensor_sys::filemap::{FileMap, Protection};
use fastensor_sys::lease::{inherit, take};
use std::fs::File;
use std::io::Write;

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
fn guard(r: std::ops::Range<u64>) -> Vec<std::ops::Range<u64>> {
    vec![r]
}

fn open_writer(path: &std::path::Path) -> File {
    std::fs::OpenOptions::new().write(true).open(path).unwrap()
}

/// A pipe: its read end and its write end.
fn pipe() -> (i32, i32) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (fds[0], fds[1])
}

#[test]
fn a_fork_child_keeps_the_memory_it_inherited_through_a_truncation() {
    let (_dir, path) = file_of_pages(256);
    let file = File::open(&path).unwrap();
    let lease = take(&file).unwrap();
    let map = FileMap::leased(&file, 256 * 4096, lease, &guard(0..256 * 4096))
        .unwrap()
        .unwrap();
    let (go_r, go_w) = pipe();
    let (found_r, found_w) = pipe();
    inherit::prepare();
    // SAFETY: the child only reads the mapping, takes its leases (`inherit::in_child`,
    // which the module documents for a fork child) and writes one byte before `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: closes the parent's ends of the pipes in this process.
        unsafe {
            libc::close(go_w);
            libc::close(found_r);
        }
        inherit::in_child();
        let mut byte = [0u8];
        // SAFETY: reads one byte into `byte` from the pipe this process holds.
        unsafe { libc::read(go_r, byte.as_mut_ptr().cast(), 1) };
        let kept = (0..256).all(|i| map[i * 4096 + 100] == (i + 1) as u8);
        let moved = map.protection() == Protection::Moved;
        let answer = [u8::from(kept) | (u8::from(moved) << 1)];
        // SAFETY: writes one byte of `answer` to the pipe, then ends the child at once
        // (no destructor of the parent's state runs in it).
        unsafe {
            libc::write(found_w, answer.as_ptr().cast(), 1);
            libc::_exit(0)
        }
    }
    inherit::in_parent();
    // SAFETY: closes the child's ends of the pipes in this process (a child that dies then
    // ends the read below).
    unsafe {
        libc::close(go_r);
        libc::close(found_w);
    }
    // A writer cuts the file and rewrites it: held until both processes moved their memory.
    let w = open_writer(&path);
    w.set_len(0).unwrap();
    (&w).write_all(&[0xEE; 4096 * 4]).unwrap();
    assert_eq!(map.protection(), Protection::Moved);
    assert!((0..256).all(|i| map[i * 4096 + 100] == (i + 1) as u8));
    let mut answer = [0u8];
    // SAFETY: one byte to the child's pipe, then one byte back into `answer`; the wait
    // reaps the child this test made.
    let (got, status) = unsafe {
        libc::write(go_w, b"x".as_ptr().cast(), 1);
        let got = libc::read(found_r, answer.as_mut_ptr().cast(), 1);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        libc::close(go_w);
        libc::close(found_r);
        (got, status)
    };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child ended with status {status:#x} (a signal: its memory was cut)"
    );
    assert_eq!(got, 1);
    assert_eq!(
        answer[0] & 1,
        1,
        "the child's memory shows the file's new bytes"
    );
    assert_eq!(
        answer[0] & 2,
        2,
        "the child's memory is not counted as moved"
    );
}
