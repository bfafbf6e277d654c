//! A caching allocator for torch's large CPU tensors, opt-in and undone when its last user
//! leaves.
//!
//! torch allocates a CPU tensor's memory with `posix_memalign` and frees it with `free`,
//! both called from `libc10.so`. Large blocks are then mappings of their own (glibc maps
//! them, or returns them to the system when freed), so every training step faults its
//! activations in again: on some virtual machines that costs 1-2 CPU seconds per GiB, more
//! than the step's compute. Offload makes this worse, since it frees each activation as soon
//! as it is written. Here, while a user has the allocator enabled, `libc10.so`'s calls to
//! `posix_memalign`, `free` and `realloc` are redirected (its GOT entries, see [`crate::got`]):
//! requests of at least the users' threshold are served from a [`BlockPool`] of page-aligned
//! blocks, and such blocks go back to the pool when torch frees them, to serve the next
//! request of about the same size with memory already faulted in. Every other call goes to
//! glibc unchanged; no other library's calls are affected.
//!
//! Who owns what: the pool owns every block; torch owns a block from the `posix_memalign`
//! that returned it to the `free` that gives it back. The pool keeps at most half again the
//! most it had handed out at once (see [`BlockPool`]); `trim` releases its idle blocks.
//!
//! The redirection's life ([`Hook`]): the first user (`torch_allocator_enable`: a
//! `caching_allocator` block, an `offload(caching_allocator=True)` session) installs it;
//! further users only count. It is removed (each GOT slot given back the address it held,
//! its page its protection) once **no user is left and no block is out**: a block torch
//! still holds will come back through `libc10.so`'s `free`, which must then still reach the
//! pool (glibc's `free` on a pool block would corrupt its heap). So when the last user
//! leaves while tensors still hold blocks, the redirection stays, serves nothing new (with
//! no user every request goes to glibc), and the `free` that gives the last block back
//! removes it. All of this happens under the one lock the hooks take, so a block is only
//! handed out while a user is enabled (checked again under the lock), and removal only
//! happens with none out: no pool block can ever reach glibc's `free`.

use crate::got;
use fastensor::offload::{BlockPool, PoolStats};
use fastensor::HostBuffer;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The library whose allocation calls are redirected.
const LIBRARY: &str = "libc10.so";
/// The symbols redirected, `free` and `realloc` first: no block is handed out before they
/// recognise it.
const SYMBOLS: [&str; 3] = ["free", "realloc", "posix_memalign"];
/// Blocks are page-aligned: `posix_memalign` requests aligned to more go to glibc.
const PAGE: usize = 4096;

/// Requests of at least this many bytes come from the pool; `usize::MAX` while no user has
/// it enabled. Written under the lock; read without it as a fast path, and again under it
/// before a block is handed out.
static MIN_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);
/// True while a block may be out (until then `free` need not take the lock). Set under the
/// lock before a block is handed out, cleared when the redirection is removed.
static HANDED_OUT: AtomicBool = AtomicBool::new(false);
static STATE: Lock<State> = Lock::new(State::new());

/// Whether `libc10.so`'s GOT entries point here.
enum Hook {
    /// The GOT holds what the dynamic linker put there (never installed, or restored).
    Removed,
    /// The slots written, to be restored.
    Installed(Vec<got::Redirected>),
    /// Restoring failed (an `mprotect` refused): the slots are left as they are and the
    /// allocator is not enabled again in this process (no block is out: nothing depends on
    /// the redirection any more).
    Stuck,
}

/// The pool, the blocks torch holds (by address), who has the allocator enabled, and the
/// redirection.
struct State {
    pool: Option<BlockPool>,
    held: Option<HashMap<usize, HostBuffer>>,
    /// The thresholds of the users that enabled it, by token.
    users: Vec<(u64, usize)>,
    next_token: u64,
    /// Requests the pool could not serve (no memory): sent to glibc instead.
    fallbacks: u64,
    hook: Hook,
    /// How many times the redirection was installed, and removed.
    installs: u64,
    removals: u64,
    /// Why the last install or removal failed.
    error: Option<String>,
}

impl State {
    const fn new() -> Self {
        State {
            pool: None,
            held: None,
            users: Vec::new(),
            next_token: 1,
            fallbacks: 0,
            hook: Hook::Removed,
            installs: 0,
            removals: 0,
            error: None,
        }
    }

    fn pool(&mut self) -> &mut BlockPool {
        self.pool.get_or_insert_with(BlockPool::new)
    }

    fn held(&mut self) -> &mut HashMap<usize, HostBuffer> {
        self.held.get_or_insert_with(HashMap::new)
    }

