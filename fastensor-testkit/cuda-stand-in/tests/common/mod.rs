//! Shared by the stand-in tests: whether the CUDA stand-in is the driver the loader found,
//! its counters, test data, and scenarios run in a child process of their own (the driver
//! is initialised once per process, and the stand-in reads its fault variables at start).
#![allow(dead_code)]

use fastensor_core::{Error, ErrorKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The variable that tells a child which scenario to run.
const SCENARIO: &str = "FASTENSOR_STAND_IN_SCENARIO";
/// How long a scenario may run before it counts as hung.
const HANG: Duration = Duration::from_secs(120);

/// True when the CUDA driver this process loaded is the stand-in. When it is not: a failure
/// if `FASTENSOR_REQUIRE` names `gds` or `cuda-staged` (the stand-in run asked for it),
/// else a printed skip.
pub fn stand_in_loaded() -> bool {
    let gpus = fastensor_gds::gpus();
    if gpus.contains("CUDA stand-in") {
        return true;
    }
    let required = fastensor_testkit::conformance::required("gds")
        || fastensor_testkit::conformance::required("cuda-staged");
    assert!(
        !required,
        "FASTENSOR_REQUIRE asks for the CUDA backends but the loader did not find the CUDA \
         stand-in ({gpus}); run through fastensor-testkit/cuda-stand-in/run"
    );
    eprintln!("SKIPPED: the CUDA stand-in is not on the loader path ({gpus})");
    false
}

/// The stand-in's counters (`fastensor_stand_in_stats`).
pub fn stats() -> BTreeMap<String, i64> {
    // SAFETY: the library is already loaded (by the CUDA backends); loading it again only
    // takes a reference, and its initialisers already ran.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }.expect("libcuda.so.1");
    type Stats = unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> usize;
    // SAFETY: the stand-in exports this function with this signature.
    let f = unsafe { lib.get::<Stats>(b"fastensor_stand_in_stats") }.expect("not the stand-in");
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: buf is writable for its length.
        let n = unsafe { f(buf.as_mut_ptr().cast(), buf.len()) };
        if n < buf.len() {
            buf.truncate(n);
            break;
        }
        buf.resize(n + 1, 0);
    }
    String::from_utf8(buf)
        .expect("utf-8")
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(0)))
        .collect()
}

/// One counter (0 when never set).
pub fn stat(name: &str) -> i64 {
    stats().get(name).copied().unwrap_or(0)
}

/// No contract violated, no unimplemented call, and nothing live: no pinned buffer, device
/// buffer, stream, event, cuFile handle, registered buffer or batch.
pub fn assert_clean(what: &str) {
    let s = stats();
    let get = |k: &str| s.get(k).copied().unwrap_or(0);
    let bad: Vec<String> = s
        .iter()
        .filter(|(k, &v)| {
            v != 0
                && (k.starts_with("violation")
                    || k.starts_with("unimplemented")
                    || (k.starts_with("live.") && *k != "live.primary_context_retains"))
        })
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    assert!(
        bad.is_empty() && get("config_errors") == 0,
        "{what}: the stand-in reports {bad:?}"
    );
}

/// `len` deterministic pseudo-random bytes.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    fastensor_testkit::data::bytes(len, seed)
}

/// A file `name` holding [`bytes`]`(len, seed)` in a new temporary folder: the folder (the
/// file is removed with it), the file's path and its bytes.
pub fn data_file(name: &str, len: usize, seed: u64) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let content = bytes(len, seed);
    std::fs::write(&path, &content).unwrap();
    (dir, path, content)
}

/// A scenario: in the test process it runs `name` (the test's own name) again as a child
/// with `env` set, waits for it (a child still running after two minutes is a hang, and
/// fails), and asserts it passed; in that child it runs `body`. The child loads a copy of
/// the stand-in in which the exported symbols `missing` cannot be found (see
/// [`library_without`]); with none missing, the stand-in itself. The child's counters stay
/// out of the run's audit (a scenario may break the contract on purpose and check that the
/// stand-in saw it).
pub fn scenario(name: &str, env: &[(&str, &str)], missing: &[&str], body: impl FnOnce()) {
    if std::env::var(SCENARIO).is_ok_and(|s| s == name) {
        body();
        return;
    }
    if !stand_in_loaded() {
        return;
    }
    let lib = (!missing.is_empty()).then(|| library_without(missing));
    let out = run_child(name, env, lib.as_ref().map(|l| l.path()));
    eprintln!("{}", out.text);
    assert!(
        out.status.success(),
        "scenario {name} failed ({}):\n{}",
        out.status,
        out.text
    );
}

