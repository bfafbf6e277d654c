//! torch's CPU allocations served from the process's [`HostPool`] while a user asks for it
//! (an offload session, a `caching_allocator` block), through torch's own allocator slot
//! (`c10::SetCPUAllocator`, see [`crate::c10`]).
//!
//! torch allocates a CPU tensor's memory through its CPU allocator. Large blocks are then
//! mappings of their own (glibc maps them, or returns them to the system when freed), so
//! every training step faults its activations in again, and memory freed by one size of
//! tensor does not serve another. While a user has the pool enabled, requests of at least
//! the users' threshold come from the pool (page-aligned blocks reused step after step,
//! idle pages moved to whatever size is asked for), and smaller ones from torch's own
//! allocator. The offload store takes the buffers it reads back from the same pool, so
//! memory an offloaded activation frees serves the next one, or the read of an earlier one.
//!
//! Who owns what: the pool owns every block; a tensor owns one from its allocation to the
//! deleter that gives it back (each block's `DataPtr` carries the pool's deleter, so a
//! block comes back to the pool whatever allocator torch has by then). The pool keeps what
//! it had out at its peak; [`torch_allocator_trim`] gives the idle blocks back.
//!
//! Life: the first user installs the allocator; further users only count; when the last
//! one leaves, every request goes to torch's own allocator again at once (blocks still out
//! come back later through their deleter), but the object stays in torch's slot, passing
//! requests through, for the rest of the process. Memory lent through `raw_allocate`
//! (ideep's MKLDNN tensors, among others) carries no deleter: torch frees it through the
//! `raw_deleter` of whatever allocator holds the slot at the free, and only this object
//! tells a pool block from torch's own memory (torch's own deleter, glibc's `free`, would
//! abort the process on a pool block). Such a block may be freed at any time after the
//! window that made it, so the slot never goes back to an allocator that cannot tell.

use crate::c10::{DeleterFn, RawDataPtr, Torch};
use fastensor::fork::{ForkMutex, ForkOnceLock};
use fastensor::offload::HostPool;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Blocks are page-aligned.
const PAGE: usize = 4096;

/// Requests of at least this many bytes come from the pool; `usize::MAX` while no user has
/// it enabled.
static MIN_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Requests the pool could not serve (no memory): sent to torch's allocator instead.
static FALLBACKS: AtomicU64 = AtomicU64::new(0);
static POOL: ForkOnceLock<Arc<HostPool>> = ForkOnceLock::new();
static TORCH: ForkOnceLock<Result<Torch, String>> = ForkOnceLock::new();
static STATE: ForkMutex<State> = ForkMutex::lazy();

/// The process's host pool: torch's large CPU allocations while enabled, and the buffers
/// offload stores read back into.
pub fn pool() -> Arc<HostPool> {
    POOL.get_or_init(|| Arc::new(HostPool::new())).clone()
}

/// Who has the allocator enabled, and what happened to it.
#[derive(Default)]
struct State {
    /// The thresholds of the users that enabled it, by token.
    users: Vec<(u64, usize)>,
    next_token: u64,
    /// The pool serves torch's requests (from the first user's arrival to the last one's
    /// leaving); the object stays in the slot after, passing requests through.
    installed: bool,
    /// Times the pool started serving, and stopped.
    installs: u64,
    removals: u64,
    /// Why the allocator could not be installed, or was left in place.
    error: Option<String>,
}

impl State {
    /// Publishes the threshold the users ask for (the smallest).
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

fn torch() -> Result<&'static Torch, String> {
    TORCH
        .get_or_init(|| Torch::find(pool_allocate, pool_raw_deleter))
        .as_ref()
        .map_err(Clone::clone)
}

