//! A caching allocator for torch's large CPU tensors.
//!
//! torch allocates a CPU tensor's memory with `posix_memalign` and frees it with `free`,
//! both called from `libc10.so`. Large blocks are then mappings of their own (glibc maps
//! them, or returns them to the system when freed), so every training step faults its
//! activations in again: on some virtual machines that costs 1-2 CPU seconds per GiB, more
//! than the step's compute. Offload makes this worse, since it frees each activation as soon
//! as it is written. Here, `libc10.so`'s calls to `posix_memalign`, `free` and `realloc` are
//! redirected (its GOT entries, see [`fastensor::imports`]): while the allocator is enabled,
//! requests of at least its threshold are served from a [`BlockPool`] of page-aligned
//! blocks, and such blocks go back to the pool when torch frees them, to serve the next
//! request of about the same size with memory already faulted in. Every other call goes to
//! glibc unchanged; no other library's calls are affected.
//!
//! Who owns what: the pool owns every block; torch owns a block from the `posix_memalign`
//! that returned it to the `free` that gives it back. The pool keeps at most half again the
//! most it had handed out at once (see [`BlockPool`]); `trim` releases its idle blocks. Once
//! installed the redirection stays for the life of the process (memory handed out must come
//! back through it); disabled, it only recognises its own blocks on `free`.

use fastensor::offload::{BlockPool, PoolStats};
use fastensor::HostBuffer;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The library whose allocation calls are redirected.
const LIBRARY: &str = "libc10.so";
/// Blocks are page-aligned: `posix_memalign` requests aligned to more go to glibc.
const PAGE: usize = 4096;

/// Requests of at least this many bytes come from the pool; `usize::MAX` while disabled.
static MIN_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);
/// True once a block was handed out (until then `free` need not look).
static HANDED_OUT: AtomicBool = AtomicBool::new(false);
/// The outcome of installing the redirection (once per process).
static INSTALLED: OnceLock<Result<usize, String>> = OnceLock::new();
static STATE: Lock<State> = Lock::new(State::new());

/// The pool, the blocks torch holds (by address), and who has the allocator enabled.
struct State {
    pool: Option<BlockPool>,
    held: Option<HashMap<usize, HostBuffer>>,
    /// The thresholds of the users that enabled it, by token.
    users: Vec<(u64, usize)>,
    next_token: u64,
    /// Requests the pool could not serve (no memory): sent to glibc instead.
    fallbacks: u64,
}

impl State {
    const fn new() -> Self {
        State {
            pool: None,
            held: None,
            users: Vec::new(),
            next_token: 1,
            fallbacks: 0,
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

/// `posix_memalign` for `libc10.so`: large requests from the pool while enabled.
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
        let block = STATE.with(|s| match s.pool().take(size) {
            Ok(mut buf) => {
                let p = buf.as_mut_ptr();
                s.held().insert(p as usize, buf);
                Some(p)
            }
            Err(_) => {
                s.fallbacks += 1;
                None
            }
        });
        if let Some(p) = block {
            HANDED_OUT.store(true, Ordering::Release);
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

/// `free` for `libc10.so`: the pool's blocks go back to it, everything else to glibc.
unsafe extern "C" fn pool_free(p: *mut c_void) {
    if maybe_ours(p) {
        let ours = STATE.with(|s| match s.held().remove(&(p as usize)) {
            Some(buf) => {
                s.pool().give(buf);
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

/// Redirects `libc10.so`'s allocation calls (once per process). Returns how many slots were
/// redirected, or why it could not be done.
fn install() -> Result<usize, String> {
    INSTALLED
        .get_or_init(|| {
            if fastensor::imports::find_loaded(LIBRARY).is_empty() {
                return Err(format!("{LIBRARY} is not loaded (import torch first)"));
            }
            // SAFETY: registered once; the handlers only take and release the lock.
            let rc = unsafe {
                libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork))
            };
            if rc != 0 {
                return Err(format!("pthread_atfork failed ({rc})"));
            }
            // `free` and `realloc` first: no block is handed out before they recognise it.
            let redirect = [
                ("free", pool_free as *const () as usize),
                ("realloc", pool_realloc as *const () as usize),
                ("posix_memalign", pool_posix_memalign as *const () as usize),
            ];
            // SAFETY: each function has the signature and the semantics of the symbol it
            // replaces, is reentrant across threads, and lives as long as the process (this
            // module is never unloaded: Python does not unload extension modules).
            let done = unsafe { fastensor::imports::redirect(LIBRARY, &redirect) }
                .map_err(|e| e.to_string())?;
            if !done.iter().any(|r| r.symbol == "posix_memalign") {
                // Nothing would be served from the pool; the rest is harmless.
                return Err(format!("{LIBRARY} does not import posix_memalign"));
            }
            Ok(done.len())
        })
        .clone()
}

/// Installs the redirection if needed and serves requests of at least `min_bytes` from the
/// pool until `disable(token)`. Returns the token, or raises `RuntimeError` with the reason
/// the redirection is not possible here.
#[pyfunction]
fn torch_allocator_enable(min_bytes: usize) -> PyResult<u64> {
    install().map_err(pyo3::exceptions::PyRuntimeError::new_err)?;
    Ok(STATE.with(|s| {
        let token = s.next_token;
        s.next_token += 1;
        s.users.push((token, min_bytes.max(1)));
        s.publish();
        token
    }))
}

/// Ends the use `token` stands for; the pool keeps serving while other uses remain. Unknown
/// tokens are ignored.
#[pyfunction]
fn torch_allocator_disable(token: u64) {
    STATE.with(|s| {
        s.users.retain(|&(t, _)| t != token);
        s.publish();
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

/// Whether the redirection is installed (and why not), and the pool's counters.
#[pyfunction]
fn torch_allocator_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let (stats, held, users, min, fallbacks): (PoolStats, usize, usize, usize, u64) =
        STATE.with(|s| {
            let stats = s.pool().stats();
            let held = s.held().len();
            (
                stats,
                held,
                s.users.len(),
                MIN_BYTES.load(Ordering::Relaxed),
                s.fallbacks,
            )
        });
    let d = PyDict::new(py);
    match INSTALLED.get() {
        Some(Ok(n)) => {
            d.set_item("installed", true)?;
            d.set_item("redirected_slots", *n)?;
        }
        Some(Err(why)) => {
            d.set_item("installed", false)?;
            d.set_item("reason", why.clone())?;
        }
        None => d.set_item("installed", false)?,
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

/// The length of the pool block that starts at `address` while torch holds it (memory that
/// may be read up to that length), or None.
#[pyfunction]
fn torch_allocator_block(address: usize) -> Option<usize> {
    if address % PAGE != 0 || !HANDED_OUT.load(Ordering::Acquire) {
        return None;
    }
    STATE.with(|s| s.held().get(&address).map(|b| b.len()))
}

/// Adds the allocator's functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(torch_allocator_enable, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_disable, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_trim, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_stats, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_block, m)?)?;
    Ok(())
}
