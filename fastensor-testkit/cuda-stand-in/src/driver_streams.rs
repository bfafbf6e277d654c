//! The CUDA driver's stream and event entry points (the streams themselves are in
//! [`crate::streams`]).

use crate::driver::{entry, put, Handle};
use crate::errors::{CUresult, NOT_READY};
use crate::{context, streams};
use std::ffi::c_uint;

/// Runs `wait` (a stream's or an event's `synchronize`) with the device there before and
/// after it: a device lost during the wait fails the call.
fn synchronize(wait: impl FnOnce() -> Result<(), CUresult>) -> Result<(), CUresult> {
    context::ready()?;
    wait()?;
    context::ready()
}

/// `Ok` when `passed` (a stream's or an event's) says its work is done, else
/// `CUDA_ERROR_NOT_READY`.
fn query(passed: impl FnOnce() -> Result<bool, CUresult>) -> Result<(), CUresult> {
    context::ready()?;
    match passed()? {
        true => Ok(()),
        false => Err(NOT_READY),
    }
}

/// `cuStreamCreate` (every flag accepted; no stream waits for the default stream).
///
/// # Safety
/// `stream` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, _flags: c_uint) -> CUresult {
    entry("cuStreamCreate", || {
        context::current("cuStreamCreate")?;
        let s = streams::create()?;
        // SAFETY: the caller's contract.
        unsafe { put(stream, s) }.inspect_err(|_| {
            let _ = streams::destroy(s);
        })
    })
}

/// `cuStreamSynchronize`.
#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: Handle) -> CUresult {
    entry("cuStreamSynchronize", || {
        synchronize(|| streams::get("cuStreamSynchronize", stream)?.synchronize())
    })
}

/// `cuStreamQuery`.
#[no_mangle]
pub extern "C" fn cuStreamQuery(stream: Handle) -> CUresult {
    entry("cuStreamQuery", || {
        query(|| {
            let s = streams::get("cuStreamQuery", stream)?;
            s.passed(s.submitted())
        })
    })
}

/// `cuStreamDestroy_v2`: queued work still completes.
#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CUresult {
    entry("cuStreamDestroy_v2", || streams::destroy(stream))
}

/// `cuStreamWaitEvent`: later work on `stream` waits for the event's work.
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: Handle, event: Handle, _flags: c_uint) -> CUresult {
    entry("cuStreamWaitEvent", || {
        context::ready()?;
        let s = streams::get("cuStreamWaitEvent", stream)?;
        if let Some((other, seq)) = streams::event("cuStreamWaitEvent", event)?.marked() {
            s.submit(streams::Op::Wait(other, seq));
        }
        Ok(())
    })
}

/// `cuEventCreate` (timing is never recorded).
///
/// # Safety
/// `event` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, _flags: c_uint) -> CUresult {
    entry("cuEventCreate", || {
        context::current("cuEventCreate")?;
        let e = streams::create_event();
        // SAFETY: the caller's contract.
        unsafe { put(event, e) }.inspect_err(|_| {
            let _ = streams::destroy_event(e);
        })
    })
}

/// `cuEventRecord`.
#[no_mangle]
pub extern "C" fn cuEventRecord(event: Handle, stream: Handle) -> CUresult {
    entry("cuEventRecord", || {
        context::ready()?;
        let e = streams::event("cuEventRecord", event)?;
        e.record(streams::get("cuEventRecord", stream)?);
        Ok(())
    })
}

/// `cuEventSynchronize`.
#[no_mangle]
pub extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    entry("cuEventSynchronize", || {
        synchronize(|| streams::event("cuEventSynchronize", event)?.synchronize())
    })
}

/// `cuEventQuery`.
#[no_mangle]
pub extern "C" fn cuEventQuery(event: Handle) -> CUresult {
    entry("cuEventQuery", || {
        query(|| streams::event("cuEventQuery", event)?.passed())
    })
}

/// `cuEventDestroy_v2`.
#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: Handle) -> CUresult {
    entry("cuEventDestroy_v2", || streams::destroy_event(event))
}
