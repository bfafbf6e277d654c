//! The counters: calls, live objects (and their peaks), violations of the CUDA and cuFile
//! contracts, calls to entry points not implemented, faults fired. Read them with
//! [`fastensor_stand_in_stats`], or from the file `FASTENSOR_STAND_IN_STATS` names, written
//! when the process exits.

use std::collections::BTreeMap;
use std::ffi::c_char;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

static COUNTERS: Mutex<BTreeMap<String, i64>> = Mutex::new(BTreeMap::new());

/// Violations printed to stderr before the rest are only counted.
const PRINTED_VIOLATIONS: u32 = 20;
static PRINTED: AtomicU32 = AtomicU32::new(0);

fn counters() -> MutexGuard<'static, BTreeMap<String, i64>> {
    COUNTERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds `delta` to counter `key`.
pub(crate) fn add(key: &str, delta: i64) {
    *counters().entry(key.to_string()).or_insert(0) += delta;
}

/// Counts one call of the entry point `name`.
pub(crate) fn call(name: &str) {
    add(&format!("calls.{name}"), 1);
}

/// Adds `delta` to the gauge `live.NAME` and keeps its maximum in `peak.NAME`.
pub(crate) fn live(name: &str, delta: i64) {
    let mut c = counters();
    let now = {
        let v = c.entry(format!("live.{name}")).or_insert(0);
        *v += delta;
        *v
    };
    let peak = c.entry(format!("peak.{name}")).or_insert(0);
    *peak = (*peak).max(now);
}

/// Raises `peak.NAME` to `value` when higher.
pub(crate) fn peak(name: &str, value: i64) {
    let mut c = counters();
    let peak = c.entry(format!("peak.{name}")).or_insert(0);
    *peak = (*peak).max(value);
}

/// Counts a broken contract: something a real driver would reject, crash on or corrupt.
pub(crate) fn violation(kind: &str, detail: &str) {
    add("violations", 1);
    add(&format!("violation.{kind}"), 1);
    if PRINTED.fetch_add(1, Ordering::Relaxed) < PRINTED_VIOLATIONS {
        eprintln!("CUDA stand-in: violation {kind}: {detail}");
    }
}

/// Counts a call of an entry point this library does not implement.
pub(crate) fn unimplemented(name: &str) {
    add("unimplemented", 1);
    add(&format!("unimplemented.{name}"), 1);
}

/// Counts a fault injected from `FASTENSOR_STAND_IN_FAULT`.
pub(crate) fn fault(name: &str) {
    add(&format!("fault.{name}"), 1);
}

/// Every counter, one `name value` a line, sorted; `violations` and `unimplemented` always.
pub(crate) fn snapshot() -> String {
    let mut c = counters().clone();
    for key in ["violations", "unimplemented"] {
        c.entry(key.into()).or_insert(0);
    }
    let errors = &crate::config::get().errors;
    c.insert("config_errors".into(), errors.len() as i64);
    c.iter().map(|(k, v)| format!("{k} {v}\n")).collect()
}

/// Writes the counters (see the crate documentation) into `buf` (`cap` bytes, may be null
/// when `cap` is 0), NUL-terminated when room allows; returns their full length in bytes, so
/// a caller can retry with a larger buffer.
///
/// # Safety
/// `buf` must be valid for writes of `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn fastensor_stand_in_stats(buf: *mut c_char, cap: usize) -> usize {
    let text = snapshot();
    if !buf.is_null() && cap > 0 {
        let n = text.len().min(cap - 1);
        // SAFETY: the caller guarantees buf is writable for cap bytes; n + 1 <= cap.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

/// Writes the counters to `FASTENSOR_STAND_IN_STATS` (if set) as the process exits.
extern "C" fn write_at_exit() {
    let Some(path) = &crate::config::get().stats_path else {
        return;
    };
    let path = path.replace("%p", &std::process::id().to_string());
    // Another thread may hold the lock forever at exit: never wait for it.
    let Ok(c) = COUNTERS.try_lock() else { return };
    drop(c);
    if let Err(e) = std::fs::write(&path, snapshot()) {
        eprintln!("CUDA stand-in: cannot write the counters to {path}: {e}");
    }
}

/// Runs [`write_at_exit`] when the library is unloaded or the process exits.
#[used]
#[link_section = ".fini_array"]
static WRITE_AT_EXIT: extern "C" fn() = write_at_exit;
