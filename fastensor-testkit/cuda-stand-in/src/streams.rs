//! Streams and events. Each stream has a worker thread that runs its operations in order,
//! each after the configured delay, so work queued on a stream completes later than the call
//! that queued it, as on a GPU. An operation that fails makes the stream fail every later
//! one; synchronising returns the first error.

use crate::errors::{CUresult, INVALID_HANDLE, OUT_OF_MEMORY};
use crate::handles::Handles;
use crate::memory::{DeviceRange, HostPin};
use crate::{config, context, stats};
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// One queued copy: the device range and the page-locked host range it uses stay pinned
/// until it has run.
#[derive(Debug)]
pub(crate) struct Copy {
    /// Destination (host address; device memory already translated).
    pub dst: *mut u8,
    /// Source.
    pub src: *const u8,
    /// The device side.
    pub device: DeviceRange,
    /// The host side, when page-locked (held until the copy ran).
    pub _host: Option<HostPin>,
    /// The source, when it is device memory too (held until the copy ran).
    pub _source: Option<DeviceRange>,
    /// Counter of the bytes moved (`bytes.h2d` or `bytes.d2h`).
    pub counter: &'static str,
}

// SAFETY: both ends stay mapped while pinned (the pins are fields); the copy runs on one
// thread at a time.
unsafe impl Send for Copy {}

impl Copy {
    /// Moves the bytes (or fails when the device is lost).
    pub(crate) fn run(&self) -> Result<(), CUresult> {
        let len = self.device.len;
        context::account(len)?;
        // SAFETY: dst and src are valid for len bytes (translated and pinned device memory,
        // and host memory the caller of the async call handed over until the stream passes
        // this copy) and belong to different mappings.
        unsafe { std::ptr::copy_nonoverlapping(self.src, self.dst, len) };
        stats::add(self.counter, len as i64);
        Ok(())
    }
}

/// An operation on a stream.
#[derive(Debug)]
pub(crate) enum Op {
    /// A memory copy.
    Copy(Copy),
    /// Waits until another stream passed its operation number `.1` (`cuStreamWaitEvent`).
    Wait(Arc<Stream>, u64),
}

#[derive(Debug, Default)]
struct Queue {
    ops: VecDeque<(u64, Op)>,
    /// Number of the last operation queued (operations count from 1).
    submitted: u64,
    /// Number of the last operation finished.
    completed: u64,
    /// The first operation that failed, and its error.
    failed: Option<(u64, CUresult)>,
    /// Copies queued and not finished.
    copies: i64,
    closing: bool,
}

/// A stream: its queue and the worker's signal.
#[derive(Debug, Default)]
pub(crate) struct Stream {
    queue: Mutex<Queue>,
    changed: Condvar,
}

impl Stream {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `op`; returns its number.
    pub(crate) fn submit(&self, op: Op) -> u64 {
        let mut q = self.lock();
        q.submitted += 1;
        let seq = q.submitted;
        if matches!(op, Op::Copy(_)) {
            q.copies += 1;
            stats::peak("stream_copies_in_flight", q.copies);
        }
        q.ops.push_back((seq, op));
        drop(q);
        self.changed.notify_all();
        seq
    }

    /// The number of the last operation queued.
    pub(crate) fn submitted(&self) -> u64 {
        self.lock().submitted
    }