/// Declares test `$name`: [`scenario`] `$name`, with the variables `$env` (an array
/// of name and value pairs) set in the child and the stand-in's exported symbols `$missing`
/// (an array; none when left out) hidden from it; the child runs `$body` (a closure).
macro_rules! scenario_test {
    ($name:ident, $env:expr, $body:expr $(,)?) => {
        scenario_test!($name, $env, [], $body);
    };
    ($name:ident, $env:expr, $missing:expr, $body:expr $(,)?) => {
        #[test]
        fn $name() {
            $crate::common::scenario(stringify!($name), &$env, &$missing, $body);
        }
    };
}

/// What a child printed and how it ended.
pub struct ChildOutput {
    pub status: std::process::ExitStatus,
    pub text: String,
}

/// Runs test `name` of this binary as a child with `env`, and `LD_LIBRARY_PATH` replaced by
/// `lib_dir` when given.
pub fn run_child(name: &str, env: &[(&str, &str)], lib_dir: Option<&Path>) -> ChildOutput {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(SCENARIO, name)
        .env_remove("FASTENSOR_STAND_IN_STATS")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(dir) = lib_dir {
        cmd.env("LD_LIBRARY_PATH", dir);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("out.txt");
    let file = std::fs::File::create(&log).expect("log");
    cmd.stdout(file.try_clone().expect("dup")).stderr(file);
    let mut child = cmd.spawn().expect("spawn the test binary");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "scenario {name} hung for {HANG:?}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    ChildOutput {
        status,
        text: std::fs::read_to_string(&log).unwrap_or_default(),
    }
}

/// The stand-in library file the loader found (`libcuda.so.1` in `LD_LIBRARY_PATH`).
pub fn library_file() -> PathBuf {
    let path = std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("libcuda.so.1"))
        .find(|p| p.exists())
        .and_then(|p| p.canonicalize().ok())
        .expect("libcuda.so.1 in LD_LIBRARY_PATH")
}

/// A folder holding a copy of the stand-in under the driver's and cuFile's names, in which
/// the exported symbols `missing` cannot be found: what an older driver or cuFile looks like
/// to the dynamic loader. (Each name is overwritten in the copy's symbol tables.)
pub fn library_without(missing: &[&str]) -> tempfile::TempDir {
    let mut image = std::fs::read(library_file()).expect("read the stand-in");
    for name in missing {
        let mut from = vec![0u8];
        from.extend_from_slice(name.as_bytes());
        from.push(0);
        let mut to = from.clone();
        let last = to.len() - 2;
        to[last] = b'#'; // not a character a C symbol can have
        let mut hits = 0;
        let mut i = 0;
        while let Some(at) = image[i..].windows(from.len()).position(|w| w == from) {
            image[i + at..i + at + to.len()].copy_from_slice(&to);
            hits += 1;
            i += at + 1;
        }
        assert!(hits > 0, "{name} is not in the stand-in");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("libcuda-old.so");
    std::fs::write(&file, image).expect("write the copy");
    for name in [
        "libcuda.so.1",
        "libcuda.so",
        "libcufile.so.0",
        "libcufile.so",
    ] {
        std::os::unix::fs::symlink(&file, dir.path().join(name)).expect("symlink");
    }
    dir
}

/// Asserts `err` is of `kind`, names the file and says `words`; prints it.
pub fn assert_error(err: &Error, kind: ErrorKind, path: &Path, words: &str) {
    eprintln!("error as the user sees it: {err}");
    assert_eq!(err.kind(), kind, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&*path.to_string_lossy()),
        "no path in: {text}"
    );
    assert!(text.contains(words), "`{words}` not in: {text}");
}
