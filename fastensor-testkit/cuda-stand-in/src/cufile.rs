//! cuFile, in compatibility mode: the driver, registered files and buffers, and the
//! `cuFileRead` and `cuFileWrite` entry points (their work is in [`io`]; a
//! write that is not aligned on an `O_DIRECT` file is a violation, since the `gds` backend
//! sends unaligned heads and tails through the page cache itself).

pub(crate) mod io;

use crate::errors::cufile as e;
use crate::errors::CUresult;
use crate::handles::Handles;
use crate::memory;
use crate::{config, context, stats};
use std::collections::BTreeMap;
use std::ffi::{c_int, c_long, c_uint, c_void};
use std::sync::Mutex;

/// `CUfileError_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUfileError {
    /// `CUfileOpError`.
    pub err: c_int,
    /// The CUDA result, for `CU_FILE_CUDA_DRIVER_ERROR`.
    pub cu_err: CUresult,
}

impl CUfileError {
    pub(crate) const OK: CUfileError = CUfileError { err: 0, cu_err: 0 };

    pub(crate) fn op(err: c_int) -> Self {
        CUfileError { err, cu_err: 0 }
    }

    pub(crate) fn cuda(code: CUresult) -> Self {
        CUfileError {
            err: e::CUDA_DRIVER_ERROR,
            cu_err: code,
        }
    }
}

/// `CUfileDescr_t`'s handle union.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_debug_implementations)]
pub union DescrHandle {
    /// A POSIX descriptor.
    pub fd: c_int,
    /// A Windows handle.
    pub handle: *mut c_void,
}

/// `CUfileDescr_t`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_debug_implementations)]
pub struct CUfileDescr {
    /// `CUfileFileHandleType`: 1 is `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
    pub type_: c_int,
    /// The descriptor.
    pub handle: DescrHandle,
    /// File-system callbacks.
    pub fs_ops: *const c_void,
}

/// `CUfileDrvProps_t` (CUDA 12).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUfileDrvProps {
    /// `nvfs.major_version`: 0, nvidia-fs is not loaded (compatibility mode).
    pub major_version: c_uint,
    /// `nvfs.minor_version`.
    pub minor_version: c_uint,
    /// `nvfs.poll_thresh_size` (KiB).
    pub poll_thresh_size: usize,
    /// `nvfs.max_direct_io_size` (KiB).
    pub max_direct_io_size: usize,
    /// `nvfs.dstatusflags`.
    pub dstatusflags: c_uint,
    /// `nvfs.dcontrolflags`.
    pub dcontrolflags: c_uint,
    /// `fflags`.
    pub fflags: c_uint,
    /// `max_device_cache_size` (KiB).
    pub max_device_cache_size: c_uint,
    /// `per_buffer_cache_size` (KiB).
    pub per_buffer_cache_size: c_uint,
    /// `max_device_pinned_mem_size` (KiB).
    pub max_device_pinned_mem_size: c_uint,
    /// `max_batch_io_size`.
    pub max_batch_io_size: c_uint,
    /// `max_batch_io_timeout_msecs`.
    pub max_batch_io_timeout_msecs: c_uint,
}

/// The largest direct I/O the driver reports, KiB.
const MAX_DIRECT_IO_KIB: usize = 16 << 10;

/// A registered file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegisteredFile {
    /// The descriptor.
    pub fd: c_int,
    /// Opened with `O_DIRECT`.
    pub direct: bool,
}

static HANDLES: Handles<RegisteredFile> = Handles::new(0xf11e_0000_0000, "a registered file");
static BUFFERS: Mutex<BTreeMap<u64, usize>> = Mutex::new(BTreeMap::new());

/// The file registered as `fh`; an unknown handle is a violation.
pub(crate) fn file(call: &str, fh: *mut c_void) -> Result<RegisteredFile, CUfileError> {
    HANDLES
        .get(call, fh)
        .ok_or(CUfileError::op(e::HANDLE_NOT_REGISTERED))
}

/// Counts a cuFile call and turns a panic into `CU_FILE_INTERNAL_ERROR`.
fn entry(name: &str, f: impl FnOnce() -> Result<(), CUfileError>) -> CUfileError {
    stats::call(name);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUfileError::OK,
        Ok(Err(err)) => err,
        Err(_) => {
            stats::violation("panic", &format!("{name} panicked inside the stand-in"));
            CUfileError::op(5030)
        }
    }
}

