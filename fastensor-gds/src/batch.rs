//! Batches of small reads through `cuFileBatchIO*`: one submission for many requests. Any
//! failure is returned to the caller, which redoes the group one request at a time.

use crate::cufile::ffi::{self, CUfileIOEvents_t, CUfileIOParams_t};
use crate::gds::BatchTarget;
use fastensor_core::{readable_len, MemMut, ReadRequest};
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// How long a batch may take before it is abandoned.
const TIMEOUT: Duration = Duration::from_secs(60);

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

/// Sets up, submits and waits for one batch; `got[cookie]` receives each request's bytes.
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
    let result = submit_and_wait(fns, batch, params, got);
    // SAFETY: batch came from cuFileBatchIOSetUp; every request has completed or failed (or
    // the wait timed out, in which case cuFile cancels what is left).
    unsafe { (fns.destroy)(batch) };
    result
}

fn submit_and_wait(
    fns: &ffi::BatchFns,
    batch: *mut c_void,
    params: &mut [CUfileIOParams_t],
    got: &mut [usize],
) -> Result<(), String> {
    let n = params.len();
    // SAFETY: params holds n valid requests whose buffers stay borrowed until this returns;
    // the context of their GPU is current (bound by `resolve`).
    let e = unsafe { (fns.submit)(batch, n as u32, params.as_mut_ptr(), 0) };
    if e.err != 0 {
        return Err(format!(
            "cuFileBatchIOSubmit: {}",
            ffi::op_error_name(e.err)
        ));
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
    while finished < n {
        if start.elapsed() > TIMEOUT {
            return Err("the batch timed out".into());
        }
        let mut nr = (n - finished) as u32;
        let mut timeout = ffi::libc_timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: events has room for nr entries; timeout is a valid timespec.
        let e = unsafe { (fns.get_status)(batch, 1, &mut nr, events.as_mut_ptr(), &mut timeout) };
        if e.err != 0 {
            return Err(format!(
                "cuFileBatchIOGetStatus: {}",
                ffi::op_error_name(e.err)
            ));
        }
        for ev in &events[..(nr as usize).min(n)] {
            if ev.status & ffi::STATUS_RUNNING != 0 {
                continue;
            }
            if ev.status != ffi::STATUS_COMPLETE {
                return Err(format!(
                    "a batch request ended with status {:#x}",
                    ev.status
                ));
            }
            let i = ev.cookie as usize;
            if i >= got.len() {
                return Err("cuFile returned an unknown request".into());
            }
            got[i] = ev.ret;
            finished += 1;
        }
    }
    Ok(())
}
