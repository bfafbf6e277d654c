//! Fork safety: telling what a process inherited through `fork(2)` from what it made, and
//! locks that a child process can always take.
//!
//! A child made by `fork` (Python's `os.fork`, a `multiprocessing` or torch `DataLoader`
//! worker) starts with a copy of its parent's memory and descriptors but only the thread
//! that forked. So:
//! * a lock that another thread of the parent held at the fork stays held forever in the
//!   child, and the value it guards may be half updated;
//! * a kernel object reached through an inherited descriptor is **shared** with the parent
//!   (an io_uring ring: its queues, its registered files and buffers): the child must not
//!   use it, only close its own copy of the descriptor;
//! * threads of a pool do not exist in the child.
//!
//! [`generation`] changes in every child (a `pthread_atfork` handler bumps it, so it costs
//! one atomic load to read); a resource that records it when made knows, on use, whether it
//! was inherited. [`ForkMutex`], [`ForkRwLock`] and [`ForkOnceLock`] are locks a child always
//! takes over: the first use in a child keeps the inherited value when no thread of the
//! parent held the lock at the fork (the value is whole), and otherwise sets the inherited
//! value aside, never touching nor dropping it again, and starts from a fresh one.
//!
//! The handler is registered on the first call of [`generation`] (every lock here and every
//! resource that records the generation makes that call when made). A fork that races with
//! that very first call, in another thread, may go unnoticed in its child.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::TryLockError;
use std::sync::{Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The process's generation: 1 in the first process, bumped in every child.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Whether the `pthread_atfork` handler is registered in this process.
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// Runs in the child right after `fork`: only an atomic add (async-signal-safe).
extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// A number that differs in every process made by `fork(2)` from the one it had in the
/// parent (and in the parent before the fork): compare it with the value recorded when a
/// resource was made to tell whether the resource was inherited. Never 0.
#[inline]
pub fn generation() -> u64 {
    if !REGISTERED.load(Ordering::Acquire) {
        register();
    }
    GENERATION.load(Ordering::Acquire)
}

#[cold]
fn register() {
    if REGISTERED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: registers a child handler that only performs an atomic add, which is
    // async-signal-safe (what a handler running in the child of a multi-threaded process
    // may do). The handler is a plain function that lives as long as this library.
    let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    if rc != 0 {
        // Out of memory: forks go unnoticed. Nothing else can be done here.
        REGISTERED.store(false, Ordering::Release);
    }
}

/// A lock whose state can be checked for whether its value was left whole at a fork.
trait Inheritable {
    /// True when no thread holds the lock now (so none held it at the fork, when called
    /// in a child before any of its own threads used it), i.e. the value is whole.
    fn is_whole(&self) -> bool;
}

impl<T> Inheritable for Mutex<T> {
    fn is_whole(&self) -> bool {
        !matches!(self.try_lock(), Err(TryLockError::WouldBlock))
    }
}

impl<T> Inheritable for RwLock<T> {
    fn is_whole(&self) -> bool {
        !matches!(self.try_write(), Err(TryLockError::WouldBlock))
    }
}

impl<T> Inheritable for OnceLock<T> {
    /// An initialized cell is whole; an empty one may be mid-initialization by a thread
    /// of the parent (then using it would block forever), so it is never kept.
    fn is_whole(&self) -> bool {
        self.get().is_some()
    }
}

/// One lock of a [`Cell`], made in the process of generation `generation`.
struct Slot<L> {
    generation: AtomicU64,
    lock: L,
}

/// The lock `L` of the current process: replaced in a child when the inherited one is not
/// whole (see the module docs). Slots that are replaced are leaked, so a reference to any
/// slot lives as long as the cell.
struct Cell<L: Inheritable> {
    /// The slot in use; null until the first use of a lazily made cell.
    current: AtomicPtr<Slot<L>>,
    /// The generation of a process whose thread is replacing or adopting the slot.
    claim: AtomicU64,
    /// Owns `L`: `Send`/`Sync` as `L` is.
    _owns: PhantomData<Box<Slot<L>>>,
}

/// Lets other threads renew a cell if the thread renewing it unwinds (a panicking
/// `fresh`), rather than wait for it forever.
struct Claim<'a>(&'a AtomicU64);

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

