//! Profiles that cannot be used: `tune` does not overwrite them without `--force`,
//! `profile show` says so, bad values are refused, and an empty `FASTENSOR_PROFILE` means no profile.

mod common;

use common::{assert_says, fastensor, run, text};
use std::path::Path;
use std::process::{Command, Output};

fn tune(dir: &Path, profile: &Path, force: bool) -> Output {
    let mut c = fastensor();
    c.args(["tune", "--sizes", "4K", "--max-rounds", "1", "--dir"])
        .arg(dir)
        .arg("--profile")
        .arg(profile);
    if force {
        c.arg("--force");
    }
    c.output().unwrap()
}

/// A profile of this machine, as `tune` writes it.
fn good_profile(dir: &Path) -> String {
    let p = dir.join("good.toml");
    let out = tune(dir, &p, false);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn tune_does_not_overwrite_what_is_no_usable_profile_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_profile(dir.path());
    let kernel = good
        .lines()
        .find(|l| l.starts_with("kernel = "))
        .unwrap()
        .to_string();
    let cases = [
        ("corrupt", "this is not toml [".to_string()),
        (
            "notes",
            "# my notes\ntitle = \"not a profile\"\n".to_string(),
        ),
        ("future", good.replace("version = 1", "version = 99")),
        (
            "elsewhere",
            good.replace(&kernel, "kernel = \"0.0.1-another-machine\""),
        ),
    ];
    for (name, content) in &cases {
        let p = dir.path().join(format!("{name}.toml"));
        std::fs::write(&p, content).unwrap();
        let out = tune(dir.path(), &p, false);
        assert_says(&out, false, "--force", name);
        assert_eq!(&std::fs::read_to_string(&p).unwrap(), content, "{name}");
        let out = tune(dir.path(), &p, true);
        assert_says(&out, true, ".bak", name);
        let bak = dir.path().join(format!("{name}.toml.bak"));
        assert_eq!(&std::fs::read_to_string(bak).unwrap(), content, "{name}");
        assert!(std::fs::read_to_string(&p)
            .unwrap()
            .contains("[fingerprint]"));
    }
    // A profile of this machine is replaced without --force.
    let p = dir.path().join("good.toml");
    assert!(tune(dir.path(), &p, false).status.success());
    // `profile show` of another machine's profile says it would not be used.
    let p = dir.path().join("other.toml");
    std::fs::write(
        &p,
        good.replace(&kernel, "kernel = \"0.0.1-another-machine\""),
    )
    .unwrap();
    let out = run("profile show", &[&p]);
    assert_says(&out, true, "would not use it", "another machine's profile");
}

#[test]
fn bad_values_in_a_profile_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_profile(dir.path());
    let first_context = good.find("[[context]]").unwrap();
    let second = good[first_context + 1..].find("[[context]]").unwrap() + first_context + 1;
    let one_context = &good[first_context..second];
    let cases = [
        (
            "nan",
            good.replacen("time_ns_per_byte = []", "time_ns_per_byte = [nan]", 1)
                .replacen("cpu_ns_per_byte = []", "cpu_ns_per_byte = [0.1]", 1),
        ),
        (
            "inf",
            good.replacen("time_ns_per_byte = []", "time_ns_per_byte = [inf]", 1)
                .replacen("cpu_ns_per_byte = []", "cpu_ns_per_byte = [0.1]", 1),
        ),
        (
            "objective",
            good.replace("objective = \"time\"", "objective = \"speed\""),
        ),
        ("twice", format!("{good}\n{one_context}")),
    ];
    for (name, content) in &cases {
        assert_ne!(content, &good, "{name}: the case changed nothing");
        let p = dir.path().join(format!("{name}.toml"));
        std::fs::write(&p, content).unwrap();
        let out = run("profile show", &[&p]);
        assert_says(&out, false, "not a valid fastensor dictionary", name);
    }
}

#[test]
fn an_empty_fastensor_profile_means_no_profile() {
    let home = tempfile::tempdir().unwrap();
    let out = fastensor()
        .args(["profile", "show"])
        .env("FASTENSOR_PROFILE", "")
        .env_remove("XDG_CACHE_HOME")
        .env("HOME", home.path())
        .output()
        .unwrap();
    // As for Python's default engine: set and empty, no profile is read or written.
    assert_says(&out, false, "no profile path", "empty");
    assert!(!home.path().join(".cache").exists());
}

#[test]
fn a_deeply_nested_profile_error_is_not_one_huge_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("deep.toml");
    std::fs::write(&p, format!("x = {}", "[".repeat(100_000))).unwrap();
    let err = common::failed(run("profile show", &[&p]));
    assert!(
        err.contains("not a valid fastensor dictionary"),
        "{}",
        &err[..err.len().min(500)]
    );
    let longest = err.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(longest <= 400, "a line of {longest} characters");
}

#[test]
fn tune_and_profile_show_refuse_a_fifo_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for force in [false, true] {
        let mut child = fastensor();
        child
            .args(["tune", "--sizes", "4K", "--max-rounds", "1", "--dir"])
            .arg(dir.path())
            .arg("--profile")
            .arg(&fifo);
        if force {
            child.arg("--force");
        }
        let out = run_briefly(child);
        assert_says(
            &out,
            false,
            "not a regular file",
            &format!("tune, force {force}"),
        );
    }
    let mut show = fastensor();
    show.args(["profile", "show"]).arg(&fifo);
    let out = run_briefly(show);
    assert_says(&out, false, "not a regular file", "profile show");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "a backup was made"
    );
}

/// Runs `cmd`, killing it if it takes over 20 s (a blocked open).
fn run_briefly(mut cmd: Command) -> Output {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("blocked on the FIFO");
        }
    }
}
