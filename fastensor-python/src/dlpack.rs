//! The DLPack structures (<https://dmlc.github.io/dlpack/latest/c_api.html>) this crate reads
//! from capsules other libraries export ([`crate::memory`]) and builds for the capsules it
//! hands out ([`crate::offload`]).

use std::ffi::{c_void, CStr};

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DlDevice {
    pub device_type: i32,
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DlDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
pub struct DlTensor {
    pub data: *mut c_void,
    pub device: DlDevice,
    pub ndim: i32,
    pub dtype: DlDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// `DLManagedTensor` (the unversioned protocol).
#[repr(C)]
pub struct DlManagedTensor {
    pub dl_tensor: DlTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
pub struct DlVersion {
    pub major: u32,
    pub minor: u32,
}

/// `DLManagedTensorVersioned` (protocol 1.x).
#[repr(C)]
pub struct DlManagedTensorVersioned {
    pub version: DlVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DlTensor,
}

/// The name of an unversioned capsule not yet consumed.
pub const DLTENSOR: &CStr = c"dltensor";
/// The name of a versioned capsule not yet consumed.
pub const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub const FLAG_READ_ONLY: u64 = 1;
/// `kDLCPU`.
pub const KDL_CPU: i32 = 1;
/// `kDLCUDA`.
pub const KDL_CUDA: i32 = 2;
/// `kDLCUDAHost` (pinned host memory).
pub const KDL_CUDA_HOST: i32 = 3;
/// `kDLUInt`.
pub const KDL_UINT: u8 = 1;
