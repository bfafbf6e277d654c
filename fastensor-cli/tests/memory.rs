//! Peak memory of `ckpt inspect` and `ckpt copy` on hostile but legal headers: at most 4 times
//! the header's length plus a constant, measured as the child process's peak RSS.

mod common;

use common::{failed, fastensor, run};
use fastensor_testkit::data::hostile_header;

/// The constant of the bound: the process itself, the copy's staging buffers.
const CONSTANT_MB: f64 = 40.0;

/// Runs `fastensor args...`; returns its exit status's success and its peak RSS in MB.
fn peak_rss_mb(args: &[&std::ffi::OsStr]) -> (bool, f64) {
    let child = fastensor()
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not waited for yet (`child` is never waited on; dropping a
    // `Child` does not wait); `status` and `usage` are valid for writes.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4 failed");
    drop(child);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (ok, usage.ru_maxrss as f64 / 1024.0)
}

#[test]
fn inspect_and_copy_of_a_hostile_header_stay_within_4x_its_size() {
    let dir = tempfile::tempdir().unwrap();
    // 64 dimensions (the most a shape may have) of 8 bytes each for 2 bytes of JSON, and
    // tiny tensors (about 60 bytes of JSON each).
    for (rank, label) in [(64, "64-dim shapes"), (1, "tiny tensors")] {
        let src = dir.path().join(format!("h{rank}.safetensors"));
        let dst = dir.path().join(format!("c{rank}.safetensors"));
        let header = hostile_header(&src, 12.0, rank);
        let header_mb = header as f64 / 1e6;
        let bound = 4.0 * header_mb + CONSTANT_MB;
        let (ok, inspect) = peak_rss_mb(&["ckpt".as_ref(), "inspect".as_ref(), src.as_os_str()]);
        assert!(ok, "inspect failed");
        let (ok, copy) = peak_rss_mb(&[
            "ckpt".as_ref(),
            "copy".as_ref(),
            src.as_os_str(),
            dst.as_os_str(),
        ]);
        assert!(ok, "copy failed");
        println!(
            "{label}: header {header_mb:.1} MB, peak RSS inspect {inspect:.0} MB, copy \
             {copy:.0} MB (bound {bound:.0} MB)"
        );
        assert!(
            inspect <= bound,
            "{label}: inspect peaked at {inspect:.0} MB"
        );
        assert!(copy <= bound, "{label}: copy peaked at {copy:.0} MB");
        std::fs::remove_file(&dst).unwrap();
    }
}

#[test]
fn a_shape_of_more_than_64_dimensions_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("deep.safetensors");
    hostile_header(&src, 0.001, 65);
    let err = failed(run("ckpt inspect", &[&src]));
    assert!(err.contains("more than 64 dimensions"), "{err}");
}