    /// Publishes the threshold the enabled users ask for (the smallest).
    fn publish(&self) {
        let min = self
            .users
            .iter()
            .map(|&(_, m)| m)
            .min()
            .unwrap_or(usize::MAX);
        MIN_BYTES.store(min, Ordering::SeqCst);
    }

    /// Installs the redirection unless it is installed. Returns why it cannot be.
    fn install(&mut self) -> Result<(), String> {
        match self.hook {
            Hook::Installed(_) => return Ok(()),
            Hook::Stuck => {
                return Err(format!(
                    "disabled in this process: {}",
                    self.error.as_deref().unwrap_or("an earlier removal failed")
                ))
            }
            Hook::Removed => {}
        }
        let result = redirect_library();
        match result {
            Ok(done) => {
                self.hook = Hook::Installed(done);
                self.installs += 1;
                Ok(())
            }
            Err(why) => {
                self.error = Some(why.clone());
                Err(why)
            }
        }
    }

    /// Removes the redirection when nothing depends on it any more: no user, no block out.
    fn remove_if_unused(&mut self) {
        if !self.users.is_empty() || self.held.as_ref().is_some_and(|h| !h.is_empty()) {
            return;
        }
        let Hook::Installed(done) = &self.hook else {
            return;
        };
        // SAFETY: `libc10.so` is still loaded (Python never unloads it) and nothing depends
        // on the redirection: no block is out (checked above, under the lock every hand-out
        // takes) and, with no user, none will be handed out. A thread that read a slot just
        // before may still enter a hook once more: the hooks stay (this module is never
        // unloaded) and pass such calls to glibc.
        match unsafe { got::restore(done) } {
            Ok(foreign) => {
                if !foreign.is_empty() {
                    self.error = Some(format!(
                        "{LIBRARY}'s slots of {foreign:?} were rewritten by someone else while \
                         redirected; left as they were"
                    ));
                }
                self.hook = Hook::Removed;
                self.removals += 1;
                HANDED_OUT.store(false, Ordering::SeqCst);
            }
            Err(e) => {
                self.error = Some(format!("cannot restore {LIBRARY}'s GOT: {e}"));
                self.hook = Hook::Stuck;
            }
        }
    }
}

