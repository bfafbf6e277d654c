//! Tests whose precondition this machine does not meet: they say so, never pass silently.
//!
//! A test that cannot run here (not root, no tmpfs, no GPU, ...) calls [`skip`], or the
//! [`skip!`](crate::skip!) macro, which also returns from the test. Either prints one line to
//! stderr, `SKIPPED <test name>: <reason>`, past the harness's output capture (so it shows in
//! a plain `cargo test`), the test name being the name of the thread the harness runs the
//! test on. A test that skips only a part (one case of several) calls [`skip`] and goes on
//! with the rest.
//!
//! Where every precondition is met (a CI runner that is root and mounts file systems, a
//! machine with a GPU), set `FASTENSOR_NO_SKIP=1`: a skip then panics, failing the test, so
//! a missing precondition there is a failure and never a silent pass. Some preconditions
//! exclude each other (the no-GPU checks of `fastensor-gds` cannot run where CUDA is
//! present), so set it only for the test binaries whose preconditions the runner provides.
//!
//! A precondition known when the test is written (a test that needs hardware no runner has)
//! is an `#[ignore = "reason"]` instead.
//!
//! [`Mount`] mounts the small file systems several tests need, or says why it cannot;
//! [`ok_or_skip!`](crate::ok_or_skip!) skips with that reason. [`if_unavailable`] reports a
//! conformance run whose backend was unavailable as a skip.

use std::fmt::Display;
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The environment variable that turns skips into failures when set to `1`.
pub const NO_SKIP_VAR: &str = "FASTENSOR_NO_SKIP";

/// Whether skips fail (`FASTENSOR_NO_SKIP=1`).
pub fn skips_fail() -> bool {
    std::env::var(NO_SKIP_VAR).is_ok_and(|v| v.trim() == "1")
}

/// The name of the running test: the harness names each test's thread after it.
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("<unnamed thread>")
        .to_string()
}

/// Reports that the running test (or a part of it) cannot run here because of `reason`:
/// prints `SKIPPED <test name>: <reason>` to stderr, or panics with that line when
/// `FASTENSOR_NO_SKIP=1`. The caller goes on (with the parts it can run) or returns.
#[track_caller]
pub fn skip(reason: impl Display) {
    let line = format!("SKIPPED {}: {reason}", current_test());
    if skips_fail() {
        panic!("{line} ({NO_SKIP_VAR}=1: a skip is a failure)");
    }
    // Straight to the stream, past the harness's capture of `eprintln!`: a skip shows in a
    // plain `cargo test` run, not only under `--nocapture`.
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Skips the rest of the running test: calls [`skip`](crate::skip::skip) with the
/// `format!`-style reason, then returns from the enclosing function (a test returning `()`).
/// As an expression it diverges, so it serves as the `else` of a `let ... else`.
///
/// ```no_run
/// # fn root() -> bool { false }
/// #[test]
/// fn needs_root() {
///     if !root() {
///         fastensor_testkit::skip!("needs root (mounts a file system)");
///     }
///     // ...
/// }
/// ```
#[macro_export]
macro_rules! skip {
    ($($reason:tt)+) => {{
        $crate::skip::skip(::std::format_args!($($reason)+));
        return
    }};
}

/// Reports a conformance run that skipped its backend as unavailable
/// ([`Report::skipped`](crate::conformance::Report::skipped)) as a [`skip`] of the running
/// test; does nothing when the suite ran.
#[track_caller]
pub fn if_unavailable(report: &crate::conformance::Report) {
    if let Some(reason) = &report.skipped {
        skip(format_args!(
            "backend `{}` unavailable: {reason}",
            report.backend
        ));
    }
}

/// The value of a `Result<T, E: Display>`'s `Ok`, or [`skip!`](crate::skip!) with its `Err`
/// as the reason, e.g. `let m = ok_or_skip!(Mount::new("tmpfs", "size=1m"));`.
#[macro_export]
macro_rules! ok_or_skip {
    ($result:expr) => {
        match $result {
            ::std::result::Result::Ok(value) => value,
            ::std::result::Result::Err(why) => $crate::skip!("{}", why),
        }
    };
}

/// Whether this process runs as root (effective user id 0), read from `/proc/self/status`.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// A file system mounted on a fresh temporary directory for a test; unmounted when dropped.
#[derive(Debug)]
pub struct Mount {
    dir: tempfile::TempDir,
}

impl Mount {
    /// Mounts a file system of type `fstype` with `options` (as `mount -t fstype -o options`),
    /// e.g. `Mount::new("tmpfs", "size=2m")`. `Err` says why it cannot be mounted here
    /// (typically: not root), to be given to [`skip`].
    pub fn new(fstype: &str, options: &str) -> Result<Mount, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
        let out = Command::new("mount")
            .args(["-t", fstype, "-o", options, "none"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let why = stderr.lines().next().unwrap_or("").trim();
            let root = if is_root() { "" } else { " (needs root)" };
            return Err(format!(
                "cannot mount {fstype} -o {options} here{root}: {why}"
            ));
        }
        Ok(Mount { dir })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Before the directory itself is removed (the field drops after this).
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_name_is_the_harness_thread_name() {
        assert!(current_test().ends_with("the_test_name_is_the_harness_thread_name"));
    }

    #[test]
    fn an_unknown_file_system_type_is_an_error_naming_it() {
        let err = Mount::new("no-such-fs-type", "size=1m").unwrap_err();
        assert!(err.contains("no-such-fs-type"), "{err}");
    }
}
