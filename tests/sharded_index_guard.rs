//! A sharded checkpoint's index is opened as a checkpoint is: a FIFO, a device or a
//! directory in its place is refused at once with `ErrorKind::InvalidInput` naming it (never
//! a hang, never a read without end), and its length limit holds.

use fastensor::checkpoint::{self, sharded::INDEX_NAME};
use fastensor::posix::PosixBackend;
use fastensor::{Error, ErrorKind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

/// Opens the sharded checkpoint at `path` in a thread of its own; an open still blocked
/// after 10 s is a failure (the thread is left behind).
fn open_with_timeout(path: &Path) -> fastensor::Result<()> {
    let (tx, rx) = mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(checkpoint::open_sharded(&PosixBackend, &path).map(drop));
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("opening the sharded checkpoint hung")
}

fn assert_refused(e: &Error, index: &Path, what: &str) {
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("not a regular file"), "{msg}");
    assert!(msg.contains(what), "{msg}");
    assert_eq!(e.path(), Some(index), "{msg}");
}

fn index_in(dir: &Path) -> PathBuf {
    dir.join(INDEX_NAME)
}

#[test]
fn a_fifo_as_the_index_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let index = index_in(dir.path());
    let st = Command::new("mkfifo").arg(&index).status().unwrap();
    assert!(st.success(), "mkfifo failed");
    // Found in the directory, and named directly.
    for path in [dir.path(), index.as_path()] {
        let e = open_with_timeout(path).unwrap_err();
        assert_refused(&e, &index, "FIFO");
    }
}

#[test]
fn an_index_linked_to_dev_zero_or_a_directory_as_the_index_is_refused_unread() {
    /// What stands in the index's place, and how it is made.
    type Case = (&'static str, fn(&Path));
    let cases: [Case; 2] = [
        ("character device", |index| {
            std::os::unix::fs::symlink("/dev/zero", index).unwrap()
        }),
        ("directory", |index| std::fs::create_dir(index).unwrap()),
    ];
    for (what, make) in cases {
        let dir = tempfile::tempdir().unwrap();
        let index = index_in(dir.path());
        make(&index);
        let e = open_with_timeout(dir.path()).unwrap_err();
        assert_refused(&e, &index, what);
    }
}

#[test]
fn an_index_over_the_limit_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let index = index_in(dir.path());
    // Sparse: nothing is written.
    let f = std::fs::File::create(&index).unwrap();
    f.set_len((256 << 20) + 1).unwrap();
    let e = open_with_timeout(dir.path()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("over the limit"), "{e}");
}