/// Each redirected symbol and the hook that replaces it, in [`SYMBOLS`]' order.
fn hooks() -> [(&'static str, usize); 3] {
    [
        (SYMBOLS[0], pool_free as *const () as usize),
        (SYMBOLS[1], pool_realloc as *const () as usize),
        (SYMBOLS[2], pool_posix_memalign as *const () as usize),
    ]
}

/// Redirects `libc10.so`'s allocation calls to the hooks below.
fn redirect_library() -> Result<Vec<got::Redirected>, String> {
    if got::find_loaded(LIBRARY).is_empty() {
        return Err(format!("{LIBRARY} is not loaded (import torch first)"));
    }
    register_fork_handlers()?;
    let redirect = hooks();
    // SAFETY: each function has the signature and the semantics of the symbol it replaces,
    // is reentrant across threads, and lives as long as the process (this module is never
    // unloaded: Python does not unload extension modules); libc10 is never unloaded either.
    // Installs and removals happen under the state lock, so they do not race.
    let done = unsafe { got::redirect(LIBRARY, &redirect) }.map_err(|e| e.to_string())?;
    if !done.iter().any(|r| r.slot().symbol() == "posix_memalign") {
        // Nothing would be served from the pool: put the rest back.
        // SAFETY: the slots were just written, and no block was handed out.
        let _ = unsafe { got::restore(&done) };
        return Err(format!("{LIBRARY} does not import posix_memalign"));
    }
    Ok(done)
}

/// Registers the fork handlers once per process.
fn register_fork_handlers() -> Result<(), String> {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if REGISTERED.load(Ordering::SeqCst) {
        return Ok(());
    }
    // SAFETY: registered once (callers hold the state lock); the handlers only take and
    // release the lock.
    let rc = unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
    if rc != 0 {
        return Err(format!("pthread_atfork failed ({rc})"));
    }
    REGISTERED.store(true, Ordering::SeqCst);
    Ok(())
}

/// A spin lock that a `fork` cannot leave held in the child: the allocation hooks run on
/// any thread, inside torch's allocator, where a blocking lock held across a `fork` (a data
/// loader's workers) would deadlock the child's first allocation.
struct Lock<T> {
    busy: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through `with`, which holds `busy` exclusively.
unsafe impl<T: Send> Sync for Lock<T> {}

impl<T> Lock<T> {
    const fn new(value: T) -> Self {
        Lock {
            busy: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    fn acquire(&self) {
        let mut spins = 0u32;
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn release(&self) {
        self.busy.store(false, Ordering::Release);
    }

    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        self.acquire();
        struct Release<'a, T>(&'a Lock<T>);
        impl<T> Drop for Release<'_, T> {
            fn drop(&mut self) {
                self.0.release();
            }
        }
        let _release = Release(self);
        // SAFETY: `busy` is held until `_release` drops, so this is the only reference.
        f(unsafe { &mut *self.value.get() })
    }
}

extern "C" fn before_fork() {
    STATE.acquire();
}

extern "C" fn after_fork() {
    STATE.release();
}

/// `posix_memalign` for `libc10.so`: large requests from the pool while a user has it
/// enabled.
unsafe extern "C" fn pool_posix_memalign(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
) -> c_int {
    if size >= MIN_BYTES.load(Ordering::Relaxed)
        && align.is_power_of_two()
        && align <= PAGE
        && !out.is_null()
    {
        let block = STATE.with(|s| {
            // Again under the lock: the last user may have left (and the redirection been
            // removed) since the load above; a block handed out now would reach glibc.
            if size < MIN_BYTES.load(Ordering::SeqCst) || !matches!(s.hook, Hook::Installed(_)) {
                return None;
            }
            match s.pool().take(size) {
                Ok(mut buf) => {
                    let p = buf.as_mut_ptr();
                    s.held().insert(p as usize, buf);
                    HANDED_OUT.store(true, Ordering::SeqCst);
                    Some(p)
                }
                Err(_) => {
                    s.fallbacks += 1;
                    None
                }
            }
        });
        if let Some(p) = block {
            // SAFETY: `out` is the caller's non-null result pointer.
            unsafe { *out = p.cast() };
            return 0;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to the function it meant to call.
    unsafe { libc::posix_memalign(out, align, size) }
}

/// Whether `p` may be one of the pool's blocks (the lock need not be taken otherwise).
fn maybe_ours(p: *mut c_void) -> bool {
    !p.is_null() && (p as usize) % PAGE == 0 && HANDED_OUT.load(Ordering::Acquire)
}

/// `free` for `libc10.so`: the pool's blocks go back to it, everything else to glibc. The
/// block that was the last one out after the last user left removes the redirection.
unsafe extern "C" fn pool_free(p: *mut c_void) {
    if maybe_ours(p) {
        let ours = STATE.with(|s| match s.held().remove(&(p as usize)) {
            Some(buf) => {
                s.pool().give(buf);
                s.remove_if_unused();
                true
            }
            None => false,
        });
        if ours {
            return;
        }
    }
    // SAFETY: not one of the pool's blocks: memory glibc handed out, as the caller meant.
    unsafe { libc::free(p) }
}

/// `realloc` for `libc10.so`: a pool block moves to glibc memory (torch does not resize
/// tensor memory this way; this only keeps such a call correct).
unsafe extern "C" fn pool_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    let len = if maybe_ours(p) {
        STATE.with(|s| s.held().get(&(p as usize)).map(|b| b.len()))
    } else {
        None
    };
    let Some(len) = len else {
        // SAFETY: not one of the pool's blocks: glibc's, as the caller meant.
        return unsafe { libc::realloc(p, size) };
    };
    // SAFETY: malloc has no preconditions.
    let new = unsafe { libc::malloc(size.max(1)) };
    if new.is_null() {
        return new; // realloc's contract on failure: the old block stays the caller's
    }
    // SAFETY: `new` holds `size` bytes and the block at `p`, which torch still holds (it is
    // the caller's until given back below), `len`; the ranges do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), new.cast::<u8>(), size.min(len)) };
    // SAFETY: `p` is one of the pool's blocks (found above), given back once.
    unsafe { pool_free(p) };
    new
}

/// Installs the redirection if needed and serves requests of at least `min_bytes` from the
/// pool until `disable(token)`. Returns the token, or raises `RuntimeError` with the reason
/// the redirection is not possible here.
#[pyfunction]
fn torch_allocator_enable(min_bytes: usize) -> PyResult<u64> {
    STATE
        .with(|s| -> Result<u64, String> {
            s.install()?;
            let token = s.next_token;
            s.next_token += 1;
            s.users.push((token, min_bytes.max(1)));
            s.publish();
            Ok(token)
        })
        .map_err(pyo3::exceptions::PyRuntimeError::new_err)
}

/// Ends the use `token` stands for; the pool keeps serving while other uses remain. The
/// last one removes the redirection, at once when no block is out, else when the last
/// block comes back. Unknown tokens are ignored.
#[pyfunction]
fn torch_allocator_disable(token: u64) {
    STATE.with(|s| {
        s.users.retain(|&(t, _)| t != token);
        s.publish();
        s.remove_if_unused();
    });
}

/// Releases the pool's idle blocks to the system; returns the bytes released.
#[pyfunction]
fn torch_allocator_trim(py: Python<'_>) -> u64 {
    // Taken out under the lock, unmapped after it.
    let idle = STATE.with(|s| s.pool().trim());
    let bytes = idle.iter().map(|b| b.len() as u64).sum();
    py.detach(move || drop(idle));
    bytes
}

/// Whether the redirection is installed (and the last reason it could not be installed or
/// removed), how often it was, and the pool's counters.
#[pyfunction]
fn torch_allocator_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let (stats, held, users, min, fallbacks, slots, stuck, installs, removals, error) =
        STATE.with(|s| {
            let stats: PoolStats = s.pool().stats();
            let held = s.held().len();
            let slots = match &s.hook {
                Hook::Installed(done) => Some(done.len()),
                _ => None,
            };
            (
                stats,
                held,
                s.users.len(),
                MIN_BYTES.load(Ordering::Relaxed),
                s.fallbacks,
                slots,
                matches!(s.hook, Hook::Stuck),
                s.installs,
                s.removals,
                s.error.clone(),
            )
        });
    d.set_item("installed", slots.is_some())?;
    d.set_item("redirected_slots", slots.unwrap_or(0))?;
    d.set_item("stuck", stuck)?;
    d.set_item("installs", installs)?;
    d.set_item("removals", removals)?;
    if let Some(why) = error {
        d.set_item("reason", why)?;
    }
    d.set_item("enabled", users > 0)?;
    d.set_item(
        "min_bytes",
        if min == usize::MAX { None } else { Some(min) },
    )?;
    d.set_item("blocks_held", held)?;
    for (k, v) in [
        ("live_bytes", stats.live_bytes),
        ("idle_bytes", stats.idle_bytes),
        ("peak_live_bytes", stats.peak_live_bytes),
        ("hits", stats.hits),
        ("misses", stats.misses),
        ("released_blocks", stats.released_blocks),
        ("released_bytes", stats.released_bytes),
        ("fallbacks", fallbacks),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// `libc10.so`'s GOT slots of the redirected symbols as they are now: `(symbol, slot
/// address, the address it holds, whether its page is read-only between writes)`. For the
/// tests (the redirection is in place, or every slot holds what it held before); raises
/// `RuntimeError` when `libc10.so` is not loaded.
#[pyfunction]
fn torch_allocator_slots() -> PyResult<Vec<(String, usize, usize, bool)>> {
    let slots = got::slots(LIBRARY, &SYMBOLS)
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    Ok(slots
        .iter()
        .map(|s| {
            (
                s.symbol().to_string(),
                s.address(),
                s.value(),
                s.read_only(),
            )
        })
        .collect())
}

/// The addresses of the hooks, by symbol (what a redirected slot holds).
#[pyfunction]
fn torch_allocator_hooks() -> Vec<(&'static str, usize)> {
    hooks().to_vec()
}

/// The length of the pool block that starts at `address` while torch holds it (memory that
/// may be read up to that length), or None.
fn block_len(address: usize) -> Option<usize> {
    if address % PAGE != 0 || !HANDED_OUT.load(Ordering::Acquire) {
        return None;
    }
    STATE.with(|s| s.held().get(&address).map(|b| b.len()))
}

/// The length of the pool block holding the memory of `tensor` (a host tensor, array or
/// buffer) when that memory starts a block torch holds, else None.
#[pyfunction]
fn torch_allocator_block(tensor: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    use crate::errors::IntoPy;
    let lent = crate::memory::lend(tensor, crate::memory::Access::Read, "tensor").py_err()?;
    Ok(block_len(lent.region().addr()))
}

/// How many bytes from `address` may be read for memory of `nbytes` there: `nbytes`
/// rounded up to whole pages where a pool block held by torch starts at `address` and
/// spans them, else `nbytes`.
pub fn readable_len(address: usize, nbytes: usize) -> usize {
    let rounded = nbytes.div_ceil(PAGE) * PAGE;
    match block_len(address) {
        Some(block) if rounded <= block => rounded,
        _ => nbytes,
    }
}

/// Adds the allocator's functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(torch_allocator_enable, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_disable, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_trim, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_stats, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_block, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_slots, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_hooks, m)?)?;
    Ok(())
}
