//! The thread that answers lease breaks, the leases it watches, and what it did.

use super::{fcntl_int, Entry, Outcome, Phase};
use crate::fork::ForkMutex;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::{Duration, Instant};

/// How long the thread waits for a signal before looking at every lease again, while
/// leases live: a break whose signal went missing (a full queue of realtime signals) is
/// answered this late, well within the lease-break time.
const RECHECK: Duration = Duration::from_secs(1);

/// The thread of this process that answers breaks, and the leases it watches.
#[derive(Debug, Default)]
struct Watcher {
    /// The process generation ([`crate::fork::generation`]) the thread belongs to.
    generation: u64,
    tid: libc::pid_t,
    thread: Option<ThreadId>,
    entries: Vec<Weak<Entry>>,
}

/// A `pthread_t`, to signal the thread.
#[derive(Debug, Clone, Copy)]
struct ThreadId(libc::pthread_t);

static WATCHER: ForkMutex<Watcher> = ForkMutex::lazy();

/// The signal lease breaks are sent as: `SIGRTMIN+8`.
pub(crate) fn signal() -> i32 {
    libc::SIGRTMIN() + 8
}

/// The thread id of this process's thread that answers breaks, started on first use (a
/// `fork` child starts its own).
pub(crate) fn thread() -> io::Result<libc::pid_t> {
    let generation = crate::fork::generation();
    let mut w = WATCHER.lock();
    if w.generation == generation && w.thread.is_some() {
        return Ok(w.tid);
    }
    let (tid, thread) = start()?;
    *w = Watcher {
        generation,
        tid,
        thread: Some(thread),
        entries: Vec::new(),
    };
    Ok(tid)
}

/// Watches `entry` from now on (the thread was started by [`thread`]).
pub(crate) fn register(entry: &Arc<Entry>) {
    let mut w = WATCHER.lock();
    w.entries.retain(|e| e.strong_count() > 0);
    let was_idle = w.entries.is_empty();
    w.entries.push(Arc::downgrade(entry));
    if let (true, Some(ThreadId(t))) = (was_idle, w.thread) {
        // Wakes the thread from its untimed wait, so that it looks again every `RECHECK`.
        // SAFETY: `t` is this process's live thread (the generation matched in `thread`,
        // and it never ends); the signal is blocked there and taken by its wait.
        unsafe { libc::pthread_kill(t, signal()) };
    }
}

/// Starts the thread; returns its thread id and `pthread_t` once it blocks the signal.
fn start() -> io::Result<(libc::pid_t, ThreadId)> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("fastensor-lease".into())
        .spawn(move || {
            let set = blocked();
            // SAFETY: `gettid` and `pthread_self` have no preconditions.
            let me = unsafe { (libc::gettid(), libc::pthread_self()) };
            if tx.send(me).is_err() {
                return;
            }
            run(&set);
        })?;
    let (tid, thread) = rx
        .recv()
        .map_err(|_| io::Error::other("the lease thread did not start"))?;
    Ok((tid, ThreadId(thread)))
}

/// Blocks, in the calling thread only, the break signal and `SIGIO` (what the kernel sends
/// instead when the queue of realtime signals is full, which must not end the process);
/// returns the set waited for: the break signal.
fn blocked() -> libc::sigset_t {
    // SAFETY: the sets are initialized by `sigemptyset` before use; `pthread_sigmask`
    // changes the calling thread's mask only.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, signal());
        libc::sigaddset(&mut block, libc::SIGIO);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, std::ptr::null_mut());
        let mut wait: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut wait);
        libc::sigaddset(&mut wait, signal());
        wait
    }
}

/// The thread's loop: waits for a signal (or, while leases live, at most [`RECHECK`]),
/// then answers every lease of this process being broken.
fn run(set: &libc::sigset_t) -> ! {
    loop {
        let live = {
            let mut w = WATCHER.lock();
            w.entries.retain(|e| e.strong_count() > 0);
            !w.entries.is_empty()
        };
        let timeout = libc::timespec {
            tv_sec: RECHECK.as_secs() as libc::time_t,
            tv_nsec: 0,
        };
        // SAFETY: `set` is an initialized signal set, `info` a writable `siginfo_t`, and
        // `timeout` a live `timespec` (or null: wait without a limit).
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let limit = if live {
                &timeout as *const libc::timespec
            } else {
                std::ptr::null()
            };
            libc::sigtimedwait(set, &mut info, limit);
        }
        let _ = std::panic::catch_unwind(answer_breaks);
    }
}

/// The live leases this process took (in a `fork` child: those it took or adopted since).
pub(crate) fn ours() -> Vec<Arc<Entry>> {
    let w = WATCHER.lock();
    if w.generation != crate::fork::generation() {
        return Vec::new(); // the parent's watcher: none of these is this process's
    }
    w.entries
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|e| e.ours())
        .collect()
}

