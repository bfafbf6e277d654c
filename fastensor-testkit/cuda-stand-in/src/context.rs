//! Initialisation, devices, primary contexts and the context current on each thread, and the
//! sticky "device lost" state that the `device-lost` fault sets.

use crate::errors::{CUresult, INVALID_CONTEXT, INVALID_DEVICE, NOT_INITIALIZED, UNKNOWN};
use crate::{config, stats};
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

static INITIALIZED: AtomicBool = AtomicBool::new(false);
/// The process that called `cuInit`: CUDA does not survive `fork`, and in a child every call
/// fails with `CUDA_ERROR_NOT_INITIALIZED` (its streams' workers did not survive either).
static INIT_PID: AtomicU32 = AtomicU32::new(0);
/// 0 while the device works, else the error every call returns.
static LOST: AtomicU32 = AtomicU32::new(0);
/// Bytes moved to or from device memory so far (for `device-lost@BYTES`).
static MOVED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The device whose primary context is current on this thread.
    static CURRENT: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Context handles are this tag plus 16 times the device ordinal: never null, never memory.
const CTX_TAG: usize = 0x0c7c_0000_0000;

/// Marks the driver initialised.
pub(crate) fn init() {
    if !INITIALIZED.swap(true, Ordering::SeqCst) {
        INIT_PID.store(std::process::id(), Ordering::SeqCst);
    }
}

/// Number of devices.
pub(crate) fn devices() -> u32 {
    config::get().devices
}

/// `Ok` once `cuInit` ran and while the device is not lost.
pub(crate) fn ready() -> Result<(), CUresult> {
    if !INITIALIZED.load(Ordering::SeqCst) {
        stats::violation("not_initialized", "a driver call before cuInit");
        return Err(NOT_INITIALIZED);
    }
    if INIT_PID.load(Ordering::SeqCst) != std::process::id() {
        stats::add("calls_after_fork", 1);
        return Err(NOT_INITIALIZED);
    }
    match lost() {
        Some(code) => Err(code),
        None => Ok(()),
    }
}

/// The error every call returns once the device is lost.
pub(crate) fn lost() -> Option<CUresult> {
    match LOST.load(Ordering::SeqCst) {
        0 => None,
        code => Some(code),
    }
}

/// The device whose context is current on this thread; a call that needs one without it is
/// a violation named after `call`.
pub(crate) fn current(call: &str) -> Result<u32, CUresult> {
    ready()?;
    CURRENT.with(Cell::get).ok_or_else(|| {
        stats::violation(
            "no_context",
            &format!("{call} on a thread with no current context"),
        );
        INVALID_CONTEXT
    })
}

/// `check`'s error, unless the device is lost (then `Ok`): the calls that free memory still
/// work after a loss.
pub(crate) fn unless_lost<T>(check: Result<T, CUresult>) -> Result<(), CUresult> {
    match check {
        Err(e) if lost().is_none() => Err(e),
        _ => Ok(()),
    }
}

/// Makes `device`'s context current on this thread (`None`: no context).
pub(crate) fn set_current(device: Option<u32>) {
    CURRENT.with(|c| c.set(device));
}

/// The device with ordinal `ordinal`.
pub(crate) fn device(ordinal: i32) -> Result<u32, CUresult> {
    u32::try_from(ordinal)
        .ok()
        .filter(|&d| d < devices())
        .ok_or(INVALID_DEVICE)
}

/// The handle of `device`'s primary context.
pub(crate) fn context_handle(device: u32) -> *mut c_void {
    (CTX_TAG + 16 * device as usize) as *mut c_void
}

/// The device of a context handle.
pub(crate) fn context_device(handle: *mut c_void) -> Option<u32> {
    let off = (handle as usize).checked_sub(CTX_TAG)?;
    let device = u32::try_from(off / 16).ok()?;
    (off % 16 == 0 && device < devices()).then_some(device)
}

/// Counts `bytes` moved to or from device memory; fails (and loses the device) once the
/// `device-lost` fault's threshold is passed.
pub(crate) fn account(bytes: usize) -> Result<(), CUresult> {
    if let Some(code) = lost() {
        return Err(code);
    }
    let Some(limit) = config::get().faults.device_lost_after else {
        return Ok(());
    };
    let before = MOVED.fetch_add(bytes as u64, Ordering::SeqCst);
    if before + bytes as u64 > limit {
        if LOST.swap(UNKNOWN, Ordering::SeqCst) == 0 {
            stats::fault("device-lost");
        }
        return Err(UNKNOWN);
    }
    Ok(())
}

/// True when the call numbered by `counter` (incremented here) is at or after `from`, i.e.
/// when a fault starting at `from` fires for it; counted under `fault.NAME`.
pub(crate) fn fault_fires(name: &str, counter: &AtomicU64, from: Option<u64>) -> bool {
    let n = counter.fetch_add(1, Ordering::SeqCst);
    let fires = from.is_some_and(|f| n >= f);
    if fires {
        stats::fault(name);
    }
    fires
}
