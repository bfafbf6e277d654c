//! The CUDA driver entry points of initialisation, error strings, devices and primary
//! contexts, and what every entry point shares ([`entry`], [`put`]). Memory is in
//! [`crate::driver_memory`], streams and events in [`crate::driver_streams`], copies in
//! [`crate::copies`]. Each call is counted under `calls.NAME`.

use crate::errors::{self, CUresult, INVALID_CONTEXT, INVALID_VALUE, NO_DEVICE, SUCCESS};
use crate::{config, context, stats, streams};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// `CUdevice`.
pub(crate) type CUdevice = c_int;
/// `CUcontext`, `CUstream`, `CUevent`: opaque handles.
pub(crate) type Handle = *mut c_void;

/// Runs one entry point: counts the call and turns a panic into `CUDA_ERROR_UNKNOWN`.
pub(crate) fn entry(name: &str, f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    stats::call(name);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            stats::violation("panic", &format!("{name} panicked inside the stand-in"));
            errors::UNKNOWN
        }
    }
}

/// Writes `value` through `out` (a null pointer is `CUDA_ERROR_INVALID_VALUE`).
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for a write by the caller's contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// `cuInit`.
#[no_mangle]
pub extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    entry("cuInit", || {
        context::init();
        if context::devices() == 0 {
            return Err(NO_DEVICE);
        }
        Ok(())
    })
}

/// `cuDriverGetVersion`: 12.8.
///
/// # Safety
/// `version` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuDriverGetVersion", || unsafe { put(version, 12080) })
}

/// Writes `pick` of `code`'s name and description through `out`: null, and
/// `CUDA_ERROR_INVALID_VALUE`, for a code the stand-in does not know.
///
/// # Safety
/// `out` must be null or valid for a write.
unsafe fn describe_into(
    code: CUresult,
    out: *mut *const c_char,
    pick: fn((&'static CStr, &'static CStr)) -> &'static CStr,
) -> Result<(), CUresult> {
    let text = errors::describe(code).map(|d| pick(d).as_ptr());
    // SAFETY: the caller's contract.
    unsafe { put(out, text.unwrap_or(std::ptr::null())) }?;
    text.map(|_| ()).ok_or(INVALID_VALUE)
}

/// `cuGetErrorName`.
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuGetErrorName", || unsafe {
        describe_into(code, out, |(name, _)| name)
    })
}

/// `cuGetErrorString`.
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuGetErrorString", || unsafe {
        describe_into(code, out, |(_, text)| text)
    })
}

/// `cuDeviceGetCount`.
///
/// # Safety
/// `count` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    entry("cuDeviceGetCount", || {
        context::ready()?;
        let n = c_int::try_from(context::devices()).unwrap_or(c_int::MAX);
        // SAFETY: the caller's contract.
        unsafe { put(count, n) }
    })
}

/// `cuDeviceGet`.
///
/// # Safety
/// `device` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    entry("cuDeviceGet", || {
        context::ready()?;
        context::device(ordinal)?;
        // SAFETY: the caller's contract.
        unsafe { put(device, ordinal) }
    })
}

/// `cuDeviceGetName`: names the stand-in plainly.
///
/// # Safety
/// `name` must be valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetName", || {
        context::ready()?;
        let d = context::device(dev)?;
        let text = format!("CUDA stand-in {d} (host memory, no GPU)");
        let cap = usize::try_from(len).map_err(|_| INVALID_VALUE)?;
        if name.is_null() || cap == 0 {
            return Err(INVALID_VALUE);
        }
        let n = text.len().min(cap - 1);
        // SAFETY: name is writable for cap > n bytes (the caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            *name.add(n) = 0;
        }
        Ok(())
    })
}

/// `cuDeviceTotalMem_v2`.
///
/// # Safety
/// `bytes` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    entry("cuDeviceTotalMem_v2", || {
        context::ready()?;
        context::device(dev)?;
        let total = usize::try_from(config::get().device_memory).unwrap_or(usize::MAX);
        // SAFETY: the caller's contract.
        unsafe { put(bytes, total) }
    })
}

/// `cuDeviceGetAttribute`: unified addressing, host memory mapping, compute capability 9.0
/// and PCI location; any other attribute counts as not implemented.
///
/// # Safety
/// `value` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceGetAttribute", || {
        context::ready()?;
        let d = context::device(dev)?;
        let v = match attribute {
            19 | 41 => 1,            // CAN_MAP_HOST_MEMORY, UNIFIED_ADDRESSING
            75 => 9,                 // COMPUTE_CAPABILITY_MAJOR
            76 | 34 | 50 => 0,       // COMPUTE_CAPABILITY_MINOR, PCI_DEVICE_ID, PCI_DOMAIN_ID
            33 => 0x10 + d as c_int, // PCI_BUS_ID
            _ => {
                stats::unimplemented(&format!("cuDeviceGetAttribute({attribute})"));
                return Err(INVALID_VALUE);
            }
        };
        // SAFETY: the caller's contract.
        unsafe { put(value, v) }
    })
}

/// `cuDevicePrimaryCtxRetain`.
///
/// # Safety
/// `ctx` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRetain", || {
        context::ready()?;
        let d = context::device(dev)?;
        // SAFETY: the caller's contract.
        unsafe { put(ctx, context::context_handle(d)) }?;
        stats::live("primary_context_retains", 1);
        Ok(())
    })
}

/// `cuDevicePrimaryCtxRelease_v2`.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRelease_v2", || {
        context::device(dev)?;
        stats::live("primary_context_retains", -1);
        Ok(())
    })
}

/// `cuCtxSetCurrent` (null: no context). Works after the device is lost, so that the
/// memory of a lost device can still be freed.
#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    entry("cuCtxSetCurrent", || {
        context::unless_lost(context::ready())?;
        if ctx.is_null() {
            context::set_current(None);
            return Ok(());
        }
        let d = context::context_device(ctx).ok_or_else(|| {
            stats::violation("invalid_handle", &format!("cuCtxSetCurrent({ctx:?})"));
            INVALID_CONTEXT
        })?;
        context::set_current(Some(d));
        Ok(())
    })
}

/// `cuCtxGetCurrent`.
///
/// # Safety
/// `ctx` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut Handle) -> CUresult {
    entry("cuCtxGetCurrent", || {
        context::ready()?;
        let h = match context::current("cuCtxGetCurrent") {
            Ok(d) => context::context_handle(d),
            Err(_) => std::ptr::null_mut(),
        };
        // SAFETY: the caller's contract.
        unsafe { put(ctx, h) }
    })
}

/// `cuCtxGetDevice`.
///
/// # Safety
/// `dev` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    entry("cuCtxGetDevice", || {
        let d = context::current("cuCtxGetDevice")?;
        // SAFETY: the caller's contract.
        unsafe { put(dev, d as CUdevice) }
    })
}

/// `cuCtxSynchronize`: waits for every stream.
#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    entry("cuCtxSynchronize", || {
        context::current("cuCtxSynchronize")?;
        streams::synchronize_all()
    })
}
