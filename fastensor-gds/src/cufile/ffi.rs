//! Raw cuFile FFI: the C types this crate needs (foreign enums kept as plain integers, so an
//! unknown value from a newer library is never undefined behaviour) and a table of function
//! pointers resolved from a library loaded with `libloading`.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};

/// `CUfileError_t`: a cuFile status and, for `CU_FILE_CUDA_DRIVER_ERROR`, the CUDA result.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUfileError_t {
    /// `CUfileOpError` (0 is success).
    pub err: c_int,
    /// `CUresult`.
    pub cu_err: c_int,
}

/// `CUfileDescr_t`'s handle union.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_debug_implementations)] // printed through CUfileDescr_t
pub union CUfileHandleUnion {
    /// A POSIX file descriptor.
    pub fd: c_int,
    /// A Windows handle (unused).
    pub handle: *mut c_void,
}

/// `CUfileDescr_t`: what `cuFileHandleRegister` registers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileDescr_t {
    /// `CUfileFileHandleType`: 1 is `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
    pub type_: c_int,
    /// The descriptor.
    pub handle: CUfileHandleUnion,
    /// File-system callbacks; null for ordinary files.
    pub fs_ops: *const c_void,
}

impl std::fmt::Debug for CUfileDescr_t {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: this crate only builds descriptors of type OPAQUE_FD, whose union holds `fd`.
        let fd = unsafe { self.handle.fd };
        f.debug_struct("CUfileDescr_t")
            .field("type_", &self.type_)
            .field("fd", &fd)
            .finish()
    }
}

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
pub const HANDLE_TYPE_OPAQUE_FD: c_int = 1;

/// The `nvfs` part of `CUfileDrvProps_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUfileNvfsProps {
    /// nvidia-fs kernel driver major version (0 when it is not loaded).
    pub major_version: c_uint,
    /// nvidia-fs minor version.
    pub minor_version: c_uint,
    /// Poll-mode threshold (KiB).
    pub poll_thresh_size: usize,
    /// Largest single direct I/O (KiB).
    pub max_direct_io_size: usize,
    /// `CUfileDriverStatusFlags` bits: supported storage kinds.
    pub dstatusflags: c_uint,
    /// `CUfileDriverControlFlags` bits: poll mode, compatibility mode.
    pub dcontrolflags: c_uint,
}

/// `CUfileDrvProps_t` (CUDA 11.6 and later), followed by spare room in case a newer library
/// writes more fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUfileDrvProps_t {
    /// The nvidia-fs properties.
    pub nvfs: CUfileNvfsProps,
    /// `CUfileFeatureFlags` bits.
    pub fflags: c_uint,
    /// Device cache size (KiB).
    pub max_device_cache_size: c_uint,
    /// Per-buffer cache size (KiB).
    pub per_buffer_cache_size: c_uint,
    /// Pinned device memory limit (KiB).
    pub max_device_pinned_mem_size: c_uint,
    /// Largest number of requests in one batch.
    pub max_batch_io_size: c_uint,
    /// Batch timeout (ms).
    pub max_batch_io_timeout_msecs: c_uint,
    /// Room for fields of newer versions.
    pub spare: [u8; 256],
}

impl Default for CUfileDrvProps_t {
    fn default() -> Self {
        CUfileDrvProps_t {
            nvfs: CUfileNvfsProps::default(),
            fflags: 0,
            max_device_cache_size: 0,
            per_buffer_cache_size: 0,
            max_device_pinned_mem_size: 0,
            max_batch_io_size: 0,
            max_batch_io_timeout_msecs: 0,
            spare: [0; 256],
        }
    }
}

/// Status bit of `dstatusflags`: NVMe supported through nvidia-fs.
pub const STATUS_NVME: c_uint = 1 << 4;
/// Status bit of `dstatusflags`: NVMe supported through the kernel's PCI P2PDMA.
pub const STATUS_NVME_P2P: c_uint = 1 << 11;
/// Control bit of `dcontrolflags`: compatibility mode allowed.
pub const CONTROL_ALLOW_COMPAT: c_uint = 1 << 1;
/// Control bit of `dcontrolflags`: every I/O forced through POSIX (compatibility) mode.
pub const CONTROL_POSIX_IO: c_uint = 1 << 2;