/// Answers every lease of this process that is being broken.
fn answer_breaks() {
    for entry in ours() {
        answer(&entry);
    }
}

/// If `entry`'s lease is being broken: moves the memory it guards into anonymous memory,
/// then lets go of the lease (the writer goes on).
pub(crate) fn answer(entry: &Entry) {
    let mut state = entry.state();
    if state.phase != Phase::Held {
        return;
    }
    // `F_GETLEASE` gives the type the lease is being broken to (`F_UNLCK`), or
    // `F_UNLCK` once the kernel removed it after the lease-break time.
    if matches!(
        fcntl_int(entry.fd(), libc::F_GETLEASE, 0),
        Ok(libc::F_RDLCK)
    ) {
        return;
    }
    let started = Instant::now();
    let outcome = if state.guarded.is_empty() {
        Outcome::NothingGuarded
    } else {
        match super::anon::move_ranges(&state.guarded) {
            Ok(bytes) => {
                BYTES_MOVED.fetch_add(bytes, Ordering::Relaxed);
                let took = started.elapsed();
                super::budget::note_move(bytes, took.as_nanos() as u64);
                if took.as_secs() >= super::budget::break_time() {
                    // The kernel lets the writer go after the lease-break time from the
                    // break's start (before `started`): the last pieces may have been
                    // moved with the file's new bytes.
                    LATE.fetch_add(1, Ordering::Relaxed);
                    Outcome::MovedLate
                } else {
                    Outcome::Moved
                }
            }
            Err(_) => {
                FAILED.fetch_add(1, Ordering::Relaxed);
                Outcome::MoveFailed
            }
        }
    };
    let _ = fcntl_int(entry.fd(), libc::F_SETLEASE, libc::F_UNLCK);
    state.phase = Phase::Broken(outcome);
    state.guarded.clear();
    let took = started.elapsed().as_nanos() as u64;
    BREAKS.fetch_add(1, Ordering::Relaxed);
    NANOS.fetch_add(took, Ordering::Relaxed);
    LONGEST.fetch_max(took, Ordering::Relaxed);
}

static TAKEN: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static BREAKS: AtomicU64 = AtomicU64::new(0);
static BYTES_MOVED: AtomicU64 = AtomicU64::new(0);
static NANOS: AtomicU64 = AtomicU64::new(0);
static LONGEST: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static LATE: AtomicU64 = AtomicU64::new(0);
/// Leases this process adopted from its parent at its start, and memory it moved then
/// (counted in each child; see [`super::inherit`]).
static ADOPTED: AtomicU64 = AtomicU64::new(0);
static MOVED_AT_START: AtomicU64 = AtomicU64::new(0);

pub(crate) fn count_adopted() {
    ADOPTED.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn count_moved_at_start(bytes: u64) {
    MOVED_AT_START.fetch_add(bytes, Ordering::Relaxed);
}

pub(crate) fn count_taken() {
    TAKEN.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn count_refused() {
    REFUSED.fetch_add(1, Ordering::Relaxed);
}

/// What the leases of this process did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Leases taken.
    pub taken: u64,
    /// Leases refused by the kernel.
    pub refused: u64,
    /// Breaks answered.
    pub breaks: u64,
    /// Bytes moved into anonymous memory by those breaks.
    pub bytes_moved: u64,
    /// Time the breaks held their writers, in all, and the longest.
    pub seconds_held: f64,
    /// The longest a break held its writer.
    pub longest_held: f64,
    /// Breaks whose memory could not be moved (it stayed shared with the file).
    pub failed: u64,
    /// Breaks whose move ended after the lease-break time: the kernel may have let the
    /// writer go first (the memory is counted unprotected).
    pub late: u64,
    /// Leases taken for this process before the `fork` that made it, and made its own at
    /// its start ([`super::inherit`]; counted down the line of forks).
    pub adopted: u64,
    /// Bytes moved into anonymous memory at a `fork` child's start, where no lease could
    /// be taken for it.
    pub moved_at_start: u64,
}

/// What the leases of this process did so far (counted in the process that took them).
pub fn stats() -> Stats {
    let secs = |n: &AtomicU64| n.load(Ordering::Relaxed) as f64 * 1e-9;
    Stats {
        taken: TAKEN.load(Ordering::Relaxed),
        refused: REFUSED.load(Ordering::Relaxed),
        breaks: BREAKS.load(Ordering::Relaxed),
        bytes_moved: BYTES_MOVED.load(Ordering::Relaxed),
        seconds_held: secs(&NANOS),
        longest_held: secs(&LONGEST),
        failed: FAILED.load(Ordering::Relaxed),
        late: LATE.load(Ordering::Relaxed),
        adopted: ADOPTED.load(Ordering::Relaxed),
        moved_at_start: MOVED_AT_START.load(Ordering::Relaxed),
    }
}
