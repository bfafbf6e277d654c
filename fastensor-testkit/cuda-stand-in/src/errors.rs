//! CUDA driver result codes (the values of `cudaError_enum` in `cuda.h`) and cuFile's.

use std::ffi::CStr;

/// `CUresult`: a driver result code.
pub(crate) type CUresult = u32;

/// `CUDA_SUCCESS`.
pub(crate) const SUCCESS: CUresult = 0;
/// `CUDA_ERROR_INVALID_VALUE`.
pub(crate) const INVALID_VALUE: CUresult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) const OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`.
pub(crate) const NOT_INITIALIZED: CUresult = 3;
/// `CUDA_ERROR_NO_DEVICE`.
pub(crate) const NO_DEVICE: CUresult = 100;
/// `CUDA_ERROR_INVALID_DEVICE`.
pub(crate) const INVALID_DEVICE: CUresult = 101;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub(crate) const INVALID_CONTEXT: CUresult = 201;
/// `CUDA_ERROR_INVALID_HANDLE`.
pub(crate) const INVALID_HANDLE: CUresult = 400;
/// `CUDA_ERROR_NOT_READY`.
pub(crate) const NOT_READY: CUresult = 600;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub(crate) const NOT_SUPPORTED: CUresult = 801;
/// `CUDA_ERROR_UNKNOWN`: what every call returns once the device is lost.
pub(crate) const UNKNOWN: CUresult = 999;

/// `(code, name, description)` of every code this library returns.
const TABLE: [(CUresult, &CStr, &CStr); 12] = [
    (SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (OUT_OF_MEMORY, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (
        NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        INVALID_HANDLE,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (NOT_READY, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (
        NOT_SUPPORTED,
        c"CUDA_ERROR_NOT_SUPPORTED",
        c"operation not supported",
    ),
    (UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
    (
        // CUDA_ERROR_LAUNCH_FAILED: not returned, named for completeness of messages.
        719,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
];

/// The name and description of `code`, when it is one this library knows.
pub(crate) fn describe(code: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|&(_, name, text)| (name, text))
}

/// cuFile's `CUfileOpError` values used here.
pub(crate) mod cufile {
    /// `CU_FILE_IO_NOT_SUPPORTED`: what the entry points not implemented return.
    pub(crate) const IO_NOT_SUPPORTED: i32 = 5008;
    /// `CU_FILE_CUDA_DRIVER_ERROR` (with the CUDA result beside it).
    pub(crate) const CUDA_DRIVER_ERROR: i32 = 5011;
    /// `CU_FILE_CUDA_POINTER_INVALID`.
    pub(crate) const CUDA_POINTER_INVALID: i32 = 5012;
    /// `CU_FILE_CUDA_POINTER_RANGE_ERROR`.
    pub(crate) const CUDA_POINTER_RANGE_ERROR: i32 = 5014;
    /// `CU_FILE_CUDA_CONTEXT_MISMATCH`.
    pub(crate) const CUDA_CONTEXT_MISMATCH: i32 = 5015;
    /// `CU_FILE_INVALID_FILE_TYPE`.
    pub(crate) const INVALID_FILE_TYPE: i32 = 5018;
    /// `CU_FILE_INVALID_VALUE`.
    pub(crate) const INVALID_VALUE: i32 = 5022;
    /// `CU_FILE_MEMORY_ALREADY_REGISTERED`.
    pub(crate) const MEMORY_ALREADY_REGISTERED: i32 = 5023;
    /// `CU_FILE_MEMORY_NOT_REGISTERED`.
    pub(crate) const MEMORY_NOT_REGISTERED: i32 = 5024;
    /// `CU_FILE_HANDLE_NOT_REGISTERED`.
    pub(crate) const HANDLE_NOT_REGISTERED: i32 = 5027;
    /// `CU_FILE_BATCH_FULL`.
    pub(crate) const BATCH_FULL: i32 = 5037;
}