/// `Ok` while the CUDA driver works.
fn cuda_ready() -> Result<(), CUfileError> {
    context::ready().map_err(CUfileError::cuda)
}

/// `cuFileDriverOpen`.
#[no_mangle]
pub extern "C" fn cuFileDriverOpen() -> CUfileError {
    entry("cuFileDriverOpen", cuda_ready)
}

/// `cuFileDriverClose`.
#[no_mangle]
pub extern "C" fn cuFileDriverClose() -> CUfileError {
    entry("cuFileDriverClose", || Ok(()))
}

/// `cuFileDriverClose_v2`.
#[no_mangle]
pub extern "C" fn cuFileDriverClose_v2() -> CUfileError {
    entry("cuFileDriverClose_v2", || Ok(()))
}

/// `cuFileDriverGetProperties`: compatibility mode (nvidia-fs not loaded), 16 MiB direct
/// I/O, batches of `FASTENSOR_STAND_IN_MAX_BATCH`.
///
/// # Safety
/// `props` must be valid for a write of a `CUfileDrvProps_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileDriverGetProperties(props: *mut CUfileDrvProps) -> CUfileError {
    entry("cuFileDriverGetProperties", || {
        cuda_ready()?;
        let p = CUfileDrvProps {
            poll_thresh_size: 4,
            max_direct_io_size: MAX_DIRECT_IO_KIB,
            dcontrolflags: 1 << 1, // compatibility mode allowed
            max_device_cache_size: 128 << 10,
            per_buffer_cache_size: 1 << 10,
            max_device_pinned_mem_size: 32 << 20,
            max_batch_io_size: config::get().max_batch,
            max_batch_io_timeout_msecs: 5,
            ..CUfileDrvProps::default()
        };
        // SAFETY: the caller's contract.
        unsafe { crate::driver::put(props, p) }.map_err(|_| CUfileError::op(e::INVALID_VALUE))
    })
}

/// `cuFileHandleRegister`: regular files only.
///
/// # Safety
/// `fh` must be valid for a write and `descr` for a read of a `CUfileDescr_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileHandleRegister(
    fh: *mut *mut c_void,
    descr: *mut CUfileDescr,
) -> CUfileError {
    entry("cuFileHandleRegister", || {
        cuda_ready()?;
        if fh.is_null() || descr.is_null() {
            return Err(CUfileError::op(e::INVALID_VALUE));
        }
        // SAFETY: descr is readable (the caller's contract); for type 1 the union holds fd.
        let (kind, fd) = unsafe { ((*descr).type_, (*descr).handle.fd) };
        if kind != 1 {
            return Err(CUfileError::op(e::INVALID_VALUE));
        }
        // SAFETY: F_GETFL only reads the descriptor's flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: an all-zero `stat` is a valid value to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: st is writable.
        if flags == -1 || unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(CUfileError::op(e::INVALID_VALUE));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(CUfileError::op(e::INVALID_FILE_TYPE));
        }
        let direct = flags & libc::O_DIRECT != 0;
        if !direct {
            stats::add("notes.file_without_o_direct", 1);
        }
        let h = HANDLES.insert(RegisteredFile { fd, direct });
        stats::live("cufile_handles", 1);
        // SAFETY: the caller's contract.
        unsafe { fh.write(h) };
        Ok(())
    })
}

/// `cuFileHandleDeregister`; a descriptor already closed is a violation.
#[no_mangle]
pub extern "C" fn cuFileHandleDeregister(fh: *mut c_void) {
    stats::call("cuFileHandleDeregister");
    if let Some(f) = HANDLES.remove("cuFileHandleDeregister", fh) {
        // SAFETY: F_GETFD only checks that the descriptor is open.
        if unsafe { libc::fcntl(f.fd, libc::F_GETFD) } == -1 {
            stats::violation(
                "closed_before_deregister",
                &format!("descriptor {} closed before cuFileHandleDeregister", f.fd),
            );
        }
        stats::live("cufile_handles", -1);
    }
}

