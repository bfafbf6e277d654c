//! DLPack capsules this crate hands out: a one-dimensional `uint8` host tensor over memory
//! an owner keeps alive, in the unversioned protocol (what `torch.from_dlpack` takes as a
//! capsule) or version 1 (which numpy needs to make the array writable). `torch.from_dlpack` (or numpy's) makes the capsule a tensor whose
//! storage holds the owner; when the tensor dies the owner is dropped (the memory freed,
//! recycled or unmapped, as the owner's `Drop` says). A capsule no consumer took drops its
//! owner when it is collected. No byte is copied.

use crate::dlpack::{
    DlDataType, DlDevice, DlManagedTensor, DlManagedTensorVersioned, DlTensor, DlVersion, DLTENSOR,
    DLTENSOR_VERSIONED, KDL_CPU, KDL_UINT,
};
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::c_void;

/// What keeps a capsule's memory alive: dropped (from any thread) when the tensor dies.
pub type Owner = Box<dyn Send>;

/// A managed tensor with its shape and the owner of its memory (`tensor` first: a pointer
/// to a `Managed` is a pointer to its `DlManagedTensor`).
#[repr(C)]
struct Managed {
    tensor: DlManagedTensor,
    shape: [i64; 1],
    strides: [i64; 1],
    _owner: Owner,
}

/// The DLPack deleter: frees the `Managed`, dropping its owner.
///
/// # Safety
/// `p` must come from [`capsule`] and not be deleted before.
unsafe extern "C" fn delete_managed(p: *mut DlManagedTensor) {
    if !p.is_null() {
        // SAFETY: the caller's contract: `p` is the `Box<Managed>` leaked by `capsule`.
        drop(unsafe { Box::from_raw(p.cast::<Managed>()) });
    }
}

/// The capsule destructor: frees the tensor when no consumer took it (a consumer renames the
/// capsule `used_dltensor` and calls the deleter itself).
///
/// # Safety
/// Called by Python with a capsule made by `capsule`.
unsafe extern "C" fn capsule_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: `cap` is a live capsule; a capsule still named `dltensor` was never consumed
    // and holds the pointer `capsule` gave it.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, DLTENSOR.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, DLTENSOR.as_ptr()).cast::<DlManagedTensor>();
            delete_managed(p);
        }
    }
}

/// A version 1 managed tensor with its shape and owner (`tensor` first).
#[repr(C)]
struct ManagedVersioned {
    tensor: DlManagedTensorVersioned,
    shape: [i64; 1],
    strides: [i64; 1],
    _owner: Owner,
}

/// The deleter of a version 1 capsule.
///
/// # Safety
/// `p` must come from [`capsule_versioned`] and not be deleted before.
unsafe extern "C" fn delete_versioned(p: *mut DlManagedTensorVersioned) {
    if !p.is_null() {
        // SAFETY: the caller's contract: `p` is the box leaked by `capsule_versioned`.
        drop(unsafe { Box::from_raw(p.cast::<ManagedVersioned>()) });
    }
}

/// The destructor of a version 1 capsule no consumer took.
///
/// # Safety
/// Called by Python with a capsule made by `capsule_versioned`.
unsafe extern "C" fn versioned_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: as `capsule_destructor`, for the versioned name.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, DLTENSOR_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, DLTENSOR_VERSIONED.as_ptr())
                .cast::<DlManagedTensorVersioned>();
            delete_versioned(p);
        }
    }
}

/// The `DLTensor` of `len` bytes at `data`: one-dimensional `uint8`, host memory; its shape
/// and strides pointers are set by the caller once the box holding them is made.
fn host_bytes(data: *mut u8) -> DlTensor {
    DlTensor {
        data: data.cast::<c_void>(),
        device: DlDevice {
            device_type: KDL_CPU,
            device_id: 0,
        },
        ndim: 1,
        dtype: DlDataType {
            code: KDL_UINT,
            bits: 8,
            lanes: 1,
        },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

/// A capsule (the unversioned protocol, or version 1 when `versioned`) of the `len` bytes
/// at `data`, a one-dimensional writable `uint8` host tensor whose memory `owner` keeps
/// alive.
///
/// `data..data + len` must stay valid and writable (by the tensor's users) for as long as
/// `owner` lives; the caller states why where it calls this.
pub fn tensor_capsule(
    py: Python<'_>,
    data: *mut u8,
    len: usize,
    owner: Owner,
    versioned: bool,
) -> PyResult<Py<PyAny>> {
    if versioned {
        capsule_versioned(py, data, len, owner)
    } else {
        capsule(py, data, len, owner)
    }
}

/// [`tensor_capsule`] in version 1 of the protocol (flags 0: writable, not a copy).
fn capsule_versioned(
    py: Python<'_>,
    data: *mut u8,
    len: usize,
    owner: Owner,
) -> PyResult<Py<PyAny>> {
    let len = i64::try_from(len).map_err(|_| PyValueError::new_err("tensor too large"))?;
    let mut m = Box::new(ManagedVersioned {
        tensor: DlManagedTensorVersioned {
            version: DlVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor: host_bytes(data),
        },
        shape: [len],
        strides: [1],
        _owner: owner,
    });
    // The box never moves: pointers into it stay valid until the deleter frees it.
    m.tensor.dl_tensor.shape = m.shape.as_mut_ptr();
    m.tensor.dl_tensor.strides = m.strides.as_mut_ptr();
    let p = Box::into_raw(m);
    // SAFETY: `p` is a valid `ManagedVersioned` whose first field is the managed tensor;
    // the name is a static C string; on failure the box is freed below.
    let cap = unsafe {
        ffi::PyCapsule_New(
            p.cast::<c_void>(),
            DLTENSOR_VERSIONED.as_ptr(),
            Some(versioned_destructor),
        )
    };
    if cap.is_null() {
        // SAFETY: the capsule was not made, so `p` is still ours alone.
        unsafe { delete_versioned(p.cast::<DlManagedTensorVersioned>()) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}

/// [`tensor_capsule`] in the unversioned protocol.
pub fn capsule(py: Python<'_>, data: *mut u8, len: usize, owner: Owner) -> PyResult<Py<PyAny>> {
    let len = i64::try_from(len).map_err(|_| PyValueError::new_err("tensor too large"))?;
    let mut m = Box::new(Managed {
        tensor: DlManagedTensor {
            dl_tensor: host_bytes(data),
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_managed),
        },
        shape: [len],
        strides: [1],
        _owner: owner,
    });
    // The box never moves: pointers into it stay valid until the deleter frees it.
    m.tensor.dl_tensor.shape = m.shape.as_mut_ptr();
    m.tensor.dl_tensor.strides = m.strides.as_mut_ptr();
    let p = Box::into_raw(m);
    // SAFETY: `p` is a valid `Managed` whose first field is the `DlManagedTensor`; the name
    // is a static C string; on failure the box is freed below.
    let cap = unsafe {
        ffi::PyCapsule_New(
            p.cast::<c_void>(),
            DLTENSOR.as_ptr(),
            Some(capsule_destructor),
        )
    };
    if cap.is_null() {
        // SAFETY: the capsule was not made, so `p` is still ours alone.
        unsafe { delete_managed(p.cast::<DlManagedTensor>()) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}
