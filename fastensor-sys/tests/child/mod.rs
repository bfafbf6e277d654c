//! Forked children for the fork tests: [`fork`] one that runs a closure and leaves, and
//! [`wait`] for it with a deadline. Shared by `fastensor-sys/tests/fork.rs` and the root
//! crate's `tests/fork.rs`, which includes this file by path.

use std::time::Instant;

/// Forks a child that runs `work` and leaves with `_exit`, never returning into the test
/// harness: exit code 0 when `work` returns `Ok`, 1 when it returns `Err` (printed to
/// stderr), 2 when it panics.
pub fn fork(work: impl FnOnce() -> Result<(), String>) -> libc::pid_t {
    // SAFETY: fork has no memory-safety preconditions; the child runs only `work` and then
    // `_exit`, and never returns into the harness's code.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
            Ok(Ok(())) => 0,
            Ok(Err(msg)) => {
                eprintln!("child {}: {msg}", std::process::id());
                1
            }
            Err(_) => 2,
        };
        // SAFETY: ends the child at once, running no destructor or exit handler of the
        // parent's state.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Waits for the child `pid` until `deadline` and reaps it: its exit code, or `Err` when a
/// signal ended it or it had not exited by then (it is then killed).
///
/// Polls on the calling thread (`WNOHANG`), starting no thread: a thread of this process
/// that starts or exits while the next test forks holds the standard library's lock of
/// thread records, which then stays held in that child, whose own first thread would wait
/// for it forever (a hang of the test's making, not of the code under test).
pub fn wait(pid: libc::pid_t, deadline: Instant) -> Result<i32, String> {
    let hung = loop {
        // SAFETY: an all-zero `siginfo_t` is a valid value of the plain C struct.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is valid for writes; `pid` is a child of this process. `WNOWAIT`
        // leaves it unreaped (still this process's to kill) until the wait below.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
            )
        };
        if r != 0 {
            return Err(format!("waitid: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `waitid` filled `info`; `si_pid` is 0 while no child has changed state.
        if unsafe { info.si_pid() } != 0 {
            break false;
        }
        if Instant::now() >= deadline {
            // SAFETY: `pid` is this process's child, not yet reaped (only the wait below
            // reaps it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer; `pid` is a child of this process, exited or
    // killed.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    if r != pid {
        return Err(format!("waitpid: {}", std::io::Error::last_os_error()));
    }
    if hung {
        return Err(format!("child {pid} hung: killed"));
    }
    if !libc::WIFEXITED(status) {
        return Err(format!("child {pid} died (wait status {status:#x})"));
    }
    Ok(libc::WEXITSTATUS(status))
}