    /// Waits until operation `seq` finished; its error, or an earlier one's, if any.
    pub(crate) fn wait(&self, seq: u64) -> Result<(), CUresult> {
        let mut q = self.lock();
        while q.completed < seq {
            q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        match q.failed {
            Some((at, code)) if at <= seq => Err(code),
            _ => Ok(()),
        }
    }

    /// `Ok(true)` when operation `seq` finished without error, `Ok(false)` while it runs.
    pub(crate) fn passed(&self, seq: u64) -> Result<bool, CUresult> {
        let q = self.lock();
        match q.failed {
            Some((at, code)) if at <= seq && q.completed >= at => Err(code),
            _ => Ok(q.completed >= seq),
        }
    }

    /// Waits for everything queued so far.
    pub(crate) fn synchronize(&self) -> Result<(), CUresult> {
        let seq = self.submitted();
        self.wait(seq)
    }

    /// The worker: runs operations in order until the stream is destroyed and drained.
    fn work(self: Arc<Self>) {
        loop {
            let (seq, op) = {
                let mut q = self.lock();
                loop {
                    if let Some(next) = q.ops.pop_front() {
                        break next;
                    }
                    if q.closing {
                        return;
                    }
                    q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let delay = config::get().delay;
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
            let earlier = self.lock().failed.map(|(_, code)| code);
            let result = match (earlier, &op) {
                (Some(code), _) => Err(code),
                (None, Op::Copy(c)) => c.run(),
                (None, Op::Wait(other, at)) => other.wait(*at),
            };
            let copy = matches!(op, Op::Copy(_));
            // Unpin the memory before anyone can see the operation finished.
            drop(op);
            let mut q = self.lock();
            q.completed = seq;
            if copy {
                q.copies -= 1;
            }
            if let Err(code) = result {
                q.failed.get_or_insert((seq, code));
            }
            drop(q);
            self.changed.notify_all();
        }
    }
}

static STREAMS: Handles<Arc<Stream>> = Handles::new(0x5e00_0000_0000, "a live stream");

/// Starts a stream and its worker.
fn start() -> Result<Arc<Stream>, CUresult> {
    let s = Arc::new(Stream::default());
    let worker = s.clone();
    std::thread::Builder::new()
        .name("cuda-stand-in-stream".into())
        .spawn(move || worker.work())
        .map_err(|_| OUT_OF_MEMORY)?;
    Ok(s)
}

/// A new stream; its handle.
pub(crate) fn create() -> Result<*mut c_void, CUresult> {
    let s = start()?;
    let h = STREAMS.insert(s);
    stats::live("streams", 1);
    Ok(h)
}

/// The stream of `handle` (null: the default stream); an unknown handle is a violation.
pub(crate) fn get(call: &str, handle: *mut c_void) -> Result<Arc<Stream>, CUresult> {
    if handle.is_null() {
        static DEFAULT: OnceLock<Result<Arc<Stream>, CUresult>> = OnceLock::new();
        return DEFAULT.get_or_init(start).clone();
    }
    STREAMS.get(call, handle).ok_or(INVALID_HANDLE)
}

/// Destroys a stream: work queued on it still completes (as `cuStreamDestroy` promises).
pub(crate) fn destroy(handle: *mut c_void) -> Result<(), CUresult> {
    let s = STREAMS
        .remove("cuStreamDestroy", handle)
        .ok_or(INVALID_HANDLE)?;
    s.lock().closing = true;
    s.changed.notify_all();
    stats::live("streams", -1);
    Ok(())
}

/// Waits for every stream.
pub(crate) fn synchronize_all() -> Result<(), CUresult> {
    STREAMS.values().iter().try_for_each(|s| s.synchronize())
}

/// An event: the stream operation it marks, once recorded.
#[derive(Debug, Default)]
pub(crate) struct Event {
    target: Mutex<Option<(Arc<Stream>, u64)>>,
}

impl Event {
    fn target(&self) -> Option<(Arc<Stream>, u64)> {
        self.target
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Marks the current end of `stream`'s queue.
    pub(crate) fn record(&self, stream: Arc<Stream>) {
        let seq = stream.submitted();
        *self.target.lock().unwrap_or_else(|p| p.into_inner()) = Some((stream, seq));
    }

    /// Waits for the marked work (at once when never recorded).
    pub(crate) fn synchronize(&self) -> Result<(), CUresult> {
        match self.target() {
            Some((s, seq)) => s.wait(seq),
            None => Ok(()),
        }
    }

    /// True when the marked work is done.
    pub(crate) fn passed(&self) -> Result<bool, CUresult> {
        match self.target() {
            Some((s, seq)) => s.passed(seq),
            None => Ok(true),
        }
    }

    /// The stream and operation marked, for `cuStreamWaitEvent`.
    pub(crate) fn marked(&self) -> Option<(Arc<Stream>, u64)> {
        self.target()
    }
}

static EVENTS: Handles<Arc<Event>> = Handles::new(0xe0e0_0000_0000, "a live event");

/// A new event; its handle.
pub(crate) fn create_event() -> *mut c_void {
    let h = EVENTS.insert(Arc::default());
    stats::live("events", 1);
    h
}

/// The event of `handle`; an unknown handle is a violation.
pub(crate) fn event(call: &str, handle: *mut c_void) -> Result<Arc<Event>, CUresult> {
    EVENTS.get(call, handle).ok_or(INVALID_HANDLE)
}

/// Destroys an event.
pub(crate) fn destroy_event(handle: *mut c_void) -> Result<(), CUresult> {
    EVENTS
        .remove("cuEventDestroy", handle)
        .ok_or(INVALID_HANDLE)?;
    stats::live("events", -1);
    Ok(())
}
