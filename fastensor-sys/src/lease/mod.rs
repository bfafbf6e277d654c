//! Read leases that keep the memory a load handed out from changes another program makes
//! to its file.
//!
//! A private (copy-on-write) mapping of a file shares its clean pages with the page cache:
//! a write to the file in place shows through them, and a truncation takes away every page
//! of the mapping past the new end, even pages this process wrote (which then raise
//! `SIGBUS`, or fault in whatever the file holds there later). Only memory outside the
//! file's mapping is safe from both.
//!
//! A [`Lease`] is a read lease on the file (`fcntl(F_SETLEASE, F_RDLCK)`): when any
//! process (this one included) opens the file for writing or truncates it, the kernel
//! holds that call and signals the holder, and the call goes on once the holder lets go
//! (or, at the latest, after `/proc/sys/fs/lease-break-time` seconds, when the kernel lets
//! go for it). The signal (`SIGRTMIN+8`, directed at one thread: `F_SETSIG` and
//! `F_SETOWN_EX` with `F_OWNER_TID`) goes to a thread of this module's own, started on the
//! first lease of a process and blocking that signal alone; no other thread's signal
//! mask or handler is touched. On a break that thread moves the memory the lease guards
//! ([`crate::filemap::FileMap`]) into anonymous memory at the same addresses (copied
//! through the kernel, then `mremap`ed over, 2 MiB at a time on four threads), and
//! then lets go of the lease: the writer goes on, and the memory no longer has anything to
//! do with the file.
//!
//! What a lease cannot do:
//! * A lease is refused ([`Refusal`]) while any process has the file open for writing,
//!   for a file the caller does not own without `CAP_LEASE`, and on file systems that do
//!   not grant leases (`EINVAL`, as NFS or `/proc`, or with `fs.leases-enable = 0`).
//! * A writer that opens the file with `O_NONBLOCK` (coreutils `truncate` does) is not held:
//!   its `open` fails at once with `EAGAIN` while the memory is moved; its next try
//!   succeeds.
//! * A write to the guarded memory by another thread of this process while its 2 MiB piece
//!   is being copied may be lost (the piece is copied, then swapped in).
//! * The moving must end within the lease-break time, or the kernel lets the writer go
//!   first; moving runs at memory-copy speed for pages in memory, at the device's speed for
//!   pages that were evicted. [`Lease::in_time`] tells whether memory can be guarded at
//!   all (see `budget`: half the lease-break time at the rate measured here); a break
//!   that ended after the lease-break time all the same leaves its memory unprotected
//!   (counted as `late`).
//!
//! A `fork` child shares the clean pages of its parent's private mappings with the page
//! cache too, and the lease is its parent's: the parent's break moves only the parent's
//! memory. So each lease has a successor in the child ([`inherit`]): around a fork (the
//! Python package calls these from `os.register_at_fork`), [`inherit::prepare`] takes, in
//! the parent, one more read lease per lease held, on a new open file description of the
//! same file, before the fork; the child inherits it, and [`inherit::in_child`] makes it
//! the child's (its own thread answers its breaks, moving the child's memory);
//! [`inherit::in_parent`] closes the parent's copies. The child's lease exists from the
//! fork on: a writer is held until both processes have moved their memory.

mod anon;
mod budget;
mod handler;
pub mod inherit;

use crate::fork::ForkMutex;
use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};

pub use budget::{break_time, rate as move_rate, TooSlow};
pub use handler::{stats, Stats};

/// Why a read lease could not be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A process has the file open for writing (`EAGAIN`).
    OpenForWriting,
    /// The caller neither owns the file nor holds `CAP_LEASE` (`EACCES`, `EPERM`).
    NotPermitted,
    /// The file system does not grant leases (`EINVAL`, `ENOLCK`, `ENOSYS`, `EOPNOTSUPP`).
    Unsupported,
    /// Anything else (the thread that receives breaks could not be started, say).
    Failed,
}