impl<L: Inheritable> Cell<L> {
    const fn lazy() -> Self {
        Cell {
            current: AtomicPtr::new(std::ptr::null_mut()),
            claim: AtomicU64::new(0),
            _owns: PhantomData,
        }
    }

    fn new(lock: L) -> Self {
        let slot = Box::new(Slot {
            generation: AtomicU64::new(generation()),
            lock,
        });
        Cell {
            current: AtomicPtr::new(Box::into_raw(slot)),
            claim: AtomicU64::new(0),
            _owns: PhantomData,
        }
    }

    /// The slot at `p`, when it is not null.
    fn slot(&self, p: *mut Slot<L>) -> Option<&Slot<L>> {
        // SAFETY: a non-null `current` points to a slot made by `Box::into_raw` that is
        // freed only when the cell is dropped (a replaced slot is leaked), so it is valid
        // for as long as `self` is borrowed.
        unsafe { p.as_ref() }
    }

    /// The lock of this process, made with `fresh` when the cell is empty or holds a lock
    /// inherited in a state that is not whole.
    #[inline]
    fn get(&self, fresh: impl FnOnce() -> L) -> &L {
        let now = generation();
        if let Some(slot) = self.slot(self.current.load(Ordering::Acquire)) {
            if slot.generation.load(Ordering::Acquire) == now {
                return &slot.lock;
            }
        }
        self.renew(now, fresh)
    }

    #[cold]
    fn renew(&self, now: u64, fresh: impl FnOnce() -> L) -> &L {
        loop {
            let p = self.current.load(Ordering::Acquire);
            let old = self.slot(p);
            if let Some(slot) = old {
                if slot.generation.load(Ordering::Acquire) == now {
                    return &slot.lock;
                }
            }
            // One thread of this process renews; the others wait for it. A claim of another
            // generation was left by a thread of an ancestor, which does not exist here.
            let claimed = self.claim.load(Ordering::Acquire);
            if claimed == now {
                std::thread::yield_now();
                continue;
            }
            if self
                .claim
                .compare_exchange(claimed, now, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            let claim = Claim(&self.claim);
            if self.current.load(Ordering::Acquire) != p {
                // Renewed between the load and the claim.
                drop(claim);
                continue;
            }
            if let Some(slot) = old {
                // Only this thread reaches the slot before its generation is updated (every
                // other one waits above), so a lock found free here was free at the fork.
                if slot.lock.is_whole() {
                    slot.generation.store(now, Ordering::Release);
                    drop(claim);
                    return &slot.lock;
                }
            }
            let slot = Box::into_raw(Box::new(Slot {
                generation: AtomicU64::new(now),
                lock: fresh(),
            }));
            // The old slot, if any, is leaked: a thread that no longer exists holds its lock
            // and may have left its value half updated, so it is neither used nor dropped.
            self.current.store(slot, Ordering::Release);
            drop(claim);
            return &self.slot(slot).expect("made above").lock;
        }
    }

    /// The lock, through exclusive access: `None` when the cell is empty or holds a lock
    /// inherited in a state that is not whole.
    fn get_mut(&mut self) -> Option<&mut L> {
        let now = generation();
        let p = *self.current.get_mut();
        // SAFETY: as in `slot`; `&mut self` excludes every other reference to the cell
        // and its current slot.
        let slot = unsafe { p.as_mut() }?;
        if *slot.generation.get_mut() != now {
            if !slot.lock.is_whole() {
                return None;
            }
            *slot.generation.get_mut() = now;
        }
        Some(&mut slot.lock)
    }
}

impl<L: Inheritable> Drop for Cell<L> {
    fn drop(&mut self) {
        let p = *self.current.get_mut();
        if p.is_null() {
            return;
        }
        // SAFETY: `p` came from `Box::into_raw` and, being current, was never leaked or
        // freed; `&mut self` means no reference to it remains.
        let mut slot = unsafe { Box::from_raw(p) };
        if *slot.generation.get_mut() != generation() && !slot.lock.is_whole() {
            // Inherited from a parent whose thread held the lock: possibly half updated,
            // so never dropped.
            std::mem::forget(slot);
        }
    }
}

/// A mutex that a child process made by `fork` can always take (see the module docs):
/// there, the first lock keeps the inherited value if no thread of the parent held the
/// mutex at the fork, else starts from a fresh value. A panic while locked does not poison
/// it for the others (the value is used as the panicking thread left it).
pub struct ForkMutex<T> {
    cell: Cell<Mutex<T>>,
}

impl<T> ForkMutex<T> {
    /// A mutex whose value is made by the first lock (for statics).
    pub const fn lazy() -> Self {
        ForkMutex { cell: Cell::lazy() }
    }

