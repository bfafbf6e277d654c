//! cuFile's batch API: requests checked when submitted (device memory pinned until they
//! complete) and run in order on a worker thread per submission, each after the configured
//! delay; completions are handed out by `cuFileBatchIOGetStatus`, each once. Destroying a
//! batch with requests still running is a violation (the destroy then waits for them).

use crate::cufile::io::{self, Io};
use crate::cufile::{self, CUfileError};
use crate::errors::cufile as e;
use crate::handles::Handles;
use crate::{config, context, stats};
use std::collections::VecDeque;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `CUfileIOParams_t` in batch mode.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUfileIOParams {
    /// `CUfileBatchMode_t`: 1 is `CUFILE_BATCH`.
    pub mode: c_uint,
    /// Device buffer base.
    pub base: *mut c_void,
    /// File offset.
    pub file_offset: i64,
    /// Offset into the buffer.
    pub buf_offset: i64,
    /// Bytes.
    pub size: usize,
    /// The registered file.
    pub fh: *mut c_void,
    /// `CUfileOpcode_t`: 0 read, 1 write.
    pub opcode: c_uint,
    /// Returned with the completion.
    pub cookie: *mut c_void,
}

/// `CUfileIOEvents_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUfileIOEvents {
    /// The request's cookie.
    pub cookie: *mut c_void,
    /// `CUfileStatus_t`.
    pub status: c_uint,
    /// Bytes moved.
    pub ret: usize,
}

/// `struct timespec`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Timespec {
    /// Seconds.
    pub tv_sec: i64,
    /// Nanoseconds.
    pub tv_nsec: i64,
}

const COMPLETE: c_uint = 0x10;
const FAILED: c_uint = 0x40;

#[derive(Debug, Default)]
struct State {
    running: usize,
    /// Completions not handed out yet: cookie, status, bytes.
    done: VecDeque<(usize, c_uint, usize)>,
}

#[derive(Debug, Default)]
struct Batch {
    capacity: u32,
    state: Mutex<State>,
    changed: Condvar,
}

impl Batch {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

static BATCHES: Handles<Arc<Batch>> = Handles::new(0xba7c_0000_0000, "a live batch");
static REQUESTS: AtomicU64 = AtomicU64::new(0);

fn batch(call: &str, handle: *mut c_void) -> Result<Arc<Batch>, CUfileError> {
    BATCHES
        .get(call, handle)
        .ok_or(CUfileError::op(e::INVALID_VALUE))
}

/// `cuFileBatchIOSetUp`: at most the driver's batch size.
///
/// # Safety
/// `out` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSetUp(out: *mut *mut c_void, nr: c_uint) -> CUfileError {
    cufile::counted("cuFileBatchIOSetUp", || {
        cufile::ready()?;
        if out.is_null() || nr == 0 || nr > config::get().max_batch {
            return Err(CUfileError::op(e::INVALID_VALUE));
        }
        let h = BATCHES.insert(Arc::new(Batch {
            capacity: nr,
            ..Batch::default()
        }));
        stats::live("cufile_batches", 1);
        // SAFETY: the caller's contract.
        unsafe { out.write(h) };
        Ok(())
    })
}

/// One checked request.
struct Request {
    io: Io,
    write: bool,
    cookie: usize,
}

/// Runs `requests` in order and posts their completions.
fn run(batch: Arc<Batch>, requests: Vec<Request>) {
    for r in requests {
        let delay = config::get().delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let fail = config::get().faults.batch_fail_from;
        let result = if context::fault_fires("batch-fail", &REQUESTS, fail) {
            Err(io::Failure::Os(libc::EIO))
        } else if r.write {
            io::write("cuFileBatchIOSubmit", &r.io)
        } else {
            io::read(&r.io, io::read_fault())
        };
        let (status, ret) = match result {
            Ok(n) => (COMPLETE, n),
            Err(_) => (FAILED, 0),
        };
        // Unpin the device memory before the completion is visible.
        drop(r.io);
        let mut s = batch.lock();
        s.running -= 1;
        s.done.push_back((r.cookie, status, ret));
        drop(s);
        batch.changed.notify_all();
    }
}

