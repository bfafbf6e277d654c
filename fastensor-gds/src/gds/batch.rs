//! Batches of small reads through `cuFileBatchIO*`: one submission for many requests. Any
//! failure is returned to the caller, which redoes the group one request at a time; a batch
//! is destroyed (and the caller reads into its buffers again) only once none of its requests
//! runs.

use crate::cufile::ffi::{self, CUfileIOEvents_t, CUfileIOParams_t};
use crate::cufile::{CuFile, FileHandle};
use fastensor_core::{readable_len, MemMut, ReadRequest, Result};
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// How long a batch may take before it is abandoned.
const TIMEOUT: Duration = Duration::from_secs(60);

/// What a batch needs from an open file: its cuFile handle and length, where a device
/// address lands in registered memory, and a plain read to finish a short request.
pub(crate) trait BatchTarget {
    fn cufile(&self) -> &'static CuFile;
    fn handle(&self) -> &FileHandle;
    fn file_len(&self) -> Result<u64>;
    fn resolve(&self, ptr: u64, len: usize, ordinal: u32) -> Result<(u64, u64)>;
    fn finish(&self, base: u64, skip: u64, offset: u64, len: usize, ordinal: u32) -> Result<()>;
}

/// One request of the batch.
struct Item {
    base: u64,
    skip: u64,
    offset: u64,
    size: usize,
}