impl Refusal {
    /// The refusal an errno of `F_SETLEASE` means.
    pub fn of(err: &io::Error) -> Refusal {
        match err.raw_os_error() {
            Some(libc::EAGAIN) => Refusal::OpenForWriting,
            Some(libc::EACCES | libc::EPERM) => Refusal::NotPermitted,
            Some(libc::EINVAL | libc::ENOLCK | libc::ENOSYS | libc::EOPNOTSUPP) => {
                Refusal::Unsupported
            }
            _ => Refusal::Failed,
        }
    }

    /// The refusal in words.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::OpenForWriting => "the file is open for writing",
            Refusal::NotPermitted => "not the file's owner, and no CAP_LEASE",
            Refusal::Unsupported => "the file system grants no leases",
            Refusal::Failed => "the lease could not be taken",
        }
    }
}

/// A lease refused: why, and the OS error.
#[derive(Debug)]
pub struct Refused {
    /// Why.
    pub refusal: Refusal,
    /// The OS error that said so.
    pub source: io::Error,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no read lease: {} ({})",
            self.refusal.as_str(),
            self.source
        )
    }
}

impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A read lease on an open file, held until dropped (see the [module docs](self)).
#[derive(Debug)]
pub struct Lease {
    entry: Arc<Entry>,
}

/// One lease: the descriptor it is held through, the process that took it, and what it
/// guards.
#[derive(Debug)]
pub(crate) struct Entry {
    /// A descriptor of the open file description the lease belongs to.
    file: File,
    /// The process that took the lease (a `fork` child inherits the descriptor, not the
    /// thread that answers breaks).
    pid: u32,
    state: Mutex<State>,
    /// In a `fork` child: the lease the child holds in this one's place on the same file
    /// ([`inherit`]); `None` where the child has none (its memory is then unprotected,
    /// or was moved when the child started).
    successor: ForkMutex<Option<Arc<Entry>>>,
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) phase: Phase,
    /// Address ranges (page-aligned) to move into anonymous memory on a break.
    pub(crate) guarded: Vec<Range<usize>>,
}

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Being taken (or refused): breaks are not answered yet.
    Taking,
    /// Held: a writer will be held until the guarded memory is moved.
    Held,
    /// Broken, answered and let go.
    Broken(Outcome),
    /// Let go by its holder.
    Released,
}

/// What the answer to a break did with the guarded memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Nothing was guarded yet (the memory was not mapped).
    NothingGuarded,
    /// Moved into anonymous memory.
    Moved,
    /// Not moved (out of memory, say): it stays shared with the file.
    MoveFailed,
    /// Moved, but after the lease-break time: the kernel may have let the writer go
    /// before the last pieces were moved, so they may hold the file's new bytes.
    MovedLate,
}

impl Entry {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    pub(crate) fn ours(&self) -> bool {
        self.pid == std::process::id()
    }

    /// The lease of this process that stands for `self`: `self` in the process that took
    /// it, its successor (or the successor's, down a line of forks) in a child; `None` in
    /// a child that took none.
    pub(crate) fn current(self: &Arc<Self>) -> Option<Arc<Entry>> {
        let mut e = self.clone();
        while !e.ours() {
            let next = e.successor.lock().clone()?;
            e = next;
        }
        Some(e)
    }
}

/// Takes a read lease on the open file description of `file` (opened read-only), whose
/// breaks the thread of this module answers. Cheap: a `dup` and three `fcntl` calls (the
/// first lease of a process also starts the thread).
pub fn take(file: &File) -> Result<Lease, Refused> {
    let failed = |source: io::Error| Refused {
        refusal: Refusal::Failed,
        source,
    };
    let tid = handler::thread().map_err(failed)?;
    let dup = file.try_clone().map_err(failed)?;
    let entry = Arc::new(Entry {
        file: dup,
        pid: std::process::id(),
        state: Mutex::new(State {
            phase: Phase::Taking,
            guarded: Vec::new(),
        }),
        successor: ForkMutex::new(None),
    });
    // Registered before the lease exists, and set to `Held` under its lock: a break that
    // comes at once waits for the lock and finds the lease held.
    let mut state = entry.state();
    handler::register(&entry);
    let fd = entry.fd();
    fcntl_int(fd, F_SETSIG, handler::signal()).map_err(failed)?;
    set_owner(fd, tid).map_err(failed)?;
    if let Err(source) = fcntl_int(fd, libc::F_SETLEASE, libc::F_RDLCK) {
        handler::count_refused();
        return Err(Refused {
            refusal: Refusal::of(&source),
            source,
        });
    }
    state.phase = Phase::Held;
    drop(state);
    handler::count_taken();
    Ok(Lease { entry })
}