/// `cuFileBufRegister`: device memory inside one allocation.
#[no_mangle]
pub extern "C" fn cuFileBufRegister(base: *const c_void, len: usize, _flags: c_int) -> CUfileError {
    entry("cuFileBufRegister", || {
        cuda_ready()?;
        context::current("cuFileBufRegister").map_err(CUfileError::cuda)?;
        let ptr = base as u64;
        let Some((alloc, alloc_len, _)) = memory::device_allocation(ptr) else {
            stats::violation(
                "not_device_memory",
                &format!("cuFileBufRegister({ptr:#x}): not device memory"),
            );
            return Err(CUfileError::op(e::CUDA_POINTER_INVALID));
        };
        if len == 0 || ptr + len as u64 > alloc + alloc_len as u64 {
            stats::violation(
                "out_of_bounds",
                &format!("cuFileBufRegister({ptr:#x}, {len}): beyond its allocation"),
            );
            return Err(CUfileError::op(e::CUDA_POINTER_RANGE_ERROR));
        }
        let mut b = BUFFERS.lock().unwrap_or_else(|p| p.into_inner());
        if b.contains_key(&ptr) {
            return Err(CUfileError::op(e::MEMORY_ALREADY_REGISTERED));
        }
        b.insert(ptr, len);
        memory::count_registration(alloc, 1);
        stats::live("cufile_buffers", 1);
        Ok(())
    })
}

/// `cuFileBufDeregister`.
#[no_mangle]
pub extern "C" fn cuFileBufDeregister(base: *const c_void) -> CUfileError {
    entry("cuFileBufDeregister", || {
        let ptr = base as u64;
        let removed = BUFFERS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ptr);
        if removed.is_none() {
            stats::violation(
                "invalid_handle",
                &format!("cuFileBufDeregister({ptr:#x}): not registered"),
            );
            return Err(CUfileError::op(e::MEMORY_NOT_REGISTERED));
        }
        if let Some((alloc, _, _)) = memory::device_allocation(ptr) {
            memory::count_registration(alloc, -1);
        }
        stats::live("cufile_buffers", -1);
        Ok(())
    })
}

/// `cuFileUseCount`: registered files.
#[no_mangle]
pub extern "C" fn cuFileUseCount() -> c_long {
    stats::call("cuFileUseCount");
    HANDLES.len() as c_long
}

/// One synchronous transfer of `call`: counts the call; nothing for `size` 0; else checks
/// the request and runs `run` on it. Bytes moved, -1 with `errno`, or a negated
/// `CUfileOpError`.
fn transfer(
    call: &str,
    fh: *mut c_void,
    base: u64,
    size: usize,
    (file_offset, buf_offset): (i64, i64),
    run: impl FnOnce(&io::Io) -> Result<usize, io::Failure>,
) -> isize {
    stats::call(call);
    if size == 0 {
        return 0;
    }
    let req = match io::prepare(call, fh, base, size, file_offset, buf_offset) {
        Ok(req) => req,
        Err(err) => return -(err.err as isize),
    };
    match run(&req) {
        Ok(n) => n as isize,
        Err(f) => f.returned(),
    }
}

/// `cuFileRead`: bytes read, -1 with `errno`, or a negated `CUfileOpError`.
///
/// # Safety
/// `base + buf_offset .. + size` must be device memory the caller may write.
#[no_mangle]
pub unsafe extern "C" fn cuFileRead(
    fh: *mut c_void,
    base: *mut c_void,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
) -> isize {
    let offsets = (file_offset, buf_offset);
    transfer("cuFileRead", fh, base as u64, size, offsets, |req| {
        io::read(req, io::read_fault())
    })
}

/// `cuFileWrite`: bytes written, -1 with `errno`, or a negated `CUfileOpError`.
///
/// # Safety
/// `base + buf_offset .. + size` must be device memory the caller may read.
#[no_mangle]
pub unsafe extern "C" fn cuFileWrite(
    fh: *mut c_void,
    base: *const c_void,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
) -> isize {
    let offsets = (file_offset, buf_offset);
    transfer("cuFileWrite", fh, base as u64, size, offsets, |req| {
        io::write("cuFileWrite", req)
    })
}

/// Driver state checks shared with the batch API.
pub(crate) fn ready() -> Result<(), CUfileError> {
    cuda_ready()
}

/// Counts a cuFile call (for the batch API).
pub(crate) fn counted(name: &str, f: impl FnOnce() -> Result<(), CUfileError>) -> CUfileError {
    entry(name, f)
}