/// Reads `group` (device memory only, at most the driver's batch size) with one batch.
pub(crate) fn read(f: &impl BatchTarget, group: &mut [ReadRequest<'_>]) -> Result<(), String> {
    let fns = f.cufile().fns().batch.ok_or("no batch API")?;
    let file_len = f.file_len().map_err(|e| e.to_string())?;
    let mut ordinal = None;
    let mut items = Vec::with_capacity(group.len());
    for r in group.iter() {
        let MemMut::Device(d) = &r.dst else {
            return Err("host memory in a device batch".into());
        };
        if *ordinal.get_or_insert(d.ordinal()) != d.ordinal() {
            return Err("requests on several GPUs".into());
        }
        let size = readable_len(r.offset, d.len(), file_len);
        let (base, skip) = if size > 0 {
            f.resolve(d.ptr(), size, d.ordinal())
                .map_err(|e| e.to_string())?
        } else {
            (d.ptr(), 0)
        };
        items.push(Item {
            base,
            skip,
            offset: r.offset,
            size,
        });
    }
    let Some(ordinal) = ordinal else {
        return Ok(());
    };
    let mut params: Vec<CUfileIOParams_t> = items
        .iter()
        .enumerate()
        .filter(|(_, it)| it.size > 0)
        .map(|(i, it)| {
            Ok(CUfileIOParams_t {
                mode: 1, // CUFILE_BATCH
                devPtr_base: it.base as *mut c_void,
                file_offset: i64::try_from(it.offset).map_err(|_| "offset too large")?,
                devPtr_offset: i64::try_from(it.skip).map_err(|_| "offset too large")?,
                size: it.size,
                fh: f.handle().raw(),
                opcode: 0, // CUFILE_READ
                cookie: i as *mut c_void,
            })
        })
        .collect::<Result<_, String>>()?;
    let mut got = vec![0usize; items.len()];
    if !params.is_empty() {
        run(&fns, &mut params, &mut got)?;
    }
    for (i, it) in items.iter().enumerate() {
        if got[i] < it.size {
            let rest = got[i] as u64;
            f.finish(
                it.base,
                it.skip + rest,
                it.offset + rest,
                it.size - got[i],
                ordinal,
            )
            .map_err(|e| e.to_string())?;
        }
    }
    for (r, it) in group.iter_mut().zip(&items) {
        r.done = it.size;
    }
    Ok(())
}

/// How a submitted batch ended.
enum Wait {
    /// Every request completed or failed: the batch may be destroyed.
    Settled(Result<(), String>),
    /// Requests may still be running (the status could not be read, or the time ran out).
    Unsettled(String),
}

/// Sets up, submits and waits for one batch; `got[cookie]` receives each request's bytes.
///
/// The batch is destroyed only once none of its requests runs: they write into the caller's
/// buffers, which the caller reads into again after a failure (and may free). After a failed
/// request the others are still waited for; when the wait itself fails, the requests are
/// cancelled first, and without `cuFileBatchIOCancel` the batch is left undestroyed.
fn run(
    fns: &ffi::BatchFns,
    params: &mut [CUfileIOParams_t],
    got: &mut [usize],
) -> Result<(), String> {
    let n = u32::try_from(params.len()).map_err(|_| "batch too large")?;
    let mut batch: *mut c_void = std::ptr::null_mut();
    // SAFETY: batch is a writable handle slot; n is the number of requests to come.
    let e = unsafe { (fns.set_up)(&mut batch, n) };
    if e.err != 0 {
        return Err(format!("cuFileBatchIOSetUp: {}", ffi::op_error_name(e.err)));
    }
    let why = match submit_and_wait(fns, batch, params, got) {
        Wait::Settled(result) => {
            // SAFETY: batch came from cuFileBatchIOSetUp and none of its requests runs.
            unsafe { (fns.destroy)(batch) };
            return result;
        }
        Wait::Unsettled(why) => why,
    };
    // SAFETY: batch came from cuFileBatchIOSetUp and is still alive.
    let cancelled = fns
        .cancel
        .is_some_and(|cancel| unsafe { cancel(batch) }.err == 0);
    if cancelled {
        // SAFETY: the cancel succeeded, so no request of the batch runs any more.
        unsafe { (fns.destroy)(batch) };
        Err(why)
    } else {
        Err(format!(
            "{why}; the batch could not be cancelled, so it is left allocated rather than freed \
             under running requests"
        ))
    }
}

fn submit_and_wait(
    fns: &ffi::BatchFns,
    batch: *mut c_void,
    params: &mut [CUfileIOParams_t],
    got: &mut [usize],
) -> Wait {
    let n = params.len();
    // SAFETY: params holds n valid requests whose buffers stay borrowed until this returns;
    // the context of their GPU is current (bound by `resolve`).
    let e = unsafe { (fns.submit)(batch, n as u32, params.as_mut_ptr(), 0) };
    if e.err != 0 {
        return Wait::Settled(Err(format!(
            "cuFileBatchIOSubmit: {}",
            ffi::op_error_name(e.err)
        )));
    }
    let mut events = vec![
        CUfileIOEvents_t {
            cookie: std::ptr::null_mut(),
            status: 0,
            ret: 0,
        };
        n
    ];
    let start = Instant::now();
    let mut finished = 0;
    let mut failure: Option<String> = None;
    while finished < n {
        if start.elapsed() > TIMEOUT {
            return Wait::Unsettled("the batch timed out".into());
        }
        let mut nr = (n - finished) as u32;
        let mut timeout = ffi::libc_timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: events has room for nr entries; timeout is a valid timespec.
        let e = unsafe { (fns.get_status)(batch, 1, &mut nr, events.as_mut_ptr(), &mut timeout) };
        if e.err != 0 {
            return Wait::Unsettled(format!(
                "cuFileBatchIOGetStatus: {}",
                ffi::op_error_name(e.err)
            ));
        }
        for ev in &events[..(nr as usize).min(n)] {
            if ev.status & ffi::STATUS_RUNNING != 0 {
                continue;
            }
            finished += 1;
            let i = ev.cookie as usize;
            if ev.status != ffi::STATUS_COMPLETE {
                failure.get_or_insert_with(|| {
                    format!("a batch request ended with status {:#x}", ev.status)
                });
            } else if i >= got.len() {
                failure.get_or_insert_with(|| "cuFile returned an unknown request".into());
            } else {
                got[i] = ev.ret;
            }
        }
    }
    Wait::Settled(failure.map_or(Ok(()), Err))
}
