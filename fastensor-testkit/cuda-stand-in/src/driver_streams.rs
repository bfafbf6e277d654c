//! The CUDA driver's stream and event entry points (the streams themselves are in
//! [`crate::streams`]).

use crate::driver::{entry, put, Handle};
use crate::errors::{CUresult, NOT_READY};
use crate::{context, streams};
use std::ffi::c_uint;

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
        context::ready()?;
        streams::get("cuStreamSynchronize", stream)?.synchronize()?;
        context::ready()
    })
}

/// `cuStreamQuery`.
#[no_mangle]
pub extern "C" fn cuStreamQuery(stream: Handle) -> CUresult {
    entry("cuStreamQuery", || {
        context::ready()?;
        let s = streams::get("cuStreamQuery", stream)?;
        match s.passed(s.submitted())? {
            true => Ok(()),
            false => Err(NOT_READY),
        }
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
        context::ready()?;
        streams::event("cuEventSynchronize", event)?.synchronize()?;
        context::ready()
    })
}

/// `cuEventQuery`.
#[no_mangle]
pub extern "C" fn cuEventQuery(event: Handle) -> CUresult {
    entry("cuEventQuery", || {
        context::ready()?;
        match streams::event("cuEventQuery", event)?.passed()? {
            true => Ok(()),
            false => Err(NOT_READY),
        }
    })
}

/// `cuEventDestroy_v2`.
#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: Handle) -> CUresult {
    entry("cuEventDestroy_v2", || streams::destroy_event(event))
}