    /// Locks the mutex; `fresh` makes the value when there is none to keep (the first lock
    /// of a lazy mutex, or a child that inherited the mutex held). `fresh` must not lock
    /// this mutex.
    pub fn lock_or(&self, fresh: impl FnOnce() -> T) -> MutexGuard<'_, T> {
        unpoison(self.cell.get(|| Mutex::new(fresh())).lock())
    }

    /// The value, through exclusive access; `None` in a child that inherited the mutex held
    /// (or before the first lock of a lazy mutex).
    pub fn get_mut(&mut self) -> Option<&mut T> {
        let m = self.cell.get_mut()?;
        Some(m.get_mut().unwrap_or_else(|p| p.into_inner()))
    }
}

impl<T: Default> ForkMutex<T> {
    /// Locks the mutex; a fresh value is `T::default()` (see [`ForkMutex::lock_or`]).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.lock_or(T::default)
    }
}

/// A readers-writer lock that a child process made by `fork` can always take, as
/// [`ForkMutex`]: a value is kept only if no thread of the parent held the lock, for
/// reading or writing, at the fork.
pub struct ForkRwLock<T> {
    cell: Cell<RwLock<T>>,
}

impl<T> ForkRwLock<T> {
    /// Locks for reading; `fresh` as in [`ForkMutex::lock_or`].
    pub fn read_or(&self, fresh: impl FnOnce() -> T) -> RwLockReadGuard<'_, T> {
        unpoison(self.cell.get(|| RwLock::new(fresh())).read())
    }

    /// Locks for writing; `fresh` as in [`ForkMutex::lock_or`].
    pub fn write_or(&self, fresh: impl FnOnce() -> T) -> RwLockWriteGuard<'_, T> {
        unpoison(self.cell.get(|| RwLock::new(fresh())).write())
    }
}

impl<T: Default> ForkRwLock<T> {
    /// Locks for reading; a fresh value is `T::default()`.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.read_or(T::default)
    }

    /// Locks for writing; a fresh value is `T::default()`.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.write_or(T::default)
    }
}

/// A cell written once, as [`OnceLock`], that a child process made by `fork` can always
/// use: an inherited value is kept; an inherited cell still empty (perhaps being
/// initialized by a thread of the parent) is replaced by an empty one.
pub struct ForkOnceLock<T> {
    cell: Cell<OnceLock<T>>,
}

impl<T> ForkOnceLock<T> {
    /// An empty cell (usable in statics).
    pub const fn new() -> Self {
        ForkOnceLock { cell: Cell::lazy() }
    }

    /// The value, made by `init` if the cell is empty (as [`OnceLock::get_or_init`]).
    pub fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
        self.cell.get(OnceLock::new).get_or_init(init)
    }

    /// The value, if made (in this process or kept from the parent).
    pub fn get(&self) -> Option<&T> {
        self.cell.get(OnceLock::new).get()
    }
}

impl<T> Default for ForkOnceLock<T> {
    fn default() -> Self {
        ForkOnceLock::new()
    }
}

/// For each lock type: an opaque `Debug` (the value is behind the lock), and for the
/// locks holding a value from the start (`$lock` around the std lock `$std`), `new(value)`
/// and `Default` holding `T::default()`.
macro_rules! lock_impls {
    ($($lock:ident),* ; $($with_value:ident($std:ident)),*) => {
        $(impl<T> fmt::Debug for $lock<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($lock)).finish_non_exhaustive()
            }
        })*
        $(impl<T> $with_value<T> {
            /// A lock holding `value`.
            pub fn new(value: T) -> Self {
                $with_value {
                    cell: Cell::new($std::new(value)),
                }
            }
        }

        impl<T: Default> Default for $with_value<T> {
            fn default() -> Self {
                $with_value::new(T::default())
            }
        })*
    };
}

lock_impls!(ForkMutex, ForkRwLock, ForkOnceLock; ForkMutex(Mutex), ForkRwLock(RwLock));

/// The guard, whether or not a panic poisoned the lock.
fn unpoison<G>(r: std::sync::LockResult<G>) -> G {
    r.unwrap_or_else(|p| p.into_inner())
}
