//! What saves and loads guarantee to careless and hostile callers: special files are never
//! replaced nor block a read, modes survive a save, nothing is left behind, and a header's
//! memory stays bounded. Saves through symbolic links: `tests/save_symlinks.rs`.

mod support;

use fastensor::checkpoint::{self, TensorView};
use fastensor::posix::PosixBackend;
use fastensor::{DType, Engine, ErrorKind, TensorDesc};
use fastensor_testkit::ok_or_skip;
use fastensor_testkit::skip::{is_root, skip, Mount};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{names_in, save_small};

fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(st.success(), "mkfifo failed");
}

#[test]
fn a_save_refuses_a_fifo_a_directory_and_a_device() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let mut targets = vec![fifo.clone(), sub.clone()];
    let dev = dir.path().join("null");
    if is_root() {
        let st = Command::new("mknod")
            .arg(&dev)
            .args(["c", "1", "3"])
            .status()
            .unwrap();
        if st.success() {
            targets.push(dev.clone());
        } else {
            skip("the character device case: mknod failed");
        }
    } else {
        skip("the character device case: needs root (mknod)");
    }
    for t in &targets {
        let err = save_small(t, 1).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let msg = err.to_string();
        assert!(msg.contains("not a regular file"), "{msg}");
        assert!(msg.contains(&*t.to_string_lossy()), "{msg}");
        // The profile and report saves go through the same helper.
        assert!(fastensor::atomic::write(t, b"x").is_err());
    }
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(std::fs::metadata(&sub).unwrap().is_dir());
    if targets.contains(&dev) {
        assert!(std::fs::metadata(&dev)
            .unwrap()
            .file_type()
            .is_char_device());
    }
    let mut expected: Vec<String> = targets
        .iter()
        .map(|t| t.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    expected.sort();
    assert_eq!(names_in(dir.path()), expected, "something was left behind");
}

#[test]
fn a_replaced_file_keeps_its_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    save_small(&path, 1).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    save_small(&path, 2).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
    // Profiles too.
    let profile = dir.path().join("p.toml");
    std::fs::write(&profile, "x").unwrap();
    std::fs::set_permissions(&profile, std::fs::Permissions::from_mode(0o640)).unwrap();
    fastensor::atomic::write(&profile, b"y").unwrap();
    assert_eq!(std::fs::read(&profile).unwrap(), b"y");
    assert_eq!(std::fs::metadata(&profile).unwrap().mode() & 0o7777, 0o640);
}

/// A user that is not root, and its group.
const NOBODY: u32 = 65534;

#[test]
fn a_save_as_root_never_gives_the_file_to_the_user_who_owned_the_one_it_replaces() {
    if !is_root() {
        skip("the owner rule: needs root (files owned by another user)");
        return;
    }
    // A sticky directory anyone may write, as /tmp.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    for (mode, kept) in [
        (0o640, 0o640),
        (0o1604, 0o1604),
        // Set-user-ID is another user's to give: dropped; set-group-ID stays with the group.
        (0o4755, 0o755),
        (0o6750, 0o2750),
    ] {
        let path = dir.path().join("m.safetensors");
        save_small(&path, 1).unwrap();
        std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        save_small(&path, 2).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (0, NOBODY),
            "{mode:o}: root's, its group kept"
        );
        assert_eq!(meta.mode() & 0o7777, kept, "{mode:o}");
        std::fs::remove_file(&path).unwrap();
    }
    // Profiles and reports go through the same helper.
    let profile = dir.path().join("p.toml");
    std::fs::write(&profile, "x").unwrap();
    std::os::unix::fs::chown(&profile, Some(NOBODY), Some(NOBODY)).unwrap();
    fastensor::atomic::write(&profile, b"y").unwrap();
    assert_eq!(std::fs::metadata(&profile).unwrap().uid(), 0);
}

#[test]
fn a_save_by_a_user_keeps_the_group_only_where_the_user_is_a_member() {
    if !is_root() {
        skip("the group rule: needs root (to become another user)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join("m.safetensors");
    save_small(&path, 1).unwrap(); // root's, group root
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
    // A child process as `nobody` saves over it (a save takes no lock a fork would hold).
    // SAFETY: the child only calls async-signal-safe functions and the save (which opens,
    // writes, renames and exits), then `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain system calls in the child.
        let ok = unsafe { libc::setgid(NOBODY) == 0 && libc::setuid(NOBODY) == 0 };
        let saved = ok && fastensor::atomic::write(&path, b"theirs").is_ok();
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(if saved { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child made above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status}"
    );
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"theirs");
    assert_eq!(
        (meta.uid(), meta.gid()),
        (NOBODY, NOBODY),
        "not a member of root's group"
    );
    assert_eq!(meta.mode() & 0o7777, 0o664);
}

#[test]
fn a_save_removes_the_temporaries_dead_processes_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    // A process that is gone.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = dir.path().join(format!(".c.safetensors.tmp.{dead}.0"));
    std::fs::write(&stale, vec![0u8; 4096]).unwrap();
    // One of a live process (this one) and one of another target stay.
    let live = dir
        .path()
        .join(format!(".c.safetensors.tmp.{}.999", std::process::id()));
    std::fs::write(&live, b"").unwrap();
    let other = dir.path().join(format!(".d.safetensors.tmp.{dead}.0"));
    std::fs::write(&other, b"").unwrap();
    save_small(&path, 1).unwrap();
    assert!(!stale.exists(), "a dead process's temporary was left");
    assert!(live.exists() && other.exists());
    std::fs::remove_file(&live).unwrap();
    std::fs::remove_file(&other).unwrap();
    assert_eq!(names_in(dir.path()), ["c.safetensors"]);
}

