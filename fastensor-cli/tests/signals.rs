//! SIGINT and SIGTERM during `bench`, `tune` and `ckpt bench`: the scratch files go, and the
//! process ends with the status the signal gives (130 for SIGINT, 143 for SIGTERM).

mod common;

use common::{fastensor, names};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `fastensor args` in `dir`, waits until `started` says its scratch is there (or
/// `wait` has passed), sends `signal`, and returns what is left in `dir`.
fn interrupt(
    dir: &Path,
    args: &[&str],
    signal: &str,
    started: impl Fn(&[String], u32) -> bool,
) -> Vec<String> {
    let mut child = fastensor()
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !started(&names(dir), child.id()) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{args:?}: no scratch file appeared"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{args:?} ended before the signal: {status}");
        }
        // A poll of the condition above, bounded by the deadline: the signal goes only once
        // it holds, however long that takes.
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let status = child.wait().unwrap();
    let (num, code) = match signal {
        "INT" => (2, 130),
        _ => (15, 143),
    };
    assert!(
        status.signal() == Some(num) || status.code() == Some(code),
        "{args:?}: ended with {status} after SIG{signal}"
    );
    names(dir)
}

/// Whether process `pid` has a file in `dir` open (a file with no name included).
fn holds_file_in(pid: u32, dir: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.parent() == Some(dir)))
}

#[test]
fn bench_removes_its_directory_on_sigint_and_sigterm() {
    for signal in ["INT", "TERM"] {
        let dir = tempfile::tempdir().unwrap();
        let left = interrupt(
            dir.path(),
            &[
                "bench",
                "--sizes",
                "8M",
                "--repeat",
                "50",
                "--warmup",
                "0",
                "--backends",
                "posix",
                "--random-reads",
                "0",
                "--direction",
                "write",
            ],
            signal,
            |n, _| {
                n.iter().any(|d| {
                    d.starts_with("fastensor-bench-")
                        && std::fs::read_dir(dir.path().join(d))
                            .is_ok_and(|mut r| r.next().is_some())
                })
            },
        );
        assert!(left.is_empty(), "SIG{signal} left {left:?}");
    }
}

#[test]
fn ckpt_bench_removes_its_files_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let left = interrupt(
        dir.path(),
        &["ckpt", "bench", "--scale", "0.05", "--rounds", "20"],
        "TERM",
        |n, _| n.iter().any(|f| f.starts_with("ckpt_bench.")),
    );
    assert!(left.is_empty(), "SIGTERM left {left:?}");
}

#[test]
fn tune_leaves_no_scratch_file_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.toml");
    let left = interrupt(
        dir.path(),
        &[
            "tune",
            "--sizes",
            "16M",
            "--max-rounds",
            "1000",
            "--profile",
            profile.to_str().unwrap(),
        ],
        "INT",
        // Once the process holds a file of the directory open (the scratch file, named or
        // not).
        |_, pid| holds_file_in(pid, dir.path()),
    );
    assert!(left.is_empty(), "SIGINT left {left:?}");
}
