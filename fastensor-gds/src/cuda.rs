//! The CUDA driver, through cudarc with dynamic loading: one initialisation per process that
//! never panics, primary contexts per GPU, and safe RAII types for the few driver objects the
//! backends use (streams, events, pinned host buffers).
//!
//! cudarc panics when `libcuda` or one of its symbols is missing. [`driver`] therefore probes
//! for the library first, resolves every symbol this crate calls while still inside
//! `catch_unwind`, and only then reports the driver ready; later calls cannot hit a missing
//! library or symbol.

use crate::probe;
use cudarc::driver::{result, sys, DriverError};
use fastensor_core::{Error, ErrorKind, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::panic::catch_unwind;
use std::sync::OnceLock;

/// Every driver symbol this crate calls (through cudarc), checked once at initialisation so
/// that no later call can panic on a missing symbol.
const SYMBOLS: [&str; 24] = [
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuStreamCreate",
    "cuStreamSynchronize",
    "cuStreamDestroy_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
];

/// A primary context, shareable between threads.
#[derive(Debug, Clone, Copy)]
struct Context(sys::CUcontext);

// SAFETY: a CUcontext is a process-wide handle; the driver allows making it current on any
// thread, and this crate never destroys a primary context it retained.
unsafe impl Send for Context {}
// SAFETY: as above; the handle is only passed by value to the driver.
unsafe impl Sync for Context {}

/// The initialised CUDA driver of this process.
#[derive(Debug)]
pub struct Driver {
    devices: u32,
    names: Vec<String>,
    contexts: Mutex<HashMap<u32, Context>>,
}

static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();

/// The CUDA driver, initialised on first use; the error says precisely why CUDA cannot run.
pub fn driver() -> std::result::Result<&'static Driver, String> {
    DRIVER
        .get_or_init(|| match catch_unwind(init) {
            Ok(r) => r,
            Err(panic) => Err(format!(
                "the CUDA driver panicked while loading: {}",
                panic_message(&panic)
            )),
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

fn init() -> std::result::Result<Driver, String> {
    // SAFETY: only tries to dlopen the driver library under cudarc's candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(probe::libcuda_missing_reason());
    }
    // SAFETY: the library is present (checked above), so culib() loads it without panicking;
    // `get` only looks the symbol up.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = SYMBOLS
        .iter()
        // SAFETY: looking a symbol up has no side effect; the pointer is not called here.
        .filter(|s| unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err())
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the CUDA driver library lacks {} (driver too old for CUDA 12)",
            missing.join(", ")
        ));
    }
    result::init().map_err(|e| format!("cuInit failed: {}", describe(e)))?;
    let count = result::device::get_count()
        .map_err(|e| format!("cuDeviceGetCount failed: {}", describe(e)))?;
    let devices = u32::try_from(count).unwrap_or(0);
    if devices == 0 {
        return Err("the CUDA driver is installed but sees no GPU".into());
    }
    let names = (0..count)
        .map(|i| {
            result::device::get(i)
                .and_then(result::device::get_name)
                .unwrap_or_else(|_| "unknown GPU".into())
        })
        .collect();
    Ok(Driver {
        devices,
        names,
        contexts: Mutex::new(HashMap::new()),
    })
}

/// `NAME (description)` of a driver error.
pub fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(s) => format!("{name} ({})", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// A fastensor error of kind [`ErrorKind::Device`] for a failed driver call.
pub fn device_error(what: &str, e: DriverError) -> Error {
    let kind = if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        ErrorKind::OutOfMemory
    } else {
        ErrorKind::Device
    };
    Error::new(kind, format!("{what}: {}", describe(e)))
}

/// Those of `names` the driver library does not export (an older driver).
pub fn missing_symbols<'a>(names: &[&'a str]) -> Vec<&'a str> {
    // SAFETY: only looks the library up (it is loaded by `driver()` before any caller gets
    // here; cudarc's loader returns the same library).
    if !unsafe { sys::is_culib_present() } {
        return names.to_vec();
    }
    // SAFETY: as in `init`: the library is present; looking a symbol up has no side effect.
    let lib = unsafe { sys::culib() };
    names
        .iter()
        // SAFETY: looking a symbol up has no side effect; the pointer is not called here.
        .filter(|s| unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err())
        .copied()
        .collect()
}

/// The driver, or an [`ErrorKind::Unavailable`] error saying why CUDA cannot run.
pub fn require() -> Result<&'static Driver> {
    driver().map_err(|reason| Error::new(ErrorKind::Unavailable, reason))
}

impl Driver {
    /// Number of GPUs.
    pub fn device_count(&self) -> u32 {
        self.devices
    }

    /// The name of GPU `ordinal`.
    pub fn device_name(&self, ordinal: u32) -> &str {
        self.names.get(ordinal as usize).map_or("?", String::as_str)
    }