/// `allocate` of the replacement allocator: large requests from the pool while a user has
/// it enabled, the rest from torch's own allocator (which may throw when out of memory).
unsafe extern "C-unwind" fn pool_allocate(_this: *const c_void, n: usize) -> RawDataPtr {
    let Some(Ok(torch)) = TORCH.get() else {
        // The object this is a method of is only made once TORCH holds its Torch.
        std::process::abort()
    };
    if n >= MIN_BYTES.load(Ordering::Relaxed) {
        match pool().lend(n) {
            Ok(p) => return torch.data_ptr(p.as_ptr().cast(), pool_block_delete),
            Err(_) => {
                FALLBACKS.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    // SAFETY: torch's own allocator, called on its own object as torch would.
    unsafe { (torch.original_allocate)(torch.original, n) }
}

/// The deleter of the pool's blocks: back to the pool. A block the pool does not know (one
/// handed out before a `fork` whose child started a fresh pool) is left mapped, never
/// given to another allocator.
unsafe extern "C" fn pool_block_delete(p: *mut c_void) {
    if !p.is_null() {
        pool().reclaim(p as usize);
    }
}

/// `raw_deleter` of the replacement allocator (torch's `raw_deallocate` calls what it
/// returns on memory from `raw_allocate`, which may be the pool's or torch's own).
unsafe extern "C" fn pool_raw_deleter(_this: *const c_void) -> DeleterFn {
    pool_raw_delete
}

/// Frees memory from `raw_allocate`: a pool block goes back to the pool; memory torch's
/// allocator gave goes to its deleter. A page-aligned address that starts a mapping is a
/// pool block the pool no longer knows (see [`pool_block_delete`]), never glibc's (whose
/// blocks start after a header): it is left mapped.
unsafe extern "C" fn pool_raw_delete(p: *mut c_void) {
    if p.is_null() || pool().reclaim(p as usize) {
        return;
    }
    if (p as usize).is_multiple_of(PAGE) && starts_a_mapping(p as usize) {
        return;
    }
    let Some(Ok(torch)) = TORCH.get() else {
        std::process::abort()
    };
    // SAFETY: memory torch's own allocator handed out, freed as its deleter frees it.
    unsafe { (torch.original_deleter)(p) }
}

/// Whether `addr` is the first byte of one of the process's mappings.
fn starts_a_mapping(addr: usize) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return true; // cannot tell: leaking is safe, a wrong free is not
    };
    maps.lines().any(|l| {
        l.split('-')
            .next()
            .and_then(|s| usize::from_str_radix(s, 16).ok())
            == Some(addr)
    })
}

/// Serves torch's CPU requests of at least `min_bytes` from the pool until
/// `disable(token)`. Returns the token, or raises `RuntimeError` with the reason where torch's
/// allocator cannot be replaced.
#[pyfunction]
fn torch_allocator_enable(min_bytes: usize) -> PyResult<u64> {
    let mut st = STATE.lock();
    let result = (|| -> Result<(), String> {
        let torch = torch()?;
        if !st.installed {
            if !torch.set(torch.object()) {
                return Err(
                    "another CPU allocator is installed in torch with a higher priority".into(),
                );
            }
            st.installed = true;
            st.installs += 1;
        }
        Ok(())
    })();
    if let Err(why) = result {
        st.error = Some(why.clone());
        return Err(pyo3::exceptions::PyRuntimeError::new_err(why));
    }
    st.next_token += 1;
    let token = st.next_token;
    st.users.push((token, min_bytes.max(1)));
    st.publish();
    Ok(token)
}

/// Ends the use `token` stands for; the pool keeps serving while other uses remain. After
/// the last one torch's own allocator serves every request, through the object left in
/// the slot (see the module docs). Unknown tokens are ignored.
#[pyfunction]
fn torch_allocator_disable(token: u64) {
    let mut st = STATE.lock();
    st.users.retain(|&(t, _)| t != token);
    st.publish();
    if !st.users.is_empty() || !st.installed {
        return;
    }
    // The pool serves nothing from here (the threshold published above is `usize::MAX`):
    // the object stays in the slot, passing every request to torch's own allocator, and
    // frees the pool's blocks lent through `raw_allocate` when they come back (see the
    // module docs).
    st.installed = false;
    st.removals += 1;
    if let Ok(torch) = torch() {
        if torch.current() != torch.object() {
            st.error =
                Some("torch's CPU allocator was replaced by someone else; left as it is".into());
        }
    }
}

/// Releases the pool's idle blocks to the system; returns the bytes released.
#[pyfunction]
fn torch_allocator_trim(py: Python<'_>) -> u64 {
    let pool = pool();
    py.detach(move || pool.trim())
}

/// Whether the allocator is installed (and the last reason it could not be), how often it
/// was, and the pool's counters.
#[pyfunction]
fn torch_allocator_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    {
        let st = STATE.lock();
        d.set_item("installed", st.installed)?;
        d.set_item("installs", st.installs)?;
        d.set_item("removals", st.removals)?;
        d.set_item("enabled", !st.users.is_empty())?;
        if let Some(why) = &st.error {
            d.set_item("reason", why)?;
        }
    }
    let min = MIN_BYTES.load(Ordering::Relaxed);
    d.set_item("min_bytes", (min != usize::MAX).then_some(min))?;
    let s = pool().stats();
    for (k, v) in [
        ("blocks_held", s.lent_blocks),
        ("live_bytes", s.live_bytes),
        ("idle_bytes", s.idle_bytes),
        ("peak_bytes", s.peak_bytes),
        ("reused", s.reused),
        ("remapped", s.remapped),
        ("remapped_bytes", s.remapped_bytes),
        ("fresh", s.fresh),
        ("fresh_bytes", s.fresh_bytes),
        ("released_bytes", s.released_bytes),
        ("fallbacks", FALLBACKS.load(Ordering::Relaxed)),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// The length of the pool block holding the memory of `tensor` (a host tensor, array or
/// buffer) when that memory starts a block torch holds, else None.
#[pyfunction]
fn torch_allocator_block(tensor: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    use crate::errors::IntoPy;
    let lent = crate::memory::lend(tensor, crate::memory::Access::Read, "tensor").py_err()?;
    Ok(pool().lent_len(lent.region().addr()))
}

/// How many bytes from `address` may be read for memory of `nbytes` there: `nbytes`
/// rounded up to whole pages where a pool block lent to torch starts at `address` and
/// spans them, else `nbytes`.
pub fn readable_len(address: usize, nbytes: usize) -> usize {
    let rounded = nbytes.div_ceil(PAGE) * PAGE;
    if !address.is_multiple_of(PAGE) {
        return nbytes;
    }
    match pool().lent_len(address) {
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
    Ok(())
}
