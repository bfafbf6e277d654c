//! The plugin side of the ABI: what [`export_plugin!`](crate::export_plugin) expands to.
//!
//! Public only for the macro; plugin authors use the macro, never these items directly.

use crate::abi::{
    mode_of_code, ErrorCode, FfiCapabilities, PluginV1, Status, ABI_VERSION, STATUS_OK,
};
use fastensor_core::{Availability, Backend, BackendFile, Error, ErrorKind, Result};
use std::cell::RefCell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

/// The backend type the macro's constructor returns (re-exported so that the expansion
/// names only this crate).
pub use fastensor_core::SharedBackend;

/// Makes the backend a plugin exports; implemented by [`export_plugin!`](crate::export_plugin).
pub trait Constructor {
    /// Builds one backend instance.
    fn construct() -> SharedBackend;
}

/// Wraps a backend value for [`Constructor::construct`].
pub fn shared<B: Backend>(backend: B) -> SharedBackend {
    Arc::new(backend)
}

/// The function table of a plugin whose backends `C` makes.
pub const fn table<C: Constructor>() -> PluginV1 {
    PluginV1 {
        abi_version: ABI_VERSION,
        struct_size: std::mem::size_of::<PluginV1>() as u32,
        create: create::<C>,
        destroy,
        name,
        probe,
        capabilities,
        open,
        read_at,
        write_at,
        sync,
        len,
        set_len,
        close,
        last_error,
    }
}

/// One backend instance behind the ABI.
struct Instance {
    backend: SharedBackend,
    name: String,
}

/// One file handle behind the ABI.
type Handle = Box<dyn BackendFile>;

/// The last failure on this thread: code, OS error, message.
struct LastError {
    code: i32,
    os_error: i32,
    message: String,
}

thread_local! {
    static LAST_ERROR: RefCell<Option<LastError>> = const { RefCell::new(None) };
}

fn set_last_error(code: ErrorCode, os_error: i32, message: String) {
    // A thread being torn down has no slot left; the host then gets an empty message.
    let _ = LAST_ERROR.try_with(|slot| {
        *slot.borrow_mut() = Some(LastError {
            code: code.status(),
            os_error,
            message,
        });
    });
}

/// Records `err` for `last_error` and returns its status. The message leaves out the path,
/// backend and offset (the host knows them and adds them again) but keeps a non-OS source.
fn fail(err: &Error) -> Status {
    let code = ErrorCode::from_kind(err.kind());
    let os_error = err.raw_os_error().unwrap_or(0);
    let mut message = err.message().to_string();
    if os_error == 0 {
        if let Some(source) = std::error::Error::source(err) {
            message.push_str(": ");
            message.push_str(&source.to_string());
        }
    }
    set_last_error(code, os_error, message);
    code.status()
}

/// Runs `f`, turning an error or a panic into a status; no panic leaves this function.
fn guard(f: impl FnOnce() -> Result<()>) -> Status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => STATUS_OK,
        Ok(Err(err)) => fail(&err),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            // Dropping a payload can itself panic; leak it rather than risk that.
            std::mem::forget(payload);
            set_last_error(ErrorCode::Other, 0, format!("the plugin panicked: {what}"));
            ErrorCode::Other.status()
        }
    }
}

fn null(what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("null {what} passed to the plugin"),
    )
}

/// # Safety
/// `ptr` must be null or an instance made by `create` and not yet destroyed.
unsafe fn instance<'a>(ptr: *const c_void) -> Result<&'a Instance> {
    // SAFETY: the caller guarantees ptr is null or a live Instance made by `create`.
    unsafe { ptr.cast::<Instance>().as_ref() }.ok_or_else(|| null("backend"))
}

/// # Safety
/// `ptr` must be null or a handle made by `open` and not yet closed.
unsafe fn handle<'a>(ptr: *const c_void) -> Result<&'a Handle> {
    // SAFETY: the caller guarantees ptr is null or a live Handle made by `open`.
    unsafe { ptr.cast::<Handle>().as_ref() }.ok_or_else(|| null("file handle"))
}

/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> Result<()> {
    if out.is_null() {
        return Err(null("output pointer"));
    }
    // SAFETY: out is non-null and, per the caller, valid for a write of T.
    unsafe { out.write(value) };
    Ok(())
}

/// # Safety
/// `out` must be valid for a write of a pointer.
unsafe extern "C" fn create<C: Constructor>(out: *mut *mut c_void) -> Status {
    guard(|| {
        let backend = C::construct();
        let name = backend.name().to_string();
        let ptr = Box::into_raw(Box::new(Instance { backend, name }));
        // SAFETY: the caller guarantees out is valid for a write of a pointer.
        let stored = unsafe { put(out, ptr.cast::<c_void>()) };
        if stored.is_err() {
            // SAFETY: ptr came from Box::into_raw just above and was not handed out.
            drop(unsafe { Box::from_raw(ptr) });
        }
        stored
    })
}