/// `cuFileBatchIOSubmit`: every request is checked first; one bad request fails the call
/// and none runs.
///
/// # Safety
/// `params` must hold `nr` requests whose device memory stays valid until they complete.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSubmit(
    handle: *mut c_void,
    nr: c_uint,
    params: *mut CUfileIOParams,
    _flags: c_uint,
) -> CUfileError {
    cufile::counted("cuFileBatchIOSubmit", || {
        cufile::ready()?;
        let b = batch("cuFileBatchIOSubmit", handle)?;
        if params.is_null() || nr == 0 {
            return Err(CUfileError::op(e::INVALID_VALUE));
        }
        let queued = {
            let s = b.lock();
            s.running + s.done.len()
        };
        if queued + nr as usize > b.capacity as usize {
            return Err(CUfileError::op(e::BATCH_FULL));
        }
        let mut requests = Vec::with_capacity(nr as usize);
        for i in 0..nr as usize {
            // SAFETY: params holds nr requests (the caller's contract).
            let p = unsafe { *params.add(i) };
            if p.mode != 1 || p.opcode > 1 || p.size == 0 {
                return Err(CUfileError::op(e::INVALID_VALUE));
            }
            let io = io::prepare(
                "cuFileBatchIOSubmit",
                p.fh,
                p.base as u64,
                p.size,
                p.file_offset,
                p.buf_offset,
            )?;
            requests.push(Request {
                io,
                write: p.opcode == 1,
                cookie: p.cookie as usize,
            });
        }
        b.lock().running += requests.len();
        let worker = b.clone();
        let n = requests.len();
        let spawned = std::thread::Builder::new()
            .name("cuda-stand-in-batch".into())
            .spawn(move || run(worker, requests));
        if spawned.is_err() {
            b.lock().running -= n;
            return Err(CUfileError::op(5030));
        }
        Ok(())
    })
}

/// `cuFileBatchIOGetStatus`: waits (up to `timeout`, or without limit when null) until at
/// least `min_nr` completions are ready, or every request has completed; hands out at most
/// `*nr` of them and sets `*nr`.
///
/// # Safety
/// `nr` must be valid for a read and a write, `events` for `*nr` entries, `timeout` null or
/// valid for a read.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOGetStatus(
    handle: *mut c_void,
    min_nr: c_uint,
    nr: *mut c_uint,
    events: *mut CUfileIOEvents,
    timeout: *mut Timespec,
) -> CUfileError {
    cufile::counted("cuFileBatchIOGetStatus", || {
        let b = batch("cuFileBatchIOGetStatus", handle)?;
        if nr.is_null() || events.is_null() {
            return Err(CUfileError::op(e::INVALID_VALUE));
        }
        // SAFETY: nr and timeout are readable (the caller's contract).
        let (cap, limit) = unsafe {
            let limit = (!timeout.is_null()).then(|| {
                let t = *timeout;
                Duration::new(
                    t.tv_sec.max(0) as u64,
                    t.tv_nsec.clamp(0, 999_999_999) as u32,
                )
            });
            (*nr as usize, limit)
        };
        let deadline = limit.map(|d| Instant::now() + d);
        let mut s = b.lock();
        loop {
            let wanted = (min_nr as usize).min(s.running + s.done.len());
            if s.done.len() >= wanted {
                break;
            }
            match deadline {
                None => s = b.changed.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break;
                    }
                    s = b
                        .changed
                        .wait_timeout(s, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
        let n = cap.min(s.done.len());
        for i in 0..n {
            let Some((cookie, status, ret)) = s.done.pop_front() else {
                break;
            };
            let ev = CUfileIOEvents {
                cookie: cookie as *mut c_void,
                status,
                ret,
            };
            // SAFETY: events has room for cap >= n entries (the caller's contract).
            unsafe { events.add(i).write(ev) };
        }
        // SAFETY: nr is writable (the caller's contract); n <= *nr fits.
        unsafe { nr.write(n as c_uint) };
        Ok(())
    })
}

/// Waits until no request of `b` runs.
fn drain(b: &Batch) {
    let mut s = b.lock();
    while s.running > 0 {
        s = b.changed.wait(s).unwrap_or_else(|p| p.into_inner());
    }
}

/// `cuFileBatchIOCancel`: requests already submitted cannot be stopped here; waits for them.
#[no_mangle]
pub extern "C" fn cuFileBatchIOCancel(handle: *mut c_void) -> CUfileError {
    cufile::counted("cuFileBatchIOCancel", || {
        let b = batch("cuFileBatchIOCancel", handle)?;
        drain(&b);
        Ok(())
    })
}

/// `cuFileBatchIODestroy`.
#[no_mangle]
pub extern "C" fn cuFileBatchIODestroy(handle: *mut c_void) {
    stats::call("cuFileBatchIODestroy");
    let Some(b) = BATCHES.remove("cuFileBatchIODestroy", handle) else {
        return;
    };
    if b.lock().running > 0 {
        stats::violation(
            "batch_destroyed_in_flight",
            "cuFileBatchIODestroy with requests still running",
        );
        drain(&b);
    }
    stats::live("cufile_batches", -1);
}