/// `CUfileIOParams_t` in batch mode.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUfileIOParams_t {
    /// `CUfileBatchMode_t`: 1 is `CUFILE_BATCH`.
    pub mode: c_uint,
    /// Device buffer base.
    pub devPtr_base: *mut c_void,
    /// File offset.
    pub file_offset: i64,
    /// Offset into the buffer.
    pub devPtr_offset: i64,
    /// Bytes.
    pub size: usize,
    /// The registered file.
    pub fh: *mut c_void,
    /// `CUfileOpcode_t`: 0 read, 1 write.
    pub opcode: c_uint,
    /// Returned in the completion event.
    pub cookie: *mut c_void,
}

/// `CUfileIOEvents_t`: one completion of a batch.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUfileIOEvents_t {
    /// The request's cookie.
    pub cookie: *mut c_void,
    /// `CUfileStatus_t` bits.
    pub status: c_uint,
    /// Bytes transferred.
    pub ret: usize,
}

/// `CUFILE_COMPLETE`.
pub const STATUS_COMPLETE: c_uint = 0x10;
/// `CUFILE_WAITING | CUFILE_PENDING`: still running.
pub const STATUS_RUNNING: c_uint = 0x1 | 0x2;

type Handle = *mut c_void;

/// The cuFile functions this crate calls, resolved once.
#[derive(Debug, Clone, Copy)]
pub struct CuFileFns {
    /// `cuFileDriverOpen`.
    pub driver_open: unsafe extern "C" fn() -> CUfileError_t,
    /// `cuFileDriverClose` (`_v2` where present).
    pub driver_close: unsafe extern "C" fn() -> CUfileError_t,
    /// `cuFileDriverGetProperties`.
    pub driver_get_properties: unsafe extern "C" fn(*mut CUfileDrvProps_t) -> CUfileError_t,
    /// `cuFileHandleRegister`.
    pub handle_register: unsafe extern "C" fn(*mut Handle, *mut CUfileDescr_t) -> CUfileError_t,
    /// `cuFileHandleDeregister`.
    pub handle_deregister: unsafe extern "C" fn(Handle),
    /// `cuFileBufRegister`.
    pub buf_register: unsafe extern "C" fn(*const c_void, usize, c_int) -> CUfileError_t,
    /// `cuFileBufDeregister`.
    pub buf_deregister: unsafe extern "C" fn(*const c_void) -> CUfileError_t,
    /// `cuFileRead`: bytes read, -1 with `errno`, or a negated `CUfileOpError`.
    pub read: unsafe extern "C" fn(Handle, *mut c_void, usize, i64, i64) -> isize,
    /// `cuFileWrite`: as `read`.
    pub write: unsafe extern "C" fn(Handle, *const c_void, usize, i64, i64) -> isize,
    /// The batch API, where the library has it.
    pub batch: Option<BatchFns>,
}

/// `cuFileBatchIO*`.
#[derive(Debug, Clone, Copy)]
pub struct BatchFns {
    /// `cuFileBatchIOSetUp`.
    pub set_up: unsafe extern "C" fn(*mut Handle, c_uint) -> CUfileError_t,
    /// `cuFileBatchIOSubmit`.
    pub submit:
        unsafe extern "C" fn(Handle, c_uint, *mut CUfileIOParams_t, c_uint) -> CUfileError_t,
    /// `cuFileBatchIOGetStatus`.
    pub get_status: unsafe extern "C" fn(
        Handle,
        c_uint,
        *mut c_uint,
        *mut CUfileIOEvents_t,
        *mut libc_timespec,
    ) -> CUfileError_t,
    /// `cuFileBatchIODestroy`.
    pub destroy: unsafe extern "C" fn(Handle),
    /// `cuFileBatchIOCancel`, where the library has it.
    pub cancel: Option<unsafe extern "C" fn(Handle) -> CUfileError_t>,
}

/// `struct timespec` on 64-bit Linux.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct libc_timespec {
    /// Seconds.
    pub tv_sec: i64,
    /// Nanoseconds.
    pub tv_nsec: i64,
}