/// # Safety
/// `backend` must be null or an instance made by `create`, not used again afterwards.
unsafe extern "C" fn destroy(backend: *mut c_void) {
    if backend.is_null() {
        return;
    }
    // SAFETY: the caller hands back an instance made by `create` (Box::into_raw) exactly once.
    let boxed = unsafe { Box::from_raw(backend.cast::<Instance>()) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(boxed)));
}

/// # Safety
/// `backend` must be a live instance; `ptr` and `len` valid for writes.
unsafe extern "C" fn name(backend: *const c_void, ptr: *mut *const u8, len: *mut usize) -> Status {
    guard(|| {
        // SAFETY: the caller guarantees backend is a live instance.
        let inst = unsafe { instance(backend) }?;
        // SAFETY: the caller guarantees ptr and len are valid for writes.
        unsafe {
            put(ptr, inst.name.as_ptr())?;
            put(len, inst.name.len())
        }
    })
}

/// # Safety
/// `backend` must be a live instance.
unsafe extern "C" fn probe(backend: *const c_void) -> Status {
    guard(|| {
        // SAFETY: the caller guarantees backend is a live instance.
        let inst = unsafe { instance(backend) }?;
        match inst.backend.probe() {
            Availability::Available => Ok(()),
            Availability::Unavailable { reason } => Err(Error::new(ErrorKind::Unavailable, reason)),
        }
    })
}

/// # Safety
/// `backend` must be a live instance; `out` valid for a write.
unsafe extern "C" fn capabilities(backend: *const c_void, out: *mut FfiCapabilities) -> Status {
    guard(|| {
        // SAFETY: the caller guarantees backend is a live instance.
        let inst = unsafe { instance(backend) }?;
        let caps = FfiCapabilities::from(&inst.backend.capabilities());
        // SAFETY: the caller guarantees out is valid for a write.
        unsafe { put(out, caps) }
    })
}

#[cfg(unix)]
fn path_of(bytes: &[u8]) -> Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

#[cfg(not(unix))]
fn path_of(bytes: &[u8]) -> Result<PathBuf> {
    std::str::from_utf8(bytes)
        .map(PathBuf::from)
        .map_err(|_| Error::new(ErrorKind::InvalidInput, "the path is not UTF-8"))
}

/// Builds a byte slice from a raw pointer and length; empty for a zero length.
///
/// # Safety
/// When `len > 0`, `ptr` must be valid for reads of `len` bytes for `'a`.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(null("buffer"));
    }
    // SAFETY: ptr is non-null and, per the caller, valid for reads of len bytes.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// # Safety
/// `backend` must be a live instance, `path` valid for `path_len` bytes, `out` for a write.
unsafe extern "C" fn open(
    backend: *const c_void,
    path: *const u8,
    path_len: usize,
    mode: u32,
    out: *mut *mut c_void,
) -> Status {
    guard(|| {
        // SAFETY: the caller guarantees backend is a live instance.
        let inst = unsafe { instance(backend) }?;
        // SAFETY: the caller guarantees path is valid for path_len bytes.
        let path = path_of(unsafe { bytes(path, path_len) }?)?;
        let mode = mode_of_code(mode)?;
        let file: Handle = inst.backend.open(&path, mode)?;
        let ptr = Box::into_raw(Box::new(file));
        // SAFETY: the caller guarantees out is valid for a write of a pointer.
        let stored = unsafe { put(out, ptr.cast::<c_void>()) };
        if stored.is_err() {
            // SAFETY: ptr came from Box::into_raw just above and was not handed out.
            drop(unsafe { Box::from_raw(ptr) });
        }
        stored
    })
}

/// # Safety
/// `file` must be a live handle, `dst` valid for writes of `len` bytes, `read` for a write.
unsafe extern "C" fn read_at(
    file: *const c_void,
    offset: u64,
    dst: *mut u8,
    len: usize,
    read: *mut usize,
) -> Status {
    guard(|| {
        // SAFETY: the caller guarantees file is a live handle.
        let file = unsafe { handle(file) }?;
        let buf: &mut [u8] = if len == 0 {
            &mut []
        } else if dst.is_null() {
            return Err(null("buffer"));
        } else {
            // SAFETY: dst is non-null and, per the caller, valid for writes of len bytes that
            // nothing else touches during the call.
            unsafe { std::slice::from_raw_parts_mut(dst, len) }
        };
        let n = file.read_at(offset, buf.into())?;
        // SAFETY: the caller guarantees read is valid for a write.
        unsafe { put(read, n) }
    })
}

/// # Safety
/// `file` must be a live handle, `src` valid for reads of `len` bytes.
unsafe extern "C" fn write_at(
    file: *const c_void,
    offset: u64,
    src: *const u8,
    len: usize,
) -> Status {
    guard(|| {
        // SAFETY: the caller guarantees file is a live handle.
        let file = unsafe { handle(file) }?;
        // SAFETY: the caller guarantees src is valid for reads of len bytes.
        let buf = unsafe { bytes(src, len) }?;
        file.write_at(offset, buf.into())
    })
}

/// # Safety
/// `file` must be a live handle.
unsafe extern "C" fn sync(file: *const c_void) -> Status {
    // SAFETY: the caller guarantees file is a live handle.
    guard(|| unsafe { handle(file) }?.sync())
}

