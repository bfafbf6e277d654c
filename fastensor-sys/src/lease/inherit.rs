//! Leases across `fork(2)`: the child gets leases of its own on the files its inherited
//! mappings map, taken before the fork, so that no moment passes in which a writer could
//! reach the child's memory.
//!
//! A child inherits its parent's private mappings: the pages neither process wrote are
//! still the page cache's, shared by both. The parent's lease moves only the parent's
//! memory on a break (a process cannot move another's), so the child needs its own lease.
//! Taken in the child after the fork, it would come too late for a writer that opened the
//! file between the fork and the child's start (held by the parent's lease only, then let
//! through once the parent moved its memory). So the call order is:
//!
//! 1. [`prepare`], in the parent just before the fork: for each lease the process holds,
//!    opens the file again (a new open file description, through `/proc/self/fd`, so the
//!    same file whatever was renamed over its path) and takes a read lease on it. A lease
//!    being broken at that moment (a writer waits) is answered at once instead: the parent
//!    moves its memory before the fork, and the child inherits the moved memory.
//! 2. `fork`.
//! 3. [`in_parent`] (also after a failed fork): closes the parent's descriptors of those
//!    leases. A lease lives as long as its open file description, which the child holds.
//! 4. [`in_child`]: the child makes each lease its own (its thread answers the breaks,
//!    started now), guarding the same memory as its parent's lease did, and answers at
//!    once a break that came since the fork (the writer waited for it). Where no lease
//!    could be taken for the child, the child moves that memory into anonymous memory of
//!    its own at once (the parent's lease holds every writer meanwhile).
//!
//! The Python package registers the three with `os.register_at_fork` (so `os.fork`,
//! `multiprocessing` and torch's `DataLoader` workers are covered). Rust code that forks
//! calls them itself around `fork`. A lease taken by another thread while the process
//! forks (between [`prepare`] and the fork) has no successor: the child's copy of that
//! memory is unprotected (the thread that was taking it does not exist in the child).

use super::{anon, fcntl_int, handler, Entry, Phase, State, F_SETSIG};
use crate::fork::ForkMutex;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

/// A lease of this process and what its child gets in its place.
struct ForChild {
    /// The lease the child's stands for.
    parent: Arc<Entry>,
    /// A read lease taken for the child (on a new open file description of the same file),
    /// or `None` where none could be taken: the child then moves the memory at once.
    file: Option<File>,
    /// The memory the parent's lease guards (the same addresses in the child).
    guarded: Vec<Range<usize>>,
}

/// What [`prepare`] made for the child of the fork under way.
static FOR_CHILD: ForkMutex<Vec<ForChild>> = ForkMutex::lazy();

/// In the parent, just before `fork`: a lease for the child per lease this process holds
/// (see the module docs). Cheap when the process holds no lease.
pub fn prepare() {
    let mut made = Vec::new();
    for entry in handler::ours() {
        let state = entry.state();
        if state.phase != Phase::Held || state.guarded.is_empty() {
            continue; // moved already (the child inherits anonymous memory), or nothing mapped
        }
        match lease_again(&entry) {
            Ok(file) => made.push(ForChild {
                parent: entry.clone(),
                file: Some(file),
                guarded: state.guarded.clone(),
            }),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                // A writer has the file open: this lease is being broken. Moved now, before
                // the fork: the child inherits the memory moved.
                drop(state);
                handler::answer(&entry);
                let state = entry.state();
                if state.phase == Phase::Held {
                    // Not being broken after all (the writer closed meanwhile): the child
                    // moves its memory itself.
                    made.push(ForChild {
                        parent: entry.clone(),
                        file: None,
                        guarded: state.guarded.clone(),
                    });
                }
            }
            Err(_) => made.push(ForChild {
                parent: entry.clone(),
                file: None,
                guarded: state.guarded.clone(),
            }),
        }
    }
    *FOR_CHILD.lock() = made;
}

/// In the parent, after `fork` (or a failed one): lets go of its descriptors of the
/// child's leases (the child holds them).
pub fn in_parent() {
    FOR_CHILD.lock().clear();
}

/// In the child, after `fork`: makes the leases [`prepare`] took its own, or moves the
/// memory of those it could not take at once (see the module docs).
pub fn in_child() {
    let made = std::mem::take(&mut *FOR_CHILD.lock());
    for child in made {
        adopt(child);
    }
}

/// A read lease on the file of `entry`, through a new open file description, its breaks
/// signalled as this module's are: to this process's thread that answers breaks until the
/// child names its own (that thread ignores a lease it does not know; the child answers a
/// break that came meanwhile when it adopts the lease). The owner is named before the
/// lease is taken: the kernel names the whole process where none is, and a thread of the
/// process that does not block the signal would be ended by it.
fn lease_again(entry: &Entry) -> io::Result<File> {
    let file = File::open(format!("/proc/self/fd/{}", entry.fd()))?;
    let fd = file.as_raw_fd();
    fcntl_int(fd, F_SETSIG, handler::signal())?;
    super::set_owner(fd, handler::thread()?)?;
    fcntl_int(fd, libc::F_SETLEASE, libc::F_RDLCK)?;
    Ok(file)
}

/// Makes the lease taken for this child its own, guarding `child.guarded`; where there is
/// none, moves that memory now.
fn adopt(child: ForChild) {
    let Some(file) = child.file else {
        move_now(&child.guarded);
        return;
    };
    let tid = match handler::thread() {
        Ok(tid) => tid,
        Err(_) => {
            move_now(&child.guarded);
            return; // `file` closes here: its lease goes with it
        }
    };
    let fd = file.as_raw_fd();
    let entry = Arc::new(Entry {
        file,
        pid: std::process::id(),
        state: Mutex::new(State {
            phase: Phase::Held,
            guarded: child.guarded,
        }),
        successor: ForkMutex::new(None),
    });
    handler::register(&entry);
    // Should this fail, the thread still looks at every lease once a second.
    let _ = super::set_owner(fd, tid);
    *child.parent.successor.lock() = Some(entry.clone());
    handler::count_adopted();
    // A writer that came since the fork waits for this lease: answered now.
    handler::answer(&entry);
}

/// Moves `ranges` of this process into anonymous memory of its own.
fn move_now(ranges: &[Range<usize>]) {
    if let Ok(bytes) = anon::move_ranges(ranges) {
        handler::count_moved_at_start(bytes);
    }
}
