//! The CUDA driver's memory entry points: device memory, page-locked host memory and pointer
//! attributes (the memory itself is kept by [`crate::memory`]).

use crate::driver::{entry, put, Handle};
use crate::errors::{CUresult, INVALID_VALUE, OUT_OF_MEMORY};
use crate::{config, context, memory, stats};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::AtomicU64;

static DEVICE_ALLOCS: AtomicU64 = AtomicU64::new(0);
static PINNED_ALLOCS: AtomicU64 = AtomicU64::new(0);

/// `cuMemAlloc_v2`.
///
/// # Safety
/// `ptr` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(ptr: *mut u64, bytes: usize) -> CUresult {
    entry("cuMemAlloc_v2", || {
        let d = context::current("cuMemAlloc")?;
        let from = config::get().faults.device_oom_from;
        if context::fault_fires("device-oom", &DEVICE_ALLOCS, from) {
            return Err(OUT_OF_MEMORY);
        }
        let p = memory::alloc_device(bytes, d, config::get().device_memory)?;
        // SAFETY: the caller's contract.
        unsafe { put(ptr, p) }.inspect_err(|_| {
            let _ = memory::free_device(p);
        })
    })
}

/// `cuMemFree_v2`: frees even once the device is lost (and then returns the loss).
#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: u64) -> CUresult {
    entry("cuMemFree_v2", || {
        context::unless_lost(context::current("cuMemFree"))?;
        memory::free_device(ptr)?;
        context::lost().map_or(Ok(()), Err)
    })
}

/// `cuMemGetInfo_v2`.
///
/// # Safety
/// `free` and `total` must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry("cuMemGetInfo_v2", || {
        let d = context::current("cuMemGetInfo")?;
        let size = config::get().device_memory;
        let left = size.saturating_sub(memory::device_used(d));
        // SAFETY: the caller's contract.
        unsafe {
            put(free, usize::try_from(left).unwrap_or(usize::MAX))?;
            put(total, usize::try_from(size).unwrap_or(usize::MAX))
        }
    })
}

/// Allocates pinned memory for `cuMemHostAlloc` and `cuMemAllocHost_v2`.
///
/// # Safety
/// `out` must be valid for a write.
unsafe fn host_alloc(call: &str, out: *mut *mut c_void, bytes: usize) -> Result<(), CUresult> {
    context::current(call)?;
    let from = config::get().faults.pinned_oom_from;
    if context::fault_fires("pinned-oom", &PINNED_ALLOCS, from) {
        return Err(OUT_OF_MEMORY);
    }
    if bytes == 0 {
        return Err(INVALID_VALUE);
    }
    let p = memory::alloc_pinned(bytes, config::get().pinned_memory)?;
    // SAFETY: the caller's contract.
    unsafe { put(out, p.cast::<c_void>()) }.inspect_err(|_| {
        let _ = memory::free_pinned(p as usize);
    })
}

/// `cuMemHostAlloc` (every flag accepted).
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    out: *mut *mut c_void,
    bytes: usize,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuMemHostAlloc", || unsafe {
        host_alloc("cuMemHostAlloc", out, bytes)
    })
}

/// `cuMemAllocHost_v2`.
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(out: *mut *mut c_void, bytes: usize) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuMemAllocHost_v2", || unsafe {
        host_alloc("cuMemAllocHost", out, bytes)
    })
}

/// `cuMemFreeHost`: frees even once the device is lost (and then returns the loss).
#[no_mangle]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry("cuMemFreeHost", || {
        context::unless_lost(context::current("cuMemFreeHost"))?;
        memory::free_pinned(p as usize)?;
        context::lost().map_or(Ok(()), Err)
    })
}

/// `cuMemHostRegister_v2`.
#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    entry("cuMemHostRegister_v2", || {
        context::current("cuMemHostRegister")?;
        if p.is_null() || memory::is_device_address(p as u64) {
            return Err(INVALID_VALUE);
        }
        memory::register_host(p as usize, bytes)
    })
}

/// `cuMemHostUnregister`.
#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    entry("cuMemHostUnregister", || {
        context::unless_lost(context::current("cuMemHostUnregister"))?;
        memory::unregister_host(p as usize)
    })
}