/// # Safety
/// `file` must be a live handle, `out` valid for a write.
unsafe extern "C" fn len(file: *const c_void, out: *mut u64) -> Status {
    guard(|| {
        // SAFETY: the caller guarantees file is a live handle.
        let n = unsafe { handle(file) }?.len()?;
        // SAFETY: the caller guarantees out is valid for a write.
        unsafe { put(out, n) }
    })
}

/// # Safety
/// `file` must be a live handle.
unsafe extern "C" fn set_len(file: *const c_void, len: u64) -> Status {
    // SAFETY: the caller guarantees file is a live handle.
    guard(|| unsafe { handle(file) }?.set_len(len))
}

/// # Safety
/// `file` must be null or a handle made by `open`, not used again afterwards.
unsafe extern "C" fn close(file: *mut c_void) {
    if file.is_null() {
        return;
    }
    // SAFETY: the caller hands back a handle made by `open` (Box::into_raw) exactly once.
    let boxed = unsafe { Box::from_raw(file.cast::<Handle>()) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(boxed)));
}

/// # Safety
/// `kind` and `os_error` must be null or valid for writes; `buf` valid for writes of `cap`
/// bytes when `cap > 0`.
unsafe extern "C" fn last_error(
    kind: *mut i32,
    os_error: *mut i32,
    buf: *mut u8,
    cap: usize,
) -> usize {
    let result = catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR
            .try_with(|slot| {
                let slot = slot.borrow();
                let (code, os, msg) = match &*slot {
                    Some(e) => (e.code, e.os_error, e.message.as_bytes()),
                    None => (0, 0, &[][..]),
                };
                // SAFETY: the caller guarantees kind and os_error are null or writable.
                unsafe {
                    let _ = put(kind, code);
                    let _ = put(os_error, os);
                }
                let n = msg.len().min(cap);
                if n > 0 && !buf.is_null() {
                    // SAFETY: buf is valid for cap >= n bytes per the caller, and cannot
                    // overlap the plugin's own message.
                    unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), buf, n) };
                }
                msg.len()
            })
            .unwrap_or(0)
    }));
    result.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastensor_core::{Capabilities, OpenMode};
    use std::path::Path;

    /// A backend whose `open` panics and whose probe says no.
    struct Grumpy;

    impl Backend for Grumpy {
        fn name(&self) -> &str {
            "grumpy"
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
        }
        fn probe(&self) -> Availability {
            Availability::Unavailable {
                reason: "never here".into(),
            }
        }
        fn open(&self, _: &Path, _: OpenMode) -> Result<Box<dyn BackendFile>> {
            panic!("grumpy refuses to open")
        }
    }

    struct MakeGrumpy;
    impl Constructor for MakeGrumpy {
        fn construct() -> SharedBackend {
            shared(Grumpy)
        }
    }

    fn last() -> (i32, i32, String) {
        let (mut kind, mut os) = (0, 0);
        let mut buf = [0u8; 8];
        // SAFETY: the outputs are locals; buf is valid for its length.
        let n = unsafe { (TABLE.last_error)(&mut kind, &mut os, buf.as_mut_ptr(), buf.len()) };
        let mut full = vec![0u8; n];
        // SAFETY: as above, with a buffer of the full length.
        let m = unsafe { (TABLE.last_error)(&mut kind, &mut os, full.as_mut_ptr(), full.len()) };
        assert_eq!(m, n);
        assert_eq!(&full[..8.min(n)], &buf[..8.min(n)]);
        (kind, os, String::from_utf8(full).unwrap())
    }

    static TABLE: PluginV1 = table::<MakeGrumpy>();

    #[test]
    fn panics_and_errors_become_statuses_with_messages() {
        let mut inst: *mut c_void = std::ptr::null_mut();
        // SAFETY: out points to a local.
        assert_eq!(unsafe { (TABLE.create)(&mut inst) }, STATUS_OK);
        // SAFETY: inst is live.
        let status = unsafe { (TABLE.probe)(inst) };
        assert_eq!(status, ErrorCode::Unavailable.status());
        assert_eq!(last(), (status, 0, "never here".to_string()));

        let path = b"/tmp/x";
        let mut file: *mut c_void = std::ptr::null_mut();
        // SAFETY: inst is live, path valid for its length, out a local.
        let status = unsafe { (TABLE.open)(inst, path.as_ptr(), path.len(), 0, &mut file) };
        assert_eq!(status, ErrorCode::Other.status());
        assert!(file.is_null());
        let (kind, _, msg) = last();
        assert_eq!(kind, ErrorCode::Other.status());
        assert_eq!(msg, "the plugin panicked: grumpy refuses to open");

        // Null pointers are refused, not dereferenced.
        // SAFETY: null is allowed by the contract of `len`.
        let status = unsafe { (TABLE.len)(std::ptr::null(), std::ptr::null_mut()) };
        assert_eq!(status, ErrorCode::InvalidInput.status());
        // SAFETY: inst came from create and is not used again.
        unsafe { (TABLE.destroy)(inst) };
    }
}