#[test]
fn a_save_leaves_no_temporary_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.safetensors");
    let data = [0u8; 10];
    // Wrong byte length: refused before anything is written.
    let bad = [TensorView::new(
        TensorDesc::new("w", DType::F32, [3]),
        &data[..],
    )];
    assert!(checkpoint::save(&PosixBackend, &path, &bad).is_err());
    assert!(names_in(dir.path()).is_empty());
}

/// Reads of a FIFO or a device are refused at once, saying what the file is.
#[test]
fn reads_refuse_a_fifo_and_a_device_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let (tx, rx) = std::sync::mpsc::channel();
    let f = fifo.clone();
    std::thread::spawn(move || {
        let engine = Engine::new().unwrap();
        let results = [
            checkpoint::inspect(&f).map(|_| ()),
            checkpoint::load(&PosixBackend, &f).map(|_| ()),
            checkpoint::load(&engine, &f).map(|_| ()),
            checkpoint::load(&engine, Path::new("/dev/zero")).map(|_| ()),
            checkpoint::inspect(Path::new("/dev/zero")).map(|_| ()),
        ];
        let _ = tx.send(results.map(|r| r.unwrap_err().to_string()));
    });
    let start = Instant::now();
    let msgs = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a read of a FIFO blocked");
    assert!(start.elapsed() < Duration::from_secs(20));
    for (i, m) in msgs.iter().enumerate() {
        assert!(m.contains("not a regular file"), "{i}: {m}");
    }
    assert!(msgs[0].contains("FIFO") && msgs[3].contains("character device"));
}

#[test]
fn an_offload_store_on_a_full_disk_keeps_the_os_cause() {
    use fastensor::offload::{OffloadConfig, OffloadStore};
    let fs = ok_or_skip!(Mount::new("tmpfs", "size=2m"));
    let engine = Engine::new().unwrap();
    let config = OffloadConfig::new(fs.path(), 1 << 20).small_threshold(0);
    let store = OffloadStore::new(&engine, config).unwrap();
    let mut handles = Vec::new();
    let mut failed = None;
    for i in 0..32 {
        let buf = fastensor::HostBuffer::from_slice(&vec![i as u8; 256 << 10]).unwrap();
        match store.put(buf, format!("t{i}")) {
            Ok(h) => handles.push(h),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    store.flush();
    let err = failed.unwrap_or_else(|| {
        handles
            .iter()
            .find_map(|h| store.get(h).err())
            .expect("8 MiB fitted in a 2 MiB file system")
    });
    assert_eq!(err.kind(), ErrorKind::StorageFull, "{err}");
    assert_eq!(err.raw_os_error(), Some(28), "the OS cause was lost: {err}");
    assert!(err.to_string().contains("No space left on device"), "{err}");
}

#[test]
fn a_profile_save_on_a_full_disk_keeps_the_old_file_and_says_so() {
    let fs = ok_or_skip!(Mount::new("tmpfs", "size=1m"));
    let path = fs.path().join("profile.toml");
    std::fs::write(&path, b"old").unwrap();
    let err = fastensor::atomic::write(&path, &vec![b'x'; 2 << 20]).unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.kind(), ErrorKind::StorageFull, "{msg}");
    assert!(msg.contains("no space left on device"), "{msg}");
    assert!(msg.contains(&*path.to_string_lossy()), "{msg}");
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    assert_eq!(names_in(fs.path()), ["profile.toml"]);
}

/// Peak RSS of this process so far (`VmHWM`), in MB.
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

/// `checkpoint::load` through the engine of a hostile 12 MB header, in a child process (this
/// test run again) whose peak RSS is at most 4 times the header plus 40 MB.
#[test]
fn a_load_of_a_hostile_header_stays_within_4x_its_size() {
    const CHILD: &str = "FASTENSOR_TEST_LOAD_RSS";
    if let Some(path) = std::env::var_os(CHILD) {
        let engine = Engine::new().unwrap();
        let before = peak_rss_mb();
        let ckpt = checkpoint::load(&engine, Path::new(&path)).unwrap();
        assert!(ckpt.len() > 1000);
        println!("PEAK {before:.1} {:.1}", peak_rss_mb());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.safetensors");
    let header_mb = fastensor_testkit::data::hostile_header(&path, 12.0, 64) as f64 / 1e6;
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_load_of_a_hostile_header_stays_within_4x_its_size",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, &path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The harness may print the test's name on the same line.
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("PEAK ").map(|(_, v)| v))
        .unwrap_or_else(|| panic!("no peak printed: {stdout}"));
    let (start, peak): (f64, f64) = {
        let mut v = line.split(' ').map(|x| x.parse::<f64>().unwrap());
        (v.next().unwrap(), v.next().unwrap())
    };
    let bound = 4.0 * header_mb + 40.0;
    println!(
        "load: header {header_mb:.1} MB, peak RSS {peak:.0} MB (before the load {start:.0} MB, \
         bound {bound:.0} MB)"
    );
    assert!(peak <= bound, "load peaked at {peak:.0} MB");
}
