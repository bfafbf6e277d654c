//! Runs independent pieces of one transfer on a few threads at once, on a pool of threads
//! kept for the life of the process (a transfer starts no thread).
//!
//! The pool belongs to the process that made it: a child made by `fork` (which inherits no
//! thread) makes its own on first use and never touches the parent's (its queue's lock may
//! have been held by a parent thread at the fork). A call never waits for a pool thread
//! that has not started its share: the caller works through the items itself, and helpers
//! that start after the items are gone return at once, so nested calls and a pool whose
//! threads are all busy cannot deadlock.

use crate::Result;
use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Most threads the pool keeps.
const MAX_THREADS: usize = 64;

/// Runs `work` on every item, using up to `threads` threads (the caller's included), and
/// returns the first error. Items are taken in order; after an error no new item starts. A
/// panic in `work` is raised again in the caller once every started item has finished.
///
/// With one item or one thread everything runs on the caller's thread.
pub fn for_each<T, F>(items: Vec<T>, threads: usize, work: F) -> Result<()>
where
    T: Send,
    F: Fn(T) -> Result<()> + Sync,
{
    let workers = threads.max(1).min(items.len());
    if workers <= 1 {
        return items.into_iter().try_for_each(work);
    }
    let queue = Mutex::new(items.into_iter());
    let failed = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    let run = || loop {
        if failed.load(Ordering::Relaxed) {
            return;
        }
        let next = lock(&queue).next();
        let Some(item) = next else { return };
        if let Err(e) = work(item) {
            failed.store(true, Ordering::Relaxed);
            lock(&first_error).get_or_insert(e);
            return;
        }
    };
    scoped(workers - 1, &run);
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A call's share offered to pool threads: the caller's `run`, the helpers inside it.
struct Share {
    /// `run` of [`scoped`], its lifetime erased; dereferenced only by a helper that
    /// registered in `state` while it was open.
    run: *const (dyn Fn() + Sync),
    state: Mutex<ShareState>,
    done: Condvar,
}

#[derive(Default)]
struct ShareState {
    /// The caller has finished `run`: helpers starting now must not call it.
    closed: bool,
    /// Helpers inside `run`.
    running: usize,
    /// A helper's `run` panicked.
    panicked: bool,
}

// SAFETY: `run` points to a `Sync` closure, called from several threads only while the
// caller of `scoped` keeps it alive (see `scoped`).
unsafe impl Send for Share {}
// SAFETY: as above.
unsafe impl Sync for Share {}

impl Share {
    /// A helper's part: runs `run` unless the caller is already done with it.
    fn help(&self) {
        {
            let mut s = lock(&self.state);
            if s.closed {
                return;
            }
            s.running += 1;
        }
        // SAFETY: registered while open, so the caller of `scoped` waits for this helper to
        // deregister before `run`'s closure goes away.
        let run = unsafe { &*self.run };
        let result = catch_unwind(AssertUnwindSafe(run));
        let mut s = lock(&self.state);
        s.running -= 1;
        s.panicked |= result.is_err();
        self.done.notify_all();
    }
}

/// Runs `run` on the caller's thread and offers it to `helpers` pool threads; returns when
/// the caller's run and every helper that started one have finished.
fn scoped(helpers: usize, run: &(dyn Fn() + Sync)) {
    // SAFETY: only the lifetime is erased; the pointer is dereferenced by helpers that
    // registered before `closed` was set below, and this function waits for each of them
    // to finish before returning, so the closure outlives every use.
    let erased: *const (dyn Fn() + Sync) = unsafe { std::mem::transmute(run) };
    let share = Arc::new(Share {
        run: erased,
        state: Mutex::new(ShareState::default()),
        done: Condvar::new(),
    });
    if let Some(pool) = Pool::current() {
        pool.offer(&share, helpers);
    }
    // Waits for the helpers even when the caller's own run panics.
    struct Close<'a>(&'a Share);
    impl Drop for Close<'_> {
        fn drop(&mut self) {
            let mut s = lock(&self.0.state);
            s.closed = true;
            while s.running > 0 {
                s = self.0.done.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
    let close = Close(&share);
    run();
    drop(close);
    if lock(&share.state).panicked {
        resume_unwind(Box::new("a worker of fastensor's thread pool panicked"));
    }
}

/// The process's pool: threads waiting for shares to help with.
struct Pool {
    /// The process that made the pool.
    pid: u32,
    queue: Mutex<PoolState>,
    ready: Condvar,
}

#[derive(Default)]
struct PoolState {
    shares: VecDeque<Arc<Share>>,
    threads: usize,
    idle: usize,
}

/// Threads started by pools of this process (and its parents), for tests.
static SPAWNED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The current process's pool (pools of parent processes are left as they are).
static POOL: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());

impl Pool {
    /// This process's pool, made on first use; `None` when it cannot be made.
    fn current() -> Option<&'static Pool> {
        let pid = std::process::id();
        let p = POOL.load(Ordering::Acquire);
        // SAFETY: pools are leaked, never freed: a non-null pointer stays valid.
        if let Some(pool) = unsafe { p.as_ref() } {
            if pool.pid == pid {
                return Some(pool);
            }
        }
        let fresh: &'static Pool = Box::leak(Box::new(Pool {
            pid,
            queue: Mutex::new(PoolState::default()),
            ready: Condvar::new(),
        }));
        match POOL.compare_exchange(
            p,
            fresh as *const Pool as *mut Pool,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Some(fresh),
            // Another thread of this process made one first: use it (the spare one is
            // leaked, once).
            // SAFETY: as above.
            Err(now) => unsafe { now.as_ref() },
        }
    }

    /// Queues `share` for up to `helpers` threads, starting threads until that many are idle
    /// (within [`MAX_THREADS`]; none queued when no thread could start).
    fn offer(&'static self, share: &Arc<Share>, helpers: usize) {
        let mut q = lock(&self.queue);
        while q.idle < helpers + q.shares.len() && q.threads < MAX_THREADS {
            let spawned = std::thread::Builder::new()
                .name("fastensor-io".into())
                .spawn(move || self.serve());
            if spawned.is_err() {
                break;
            }
            SPAWNED.fetch_add(1, Ordering::Relaxed);
            q.threads += 1;
            q.idle += 1;
        }
        for _ in 0..helpers.min(q.threads) {
            q.shares.push_back(share.clone());
        }
        self.ready.notify_all();
    }

    /// A pool thread: helps with shares as they come, forever.
    fn serve(&self) {
        loop {
            let share = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(s) = q.shares.pop_front() {
                        q.idle -= 1;
                        break s;
                    }
                    q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            share.help();
            drop(share);
            lock(&self.queue).idle += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, ErrorKind};
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn runs_every_item_once() {
        let sum = AtomicUsize::new(0);
        for_each((1..=100usize).collect(), 4, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert_eq!(sum.into_inner(), 5050);
    }

    #[test]
    fn returns_an_error() {
        let err = for_each((0..50).collect(), 3, |i: i32| {
            if i == 7 {
                Err(Error::new(ErrorKind::Io, "boom"))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!(err.message(), "boom");
    }

    #[test]
    fn nested_calls_finish_on_a_busy_pool() {
        let sum = AtomicUsize::new(0);
        for_each((0..8).collect(), 8, |_: i32| {
            for_each((1..=10usize).collect(), 8, |i| {
                sum.fetch_add(i, Ordering::Relaxed);
                Ok(())
            })
        })
        .unwrap();
        assert_eq!(sum.into_inner(), 8 * 55);
    }

    #[test]
    fn a_panic_reaches_the_caller_after_every_item_started_has_finished() {
        let finished = AtomicUsize::new(0);
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
            for_each((0..64).collect(), 4, |i: i32| {
                if i == 3 {
                    panic!("item 3");
                }
                std::thread::yield_now();
                finished.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
        }));
        assert!(caught.is_err());
        let after = finished.load(Ordering::Relaxed);
        // Nothing runs once the call has returned.
        std::thread::yield_now();
        assert_eq!(finished.load(Ordering::Relaxed), after);
    }

    #[test]
    fn threads_are_kept_between_calls() {
        for_each((0..16).collect(), 4, |_: i32| Ok(())).unwrap();
        let before = SPAWNED.load(Ordering::Relaxed);
        for _ in 0..100 {
            for_each((0..16).collect(), 4, |_: i32| Ok(())).unwrap();
        }
        // A thread per helper and call would be 300; other tests of this binary may grow
        // the pool at the same time, never past its bound.
        let spawned = SPAWNED.load(Ordering::Relaxed) - before;
        assert!(
            spawned <= MAX_THREADS,
            "{spawned} threads started by 100 calls"
        );
    }
}