impl Lease {
    /// Guards the address ranges `ranges` (page-aligned, within memory the caller keeps
    /// mapped until the lease is dropped, see [`crate::filemap::FileMap`]): a break moves
    /// them into anonymous memory. `false` when the lease was broken already (nothing is
    /// guarded: the file may have changed since; load it again).
    pub(crate) fn guard(&self, ranges: Vec<Range<usize>>) -> bool {
        let mut state = self.entry.state();
        if state.phase != Phase::Held {
            return false;
        }
        state.guarded = ranges;
        true
    }

    /// Whether a break could move `bytes` of guarded memory of this lease, with the memory
    /// the other leases of this process on the same file guard (a writer breaks them all,
    /// answered one after the other), before the kernel lets the writer go: within half
    /// `/proc/sys/fs/lease-break-time` at the move rate measured in this process (see
    /// `budget`). Where not, the caller had better read the file than map it.
    pub fn in_time(&self, bytes: u64) -> Result<(), TooSlow> {
        budget::check(bytes.saturating_add(guarded_on_same_file(&self.entry)))
    }

    /// Where the lease of this process that stands for this one stands (in a `fork`
    /// child, its successor's; `Released` where the child has none).
    pub(crate) fn phase(&self) -> Phase {
        match self.entry.current() {
            Some(e) => e.state().phase,
            None => Phase::Released,
        }
    }
}

impl Drop for Lease {
    /// Lets go of the lease, waiting for a break being answered to finish: the guarded
    /// memory may be unmapped once this returns. In a `fork` child (which inherited the
    /// descriptor) the parent's lease is left alone: the child lets go of its successor.
    fn drop(&mut self) {
        let Some(entry) = self.entry.current() else {
            return;
        };
        let mut state = entry.state();
        state.guarded.clear();
        if state.phase == Phase::Held {
            let _ = fcntl_int(entry.fd(), libc::F_SETLEASE, libc::F_UNLCK);
            state.phase = Phase::Released;
        }
    }
}

/// Bytes the held leases of this process other than `entry` guard on `entry`'s file.
fn guarded_on_same_file(entry: &Arc<Entry>) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let id = |e: &Entry| e.file.metadata().ok().map(|m| (m.dev(), m.ino()));
    let Some(this) = id(entry) else {
        return 0;
    };
    handler::ours()
        .iter()
        .filter(|e| !Arc::ptr_eq(e, entry) && id(e.as_ref()) == Some(this))
        .map(|e| {
            let state = e.state();
            if state.phase != Phase::Held {
                return 0;
            }
            state
                .guarded
                .iter()
                .map(|r| (r.end - r.start) as u64)
                .sum::<u64>()
        })
        .sum()
}

/// Sends the break signal of the lease on `fd` to the thread `tid`.
pub(crate) fn set_owner(fd: i32, tid: libc::pid_t) -> io::Result<()> {
    let owner = FOwnerEx {
        kind: F_OWNER_TID,
        pid: tid,
    };
    // SAFETY: `fd` is an open descriptor of the caller's; the kernel reads `owner`, a live
    // `struct f_owner_ex`, during the call.
    let rc = unsafe { libc::fcntl(fd, F_SETOWN_EX, &owner as *const FOwnerEx) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fcntl` commands and types the `libc` crate lacks for glibc targets.
const F_SETSIG: i32 = 10;
const F_SETOWN_EX: i32 = 15;
const F_OWNER_TID: i32 = 0;

/// `struct f_owner_ex`.
#[repr(C)]
struct FOwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// `fcntl(fd, cmd, arg)` with an integer argument.
pub(crate) fn fcntl_int(fd: i32, cmd: i32, arg: i32) -> io::Result<i32> {
    // SAFETY: the commands used here take an integer argument and read no memory; a bad
    // descriptor is an error return.
    let rc = unsafe { libc::fcntl(fd, cmd, arg) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

#[cfg(test)]
mod tests;