/// Resolves `name` in `lib` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the exact C signature of the symbol.
unsafe fn sym<F: Copy>(lib: &libloading::Library, name: &str) -> Result<F, String> {
    // SAFETY: the caller guarantees F matches the symbol's signature.
    unsafe { lib.get::<F>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{name}: {e}"))
}

impl CuFileFns {
    /// Resolves every function from `lib`; a missing required symbol is an error naming it.
    pub fn load(lib: &libloading::Library) -> Result<Self, String> {
        // SAFETY: each type below is the C prototype from cufile.h, with enums as c_int /
        // c_uint, off_t as i64 and ssize_t as isize (64-bit Linux).
        unsafe {
            let batch = match (
                sym(lib, "cuFileBatchIOSetUp"),
                sym(lib, "cuFileBatchIOSubmit"),
                sym(lib, "cuFileBatchIOGetStatus"),
                sym(lib, "cuFileBatchIODestroy"),
            ) {
                (Ok(set_up), Ok(submit), Ok(get_status), Ok(destroy)) => Some(BatchFns {
                    set_up,
                    submit,
                    get_status,
                    destroy,
                    cancel: sym(lib, "cuFileBatchIOCancel").ok(),
                }),
                _ => None,
            };
            Ok(CuFileFns {
                driver_open: sym(lib, "cuFileDriverOpen")?,
                driver_close: sym(lib, "cuFileDriverClose_v2")
                    .or_else(|_| sym(lib, "cuFileDriverClose"))?,
                driver_get_properties: sym(lib, "cuFileDriverGetProperties")?,
                handle_register: sym(lib, "cuFileHandleRegister")?,
                handle_deregister: sym(lib, "cuFileHandleDeregister")?,
                buf_register: sym(lib, "cuFileBufRegister")?,
                buf_deregister: sym(lib, "cuFileBufDeregister")?,
                read: sym(lib, "cuFileRead")?,
                write: sym(lib, "cuFileWrite")?,
                batch,
            })
        }
    }
}

/// The name of a `CUfileOpError` value.
pub fn op_error_name(code: i32) -> &'static str {
    match code {
        0 => "CU_FILE_SUCCESS",
        5001 => "CU_FILE_DRIVER_NOT_INITIALIZED",
        5002 => "CU_FILE_DRIVER_INVALID_PROPS",
        5003 => "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        5004 => "CU_FILE_DRIVER_VERSION_MISMATCH",
        5005 => "CU_FILE_DRIVER_VERSION_READ_ERROR",
        5006 => "CU_FILE_DRIVER_CLOSING",
        5007 => "CU_FILE_PLATFORM_NOT_SUPPORTED",
        5008 => "CU_FILE_IO_NOT_SUPPORTED",
        5009 => "CU_FILE_DEVICE_NOT_SUPPORTED",
        5010 => "CU_FILE_NVFS_DRIVER_ERROR",
        5011 => "CU_FILE_CUDA_DRIVER_ERROR",
        5012 => "CU_FILE_CUDA_POINTER_INVALID",
        5013 => "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        5014 => "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        5015 => "CU_FILE_CUDA_CONTEXT_MISMATCH",
        5016 => "CU_FILE_INVALID_MAPPING_SIZE",
        5017 => "CU_FILE_INVALID_MAPPING_RANGE",
        5018 => "CU_FILE_INVALID_FILE_TYPE",
        5019 => "CU_FILE_INVALID_FILE_OPEN_FLAG",
        5020 => "CU_FILE_DIO_NOT_SET",
        5022 => "CU_FILE_INVALID_VALUE",
        5023 => "CU_FILE_MEMORY_ALREADY_REGISTERED",
        5024 => "CU_FILE_MEMORY_NOT_REGISTERED",
        5025 => "CU_FILE_PERMISSION_DENIED",
        5026 => "CU_FILE_DRIVER_ALREADY_OPEN",
        5027 => "CU_FILE_HANDLE_NOT_REGISTERED",
        5028 => "CU_FILE_HANDLE_ALREADY_REGISTERED",
        5029 => "CU_FILE_DEVICE_NOT_FOUND",
        5030 => "CU_FILE_INTERNAL_ERROR",
        5031 => "CU_FILE_GETNEWFD_FAILED",
        5033 => "CU_FILE_NVFS_SETUP_ERROR",
        5034 => "CU_FILE_IO_DISABLED",
        5035 => "CU_FILE_BATCH_SUBMIT_FAILED",
        5036 => "CU_FILE_GPU_MEMORY_PINNING_FAILED",
        5037 => "CU_FILE_BATCH_FULL",
        5038 => "CU_FILE_ASYNC_NOT_SUPPORTED",
        _ => "unknown cuFile error",
    }
}
