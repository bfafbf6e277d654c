//! Copies and fills of device memory. Synchronous calls copy at once; asynchronous ones
//! between device memory and page-locked host memory are queued on their stream and run
//! later on its worker. With pageable host memory CUDA copies synchronously, and so does this
//! library (counted as `copies.async_pageable`).

use crate::driver::entry;
use crate::errors::{CUresult, INVALID_VALUE};
use crate::memory::DeviceRange;
use crate::streams::{self, Copy, Op};
use crate::{context, memory, stats};
use std::ffi::c_void;

/// Refuses a null host pointer, and (as a violation) a device pointer passed as host memory.
fn check_host(call: &str, host: usize) -> Result<(), CUresult> {
    if host == 0 {
        return Err(INVALID_VALUE);
    }
    if memory::is_device_address(host as u64) {
        stats::violation(
            "device_pointer_as_host",
            &format!("{call}: {host:#x} is device memory, passed as host memory"),
        );
        return Err(INVALID_VALUE);
    }
    Ok(())
}

/// The counter of bytes moved in one direction.
fn counter(to_device: bool) -> &'static str {
    if to_device {
        "bytes.h2d"
    } else {
        "bytes.d2h"
    }
}

/// A synchronous copy between device memory at `dev` and host memory at `host`.
fn copy_now(
    call: &str,
    dev: u64,
    host: usize,
    len: usize,
    to_device: bool,
) -> Result<(), CUresult> {
    context::current(call)?;
    if len == 0 {
        return Ok(());
    }
    check_host(call, host)?;
    let r = memory::device_range(call, dev, 0, len)?;
    context::account(len)?;
    // SAFETY: r is translated, pinned device memory of len bytes; the caller of the driver
    // call guarantees host..host + len is valid memory of its own (as CUDA requires).
    unsafe {
        if to_device {
            std::ptr::copy_nonoverlapping(host as *const u8, r.host, len);
        } else {
            std::ptr::copy_nonoverlapping(r.host, host as *mut u8, len);
        }
    }
    stats::add(counter(to_device), len as i64);
    Ok(())
}

/// An asynchronous copy on `stream`.
fn copy_async(
    call: &str,
    dev: u64,
    host: usize,
    len: usize,
    stream: *mut c_void,
    to_device: bool,
) -> Result<(), CUresult> {
    context::current(call)?;
    let s = streams::get(call, stream)?;
    if len == 0 {
        return Ok(());
    }
    check_host(call, host)?;
    let Some(pin) = memory::pin_host(host, len) else {
        stats::add("copies.async_pageable", 1);
        s.synchronize()?;
        return copy_now(call, dev, host, len, to_device);
    };
    let device = memory::device_range(call, dev, 0, len)?;
    let (dst, src) = if to_device {
        (device.host, host as *const u8)
    } else {
        (host as *mut u8, device.host.cast_const())
    };
    stats::add("copies.async", 1);
    s.submit(Op::Copy(Copy {
        dst,
        src,
        device,
        _host: Some(pin),
        _source: None,
        counter: counter(to_device),
    }));
    Ok(())
}

/// `cuMemcpyDtoDAsync_v2`: queued on the stream; both allocations stay pinned until it ran.
#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: u64,
    src: u64,
    len: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemcpyDtoDAsync_v2", || {
        context::current("cuMemcpyDtoDAsync")?;
        let s = streams::get("cuMemcpyDtoDAsync", stream)?;
        if len == 0 {
            return Ok(());
        }
        let from = memory::device_range("cuMemcpyDtoDAsync", src, 0, len)?;
        let to = memory::device_range("cuMemcpyDtoDAsync", dst, 0, len)?;
        stats::add("copies.async", 1);
        s.submit(Op::Copy(Copy {
            dst: to.host,
            src: from.host.cast_const(),
            device: to,
            _host: None,
            _source: Some(from),
            counter: "bytes.d2d",
        }));
        Ok(())
    })
}

/// `cuMemcpyHtoD_v2`.
///
/// # Safety
/// `src` must be valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, len: usize) -> CUresult {
    entry("cuMemcpyHtoD_v2", || {
        copy_now("cuMemcpyHtoD", dst, src as usize, len, true)
    })
}

/// `cuMemcpyDtoH_v2`.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, len: usize) -> CUresult {
    entry("cuMemcpyDtoH_v2", || {
        copy_now("cuMemcpyDtoH", src, dst as usize, len, false)
    })
}

/// `cuMemcpyHtoDAsync_v2`.
///
/// # Safety
/// `src` must be valid for reads of `len` bytes until the stream passes the copy.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    len: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemcpyHtoDAsync_v2", || {
        copy_async("cuMemcpyHtoDAsync", dst, src as usize, len, stream, true)
    })
}

/// `cuMemcpyDtoHAsync_v2`.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes until the stream passes the copy.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    len: usize,
    stream: *mut c_void,
) -> CUresult {
    entry("cuMemcpyDtoHAsync_v2", || {
        copy_async("cuMemcpyDtoHAsync", src, dst as usize, len, stream, false)
    })
}

/// The device ranges of `len` bytes at `ptrs`, in order, for `call` (which needs a current
/// context); none when `len` is 0 (nothing to do).
fn device_ranges(call: &str, ptrs: &[u64], len: usize) -> Result<Vec<DeviceRange>, CUresult> {
    context::current(call)?;
    if len == 0 {
        return Ok(Vec::new());
    }
    ptrs.iter()
        .map(|&p| memory::device_range(call, p, 0, len))
        .collect()
}

/// `cuMemcpyDtoD_v2`.
#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: u64, src: u64, len: usize) -> CUresult {
    entry("cuMemcpyDtoD_v2", || {
        if let [from, to] = &device_ranges("cuMemcpyDtoD", &[src, dst], len)?[..] {
            // SAFETY: both ranges are translated, pinned device memory of len bytes; overlap
            // is allowed by `copy`.
            unsafe { std::ptr::copy(from.host, to.host, len) };
        }
        Ok(())
    })
}

/// `cuMemsetD8_v2`.
#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst: u64, value: u8, len: usize) -> CUresult {
    entry("cuMemsetD8_v2", || {
        if let [r] = &device_ranges("cuMemsetD8", &[dst], len)?[..] {
            // SAFETY: r is translated, pinned device memory of len bytes.
            unsafe { std::ptr::write_bytes(r.host, value, len) };
        }
        Ok(())
    })
}
