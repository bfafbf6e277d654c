//! [`ForkLock`]: a lock over process-wide state that a `fork()` child can always take.
//!
//! A `std::sync::Mutex` held by another thread when the process forks stays locked forever
//! in the child, where that thread does not exist. A `ForkLock` records which process holds
//! it: a child that finds it held by its parent takes it over and starts from a fresh
//! value, since the parent's state (its background work, its threads) is not the child's.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// A spin lock over `T` whose holder is a process id; reset to `fresh()` in a fork child.
pub struct ForkLock<T> {
    /// The id of the process that holds the lock, 0 when free.
    holder: AtomicU32,
    /// The id of the process the value belongs to, 0 before first use.
    owner: AtomicU32,
    value: UnsafeCell<T>,
    fresh: fn() -> T,
}

// SAFETY: the value is only reached through `with`, which holds the lock (one thread of one
// process at a time); `T: Send` lets it be used from any thread.
unsafe impl<T: Send> Sync for ForkLock<T> {}

impl<T> ForkLock<T> {
    /// A lock over `value`; a fork child gets `fresh()` instead of its parent's value.
    pub const fn new(value: T, fresh: fn() -> T) -> Self {
        ForkLock {
            holder: AtomicU32::new(0),
            owner: AtomicU32::new(0),
            value: UnsafeCell::new(value),
            fresh,
        }
    }

    /// Runs `f` on the value with the lock held. Keep `f` short: waiters spin.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let me = std::process::id();
        loop {
            match self
                .holder
                .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(h) if h != 0 && h != me => {
                    // Held by the process this one was forked from: nobody here will free it.
                    if self
                        .holder
                        .compare_exchange(h, me, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
                Err(_) => std::hint::spin_loop(),
            }
        }
        struct Release<'a>(&'a AtomicU32);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::Release);
            }
        }
        let _release = Release(&self.holder);
        if self.owner.load(Ordering::Relaxed) != me {
            let old_owner = self.owner.swap(me, Ordering::Relaxed);
            if old_owner != 0 {
                // SAFETY: the lock is held; the parent's value may have been mid-update at
                // the fork, so it is overwritten without being read or dropped.
                unsafe { std::ptr::write(self.value.get(), (self.fresh)()) };
            }
        }
        // SAFETY: the lock is held by this thread until `_release` drops.
        f(unsafe { &mut *self.value.get() })
    }
}
