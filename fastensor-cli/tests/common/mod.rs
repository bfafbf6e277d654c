//! What the tests of the `fastensor` command share (`mod common;` in each test file): running
//! the command as a user runs it, and reading what it printed and left behind. Each test file
//! uses some of these.
#![allow(dead_code, unused_imports)]

use std::path::Path;
use std::process::{Command, Output};

#[path = "../../../tests/support/dir.rs"]
mod dir;

/// The names in a directory, sorted.
pub use dir::names_in as names;

/// The `fastensor` command, without a `FASTENSOR_PROFILE` of the caller's environment.
pub fn fastensor() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fastensor"));
    c.env_remove("FASTENSOR_PROFILE");
    c
}

/// Runs `fastensor` with the whitespace-separated `words`, then `paths`, to its end.
pub fn run(words: &str, paths: &[&Path]) -> Output {
    fastensor()
        .args(words.split_whitespace())
        .args(paths)
        .output()
        .unwrap()
}

/// Its standard output, after asserting it succeeded (failing with both outputs).
pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Its standard error, after asserting it failed (failing with its standard output).
pub fn failed(out: Output) -> String {
    assert!(
        !out.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr(&out)
}

/// Asserts that it succeeded when `success` (failed when not) and that its output, standard
/// output then standard error, says `what`; a failure names `case` and shows the output.
pub fn assert_says(out: &Output, success: bool, what: &str, case: &str) {
    let text = text(out);
    let outcome = if success { "failed" } else { "succeeded" };
    assert_eq!(out.status.success(), success, "{case}: {outcome}: {text}");
    assert!(text.contains(what), "{case}: `{what}` not said: {text}");
}

/// Its standard error.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Its standard output, then its standard error.
pub fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &stderr(out)
}