/// What a pointer points to, for the attribute queries.
#[derive(Debug, Clone, Copy)]
enum Pointee {
    Device { base: u64, len: usize, device: u32 },
    Pinned { base: usize, len: usize },
    Unknown,
}

fn pointee(ptr: u64) -> Pointee {
    if let Some((base, len, device)) = memory::device_allocation(ptr) {
        return Pointee::Device { base, len, device };
    }
    match memory::pinned_allocation(ptr as usize) {
        Some((base, len)) => Pointee::Pinned { base, len },
        None => Pointee::Unknown,
    }
}

/// Writes attribute `attribute` of `p` (pointing to `ptr`) through `data`.
///
/// # Safety
/// `data` must be valid for a write of the attribute's type.
unsafe fn write_attribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: u64,
    p: Pointee,
) -> Result<(), CUresult> {
    // SAFETY: every `put` below writes the type cuda.h gives for the attribute, which the
    // caller guarantees `data` can hold.
    unsafe {
        match (attribute, p) {
            (1, Pointee::Device { device, .. }) => {
                put(data.cast(), context::context_handle(device))
            }
            (1, Pointee::Pinned { .. }) => put(data.cast(), context::context_handle(0)),
            (1, Pointee::Unknown) => put(data.cast::<Handle>(), std::ptr::null_mut()),
            (2, Pointee::Device { .. }) => put(data.cast::<c_uint>(), 2),
            (2, Pointee::Pinned { .. }) => put(data.cast::<c_uint>(), 1),
            (2, Pointee::Unknown) => put(data.cast::<c_uint>(), 0),
            (3, Pointee::Device { .. } | Pointee::Pinned { .. }) => put(data.cast::<u64>(), ptr),
            (4, Pointee::Pinned { .. }) => put(data.cast::<u64>(), ptr),
            (9, Pointee::Device { device, .. }) => put(data.cast::<c_int>(), device as c_int),
            (9, Pointee::Pinned { .. }) => put(data.cast::<c_int>(), 0),
            (11, Pointee::Device { base, .. }) => put(data.cast::<u64>(), base),
            (11, Pointee::Pinned { base, .. }) => put(data.cast::<u64>(), base as u64),
            (12, Pointee::Device { len, .. } | Pointee::Pinned { len, .. }) => {
                put(data.cast::<usize>(), len)
            }
            (1..=4 | 9 | 11 | 12, _) => Err(INVALID_VALUE),
            _ => {
                stats::unimplemented(&format!("cuPointerGetAttribute({attribute})"));
                Err(INVALID_VALUE)
            }
        }
    }
}

/// `cuPointerGetAttribute`: context, memory type, device and host pointer, device ordinal,
/// range start and size. Pageable host memory is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `data` must be valid for a write of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: u64,
) -> CUresult {
    entry("cuPointerGetAttribute", || {
        context::ready()?;
        match pointee(ptr) {
            Pointee::Unknown => Err(INVALID_VALUE),
            // SAFETY: the caller's contract.
            p => unsafe { write_attribute(data, attribute, ptr, p) },
        }
    })
}

/// `cuPointerGetAttributes`: as [`cuPointerGetAttribute`], several at once; pageable host
/// memory has memory type 0 and a null context.
///
/// # Safety
/// `attributes` and `data` must hold `count` entries, each `data[i]` valid for a write of
/// attribute `attributes[i]`'s type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attributes: *const c_int,
    data: *mut *mut c_void,
    ptr: u64,
) -> CUresult {
    entry("cuPointerGetAttributes", || {
        context::ready()?;
        if attributes.is_null() || data.is_null() {
            return Err(INVALID_VALUE);
        }
        let p = pointee(ptr);
        for i in 0..count as usize {
            // SAFETY: both arrays hold `count` entries (the caller's contract).
            let (attribute, out) = unsafe { (*attributes.add(i), *data.add(i)) };
            // SAFETY: out is valid for the attribute's type (the caller's contract).
            unsafe { write_attribute(out, attribute, ptr, p) }?;
        }
        Ok(())
    })
}
