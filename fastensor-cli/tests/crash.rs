//! Crash safety of `ckpt copy` over an existing checkpoint: SIGKILL at random points, and a
//! full disk. The destination is always the old or the new checkpoint, whole, and nothing
//! else is left in its directory.

mod common;

use common::{failed, fastensor, names, ok, run};
use fastensor_testkit::ok_or_skip;
use fastensor_testkit::skip::Mount;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A safetensors file of `tensors` tensors of `each` bytes, filled from `seed`.
fn checkpoint(path: &Path, tensors: usize, each: usize, seed: u8) {
    let mut json = String::from("{");
    for i in 0..tensors {
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            "\"t{i}\":{{\"dtype\":\"U8\",\"shape\":[{each}],\"data_offsets\":[{},{}]}}",
            i * each,
            (i + 1) * each
        ));
    }
    json.push('}');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&(json.len() as u64).to_le_bytes()).unwrap();
    f.write_all(json.as_bytes()).unwrap();
    let data: Vec<u8> = (0..tensors * each)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect();
    f.write_all(&data).unwrap();
    f.flush().unwrap();
}

/// Runs `fastensor ckpt copy src dst` to completion; fails the test if it fails.
fn copy(src: &Path, dst: &Path) {
    ok(run("ckpt copy", &[src, dst]));
}

#[test]
fn sigkill_during_copy_leaves_the_old_or_the_new_checkpoint_and_nothing_else() {
    let src_dir = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("a.safetensors");
    let dst = dir.path().join("dst.safetensors");
    checkpoint(&src, 16, 1 << 20, 1);
    // The new checkpoint as a copy writes it, and the old one it replaces.
    let t0 = Instant::now();
    copy(&src, &dst);
    let copy_time = t0.elapsed();
    let new = std::fs::read(&dst).unwrap();
    checkpoint(&dst, 4, 1 << 20, 2);
    let old = std::fs::read(&dst).unwrap();
    let mut seed = std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    let (mut saw_old, mut saw_new, mut stale) = (0, 0, 0);
    let mut killed: Vec<String> = Vec::new();
    for round in 0..20 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // From the start of the process to a little past a whole copy.
        let delay =
            Duration::from_micros((seed >> 33) % (copy_time.as_micros() as u64 * 5 / 4 + 1));
        let mut child = fastensor()
            .args(["ckpt", "copy"])
            .arg(&src)
            .arg(&dst)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The delay is the scenario, not an ordering: the kill lands wherever the copy has got
        // to (not started, mid-write, renamed, done), and every outcome is checked below.
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        child.wait().unwrap();
        let now = std::fs::read(&dst).unwrap();
        if now == old {
            saw_old += 1;
        } else if now == new {
            saw_new += 1;
            std::fs::write(&dst, &old).unwrap();
        } else {
            panic!("round {round}: killed after {delay:?}, the destination is neither checkpoint");
        }
        // The one name a kill may leave: the new file's, linked for the instant before its
        // rename, of a killed process (a later save removes it, checked below).
        killed.push(format!(".dst.safetensors.tmp.{}.", child.id()));
        for name in names(dir.path()) {
            if name != "dst.safetensors" {
                assert!(
                    killed.iter().any(|k| name.starts_with(k.as_str())),
                    "round {round}: killed after {delay:?}, {name} was left behind"
                );
                stale += 1;
            }
        }
    }
    // A save removes what killed saves of the same file left.
    copy(&src, &dst);
    assert_eq!(
        names(dir.path()),
        ["dst.safetensors"],
        "a save left a stale temporary"
    );
    println!(
        "20 kills (a copy takes {copy_time:?}): old {saw_old}, new {saw_new}, stale temporaries {stale}"
    );
}

#[test]
fn a_full_disk_keeps_the_old_checkpoint_and_says_so() {
    let mnt = ok_or_skip!(Mount::new("tmpfs", "size=12m"));
    let src_dir = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("big.safetensors");
    checkpoint(&src, 8, 1 << 20, 3);
    let dst = mnt.path().join("model.safetensors");
    checkpoint(&dst, 4, 1 << 20, 4);
    let old = std::fs::read(&dst).unwrap();
    let err = failed(run("ckpt copy", &[&src, &dst]));
    assert!(err.contains("no space left on device"), "{err}");
    assert!(
        err.contains(&*dst.to_string_lossy()),
        "the error does not name the destination: {err}"
    );
    assert!(
        std::fs::read(&dst).unwrap() == old,
        "the old checkpoint was damaged"
    );
    assert_eq!(
        names(mnt.path()),
        ["model.safetensors"],
        "something was left behind"
    );
    println!("full disk: {}", err.trim());
}
