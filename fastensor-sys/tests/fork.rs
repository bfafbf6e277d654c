//! `fastensor_sys::fork` in a child made by `fork(2)`: the generation changes, and a lock
//! that a thread of the parent held at the fork is replaced by a fresh one (never waited
//! for, its value never dropped) while a free one keeps its value.
//!
//! Every test forks, so they run one at a time (the static lock below). Children report
//! through their exit status (`child`, shared with the root crate's fork tests).

mod child;

use fastensor_sys::fork::{generation, ForkMutex, ForkOnceLock, ForkRwLock};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

static FORKING: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    FORKING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Forks a child that exits with 0 when `check` holds, 1 when not, 2 on a panic.
fn fork(check: impl FnOnce() -> bool) -> libc::pid_t {
    child::fork(|| {
        check()
            .then_some(())
            .ok_or_else(|| "the check failed".into())
    })
}

/// The child's exit code; a child still running after 20 s is killed and fails the test.
fn exit_code(pid: libc::pid_t) -> i32 {
    child::wait(pid, Instant::now() + Duration::from_secs(20)).unwrap_or_else(|e| panic!("{e}"))
}

/// A thread holding a lock until [`Holder::release`].
struct Holder {
    release: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Holder {
    /// Lets the thread finish, and waits for it.
    fn release(self) {
        self.release.send(()).unwrap();
        self.thread.join().unwrap();
    }
}

/// Runs `hold` on a thread; returns once `hold` has signalled that it holds its lock.
fn holding(hold: impl FnOnce(mpsc::Sender<()>, mpsc::Receiver<()>) + Send + 'static) -> Holder {
    let (held_tx, held) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let thread = std::thread::spawn(move || hold(held_tx, release_rx));
    held.recv().unwrap();
    Holder { release, thread }
}

#[test]
fn the_generation_changes_in_a_child_and_stays_in_the_parent() {
    let _serial = serial();
    let before = generation();
    assert_ne!(before, 0);
    let pid = fork(|| {
        let g = generation();
        g != before && g != 0 && generation() == g
    });
    assert_eq!(exit_code(pid), 0);
    assert_eq!(generation(), before);
}

#[test]
fn a_mutex_free_at_the_fork_keeps_its_value_in_the_child() {
    let _serial = serial();
    let m = ForkMutex::new(vec![1]);
    m.lock().push(2);
    let pid = fork(|| {
        let kept = *m.lock_or(|| vec![9]) == [1, 2];
        m.lock().push(3);
        kept && *m.lock() == [1, 2, 3]
    });
    assert_eq!(exit_code(pid), 0);
    assert_eq!(*m.lock(), [1, 2], "the child's changes are its own");
}

#[test]
fn a_mutex_held_by_another_thread_at_the_fork_starts_afresh_in_the_child() {
    let _serial = serial();
    let m = Arc::new(ForkMutex::new(vec![1]));
    let holder = {
        let m = m.clone();
        holding(move |held, release| {
            let mut g = m.lock();
            g.push(2);
            held.send(()).unwrap();
            release.recv().unwrap();
            g.push(3);
        })
    };
    let pid = fork(|| {
        let fresh = *m.lock_or(|| vec![7]) == [7];
        m.lock().push(8);
        fresh && *m.lock() == [7, 8]
    });
    let code = exit_code(pid);
    holder.release();
    assert_eq!(code, 0, "the child did not start from a fresh value");
    assert_eq!(*m.lock(), [1, 2, 3], "the parent's value is its own");
}

#[test]
fn a_lazy_static_mutex_works_in_a_child_whatever_the_parent_held() {
    static LAZY: ForkMutex<Vec<u32>> = ForkMutex::lazy();
    let _serial = serial();
    LAZY.lock().push(1);
    let holder = holding(|held, release| {
        let _g = LAZY.lock();
        held.send(()).unwrap();
        release.recv().unwrap();
    });
    let pid = fork(|| {
        LAZY.lock().push(5);
        *LAZY.lock() == [5]
    });
    let code = exit_code(pid);
    holder.release();
    assert_eq!(code, 0);
    assert_eq!(*LAZY.lock(), [1]);
}

#[test]
fn a_rwlock_read_by_another_thread_at_the_fork_starts_afresh_in_the_child() {
    let _serial = serial();
    let l = Arc::new(ForkRwLock::new(String::from("parent")));
    let holder = {
        let l = l.clone();
        holding(move |held, release| {
            let _r = l.read();
            held.send(()).unwrap();
            release.recv().unwrap();
        })
    };
    let pid = fork(|| {
        // Another reader would get in; a writer would wait forever on a plain lock.
        l.write_or(|| String::from("child")).push('!');
        *l.read() == "child!"
    });
    let code = exit_code(pid);
    holder.release();
    assert_eq!(code, 0);
    assert_eq!(*l.read(), "parent");

    // Free at the fork: kept.
    let pid = fork(|| *l.write_or(|| String::from("fresh")) == "parent");
    assert_eq!(exit_code(pid), 0);
}

#[test]
fn a_once_lock_being_made_at_the_fork_is_made_again_in_the_child() {
    let _serial = serial();
    let cell: Arc<ForkOnceLock<u32>> = Arc::new(ForkOnceLock::new());
    let holder = {
        let cell = cell.clone();
        holding(move |held, release| {
            cell.get_or_init(|| {
                held.send(()).unwrap();
                release.recv().unwrap();
                1
            });
        })
    };
    let pid = fork(|| cell.get().is_none() && *cell.get_or_init(|| 2) == 2);
    let code = exit_code(pid);
    holder.release();
    assert_eq!(code, 0);
    // The parent's thread made it.
    assert_eq!(cell.get(), Some(&1));

    // Made before the fork: kept.
    let pid = fork(|| *cell.get_or_init(|| 3) == 1);
    assert_eq!(exit_code(pid), 0);
}

/// Counts its drops.
struct Counted(&'static AtomicUsize);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_value_inherited_locked_is_never_dropped_and_one_inherited_free_is() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let _serial = serial();
    let m = Arc::new(ForkMutex::new(Counted(&DROPS)));
    let holder = {
        let m = m.clone();
        holding(move |held, release| {
            let _g = m.lock_or(|| Counted(&DROPS));
            held.send(()).unwrap();
            release.recv().unwrap();
        })
    };
    let ptr = Arc::as_ptr(&m);
    let pid = fork(|| {
        // SAFETY: in the child no other thread exists; the Arc's memory is this process's
        // copy, and nothing uses the mutex after this drop.
        let mut owned = unsafe { std::ptr::read(ptr) };
        let none = owned.get_mut().is_none();
        drop(owned);
        none && DROPS.load(Ordering::SeqCst) == 0
    });
    let code = exit_code(pid);
    holder.release();
    assert_eq!(code, 0, "a value a dead thread held was used or dropped");

    let mut free = ForkMutex::new(Counted(&DROPS));
    let pid = fork(move || {
        let some = free.get_mut().is_some();
        drop(free);
        some && DROPS.load(Ordering::SeqCst) == 1
    });
    assert_eq!(exit_code(pid), 0);
    drop(m);
}