    /// Makes GPU `ordinal`'s primary context current on this thread (retaining it once per
    /// process).
    pub fn bind(&self, ordinal: u32) -> Result<()> {
        if ordinal >= self.devices {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("no GPU {ordinal}: this machine has {}", self.devices),
            ));
        }
        let ctx = {
            let mut map = self.contexts.lock();
            match map.get(&ordinal) {
                Some(c) => *c,
                None => {
                    let dev = result::device::get(ordinal as i32)
                        .map_err(|e| device_error("cuDeviceGet failed", e))?;
                    // SAFETY: `dev` was returned by cuDeviceGet.
                    let ctx = unsafe { result::primary_ctx::retain(dev) }
                        .map_err(|e| device_error("cuDevicePrimaryCtxRetain failed", e))?;
                    map.insert(ordinal, Context(ctx));
                    Context(ctx)
                }
            }
        };
        // SAFETY: ctx is a retained primary context, never released.
        unsafe { result::ctx::set_current(ctx.0) }
            .map_err(|e| device_error("cuCtxSetCurrent failed", e))
    }
}

/// Defines `$ty`, the owner of one driver object (handle type `$raw`) of the context current
/// when it was made, through cudarc's `result::$m` (the driver's `cu<$kind>Create`,
/// `cu<$kind>Synchronize` and `cu<$kind>Destroy`): `new` makes one with `create($arg)`, `raw`
/// gives the handle, `synchronize` blocks until its work is done, and dropping it destroys
/// it. Streams and events differ only in these names and types.
macro_rules! driver_object {
    (
        $(#[$doc:meta])*
        $ty:ident($raw:ty) in $m:ident, $kind:literal;
        $(#[$new_doc:meta])*
        new: $arg:expr;
        $(#[$sync_doc:meta])*
        synchronize
    ) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $ty($raw);

        impl $ty {
            $(#[$new_doc])*
            pub fn new() -> Result<Self> {
                result::$m::create($arg)
                    .map($ty)
                    .map_err(|e| device_error(concat!("cu", $kind, "Create failed"), e))
            }

            /// The raw handle.
            pub fn raw(&self) -> $raw {
                self.0
            }

            $(#[$sync_doc])*
            pub fn synchronize(&self) -> Result<()> {
                // SAFETY: the object is alive (owned by self).
                unsafe { result::$m::synchronize(self.0) }
                    .map_err(|e| device_error(concat!("cu", $kind, "Synchronize failed"), e))
            }
        }

        impl Drop for $ty {
            fn drop(&mut self) {
                // SAFETY: the object was made by `new` and is destroyed once; pending work
                // completes before the driver frees it.
                let _ = unsafe { result::$m::destroy(self.0) };
            }
        }
    };
}

driver_object! {
    /// A CUDA stream of the context current when it was made.
    Stream(sys::CUstream) in stream, "Stream";
    /// A non-blocking stream in the current context.
    new: result::stream::StreamKind::NonBlocking;
    /// Waits until all work queued on the stream is done.
    synchronize
}

// SAFETY: streams may be used from any thread once their context is current there.
unsafe impl Send for Stream {}

driver_object! {
    /// A CUDA event (timing disabled) marking the completion of queued work.
    Event(sys::CUevent) in event, "Event";
    /// A new event in the current context.
    new: sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
    /// Waits for the recorded work (returns at once when never recorded).
    synchronize
}

// SAFETY: events may be recorded and waited on from any thread.
unsafe impl Send for Event {}
// SAFETY: the driver's event calls are thread-safe; the wrapper only passes the handle.
unsafe impl Sync for Event {}

impl Event {
    /// Marks the current end of `stream`'s queue.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: event and stream are alive (owned by their wrappers).
        unsafe { result::event::record(self.0, stream.raw()) }
            .map_err(|e| device_error("cuEventRecord failed", e))
    }
}

/// Page-locked host memory from `cuMemHostAlloc` (portable to every context): DMA-able by
/// the GPU, and page-aligned, so `O_DIRECT` can target it too.
#[derive(Debug)]
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access only reads through &self.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// `len` (> 0) zeroed bytes of pinned memory. A context must be current on the calling
    /// thread ([`Driver::bind`]): `cuMemHostAlloc` fails without one.
    pub fn new(len: usize) -> Result<Self> {
        require()?;
        // CU_MEMHOSTALLOC_PORTABLE
        const PORTABLE: u32 = 1;
        // SAFETY: the driver is initialised; the memory is zeroed below before use.
        let ptr = unsafe { result::malloc_host(len.max(1), PORTABLE) }
            .map_err(|e| {
                device_error(
                    &format!("cannot allocate {len} bytes of pinned host memory (cuMemHostAlloc)"),
                    e,
                )
            })?
            .cast::<u8>();
        // SAFETY: ptr is valid for len bytes, just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedBuffer { ptr, len })
    }
}

impl std::ops::Deref for PinnedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for PinnedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemHostAlloc and is freed once; users wait for every async
        // copy touching it before dropping (the staged backend synchronises its stream).
        let _ = unsafe { result::free_host(self.ptr.cast()) };
    }
}
