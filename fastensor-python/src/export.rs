//! DLPack capsules this crate hands out: a one-dimensional `uint8` tensor (host memory, or
//! a CUDA device's) over memory an owner keeps alive, in the unversioned protocol (what `torch.from_dlpack` takes as a
//! capsule) or version 1 (which numpy needs to make the array writable). `torch.from_dlpack`
//! (or numpy's) makes the capsule a tensor whose storage holds the owner; when the tensor
//! dies the owner is dropped (the memory freed, recycled or unmapped, as the owner's `Drop`
//! says). A capsule no consumer took drops its owner when it is collected. No byte is
//! copied.
use crate::dlpack::{
    DlDataType, DlDevice, DlManagedTensor, DlManagedTensorVersioned, DlTensor, DlVersion, DLTENSOR,
    DLTENSOR_VERSIONED, KDL_CPU, KDL_CUDA, KDL_UINT,
};
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

/// What keeps a capsule's memory alive: dropped (from any thread) when the tensor dies.
pub type Owner = Box<dyn Send>;

/// One of the two DLPack protocols a capsule speaks: its managed-tensor struct and the
/// capsule's name before a consumer takes it.
trait Protocol: Sized + 'static {
    /// The capsule's name while no consumer has taken it.
    const NAME: &'static CStr;

    /// The managed tensor over `dl_tensor`, freed by `deleter` (no manager context; for
    /// version 1, flags 0: writable, not a copy).
    fn managed(dl_tensor: DlTensor, deleter: unsafe extern "C" fn(*mut Self)) -> Self;

    /// Its `DLTensor`.
    fn dl_tensor(&mut self) -> &mut DlTensor;
}

impl Protocol for DlManagedTensor {
    const NAME: &'static CStr = DLTENSOR;

    fn managed(dl_tensor: DlTensor, deleter: unsafe extern "C" fn(*mut Self)) -> Self {
        DlManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
        }
    }

    fn dl_tensor(&mut self) -> &mut DlTensor {
        &mut self.dl_tensor
    }
}

impl Protocol for DlManagedTensorVersioned {
    const NAME: &'static CStr = DLTENSOR_VERSIONED;

    fn managed(dl_tensor: DlTensor, deleter: unsafe extern "C" fn(*mut Self)) -> Self {
        DlManagedTensorVersioned {
            version: DlVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
            flags: 0,
            dl_tensor,
        }
    }

    fn dl_tensor(&mut self) -> &mut DlTensor {
        &mut self.dl_tensor
    }
}

/// A managed tensor with its shape and the owner of its memory (`tensor` first: a pointer
/// to a `Managed<T>` is a pointer to its `T`).
#[repr(C)]
struct Managed<T> {
    tensor: T,
    shape: [i64; 1],
    strides: [i64; 1],
    _owner: Owner,
}

/// The DLPack deleter: frees the `Managed<T>`, dropping its owner.
///
/// # Safety
/// `p` must come from [`capsule_of`] (for the same `T`) and not be deleted before.
unsafe extern "C" fn delete_managed<T: Protocol>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: the caller's contract: `p` is the `Box<Managed<T>>` leaked by `capsule_of`.
        drop(unsafe { Box::from_raw(p.cast::<Managed<T>>()) });
    }
}

/// The capsule destructor: frees the tensor when no consumer took it (a consumer renames the
/// capsule `used_dltensor` or `used_dltensor_versioned` and calls the deleter itself).
///
/// # Safety
/// Called by Python with a capsule made by `capsule_of::<T>`.
unsafe extern "C" fn capsule_destructor<T: Protocol>(cap: *mut ffi::PyObject) {
    // SAFETY: `cap` is a live capsule; one still under its first name was never consumed
    // and holds the pointer `capsule_of` gave it.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, T::NAME.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, T::NAME.as_ptr()).cast::<T>();
            delete_managed::<T>(p);
        }
    }
}

/// The host as a DLPack device.
pub const HOST: DlDevice = DlDevice {
    device_type: KDL_CPU,
    device_id: 0,
};

/// The `DLTensor` of the bytes at `data` on `device`: one-dimensional `uint8`; its shape and
/// strides pointers are set by the caller once the box holding them is made.
fn bytes_on(data: *mut u8, device: DlDevice) -> DlTensor {
    DlTensor {
        data: data.cast::<c_void>(),
        device,
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
/// at `data` on `device` ([`HOST`], or see [`device_capsule`]), a one-dimensional writable
/// `uint8` tensor whose memory `owner` keeps alive.
///
/// `data..data + len` must stay valid and writable (by the tensor's users) for as long as
/// `owner` lives; the caller states why where it calls this.
pub fn tensor_capsule(
    py: Python<'_>,
    data: *mut u8,
    len: usize,
    device: DlDevice,
    owner: Owner,
    versioned: bool,
) -> PyResult<Py<PyAny>> {
    if versioned {
        capsule_of::<DlManagedTensorVersioned>(py, data, len, device, owner)
    } else {
        capsule_of::<DlManagedTensor>(py, data, len, device, owner)
    }
}

/// [`tensor_capsule`] of host memory in the unversioned protocol.
pub fn capsule(py: Python<'_>, data: *mut u8, len: usize, owner: Owner) -> PyResult<Py<PyAny>> {
    capsule_of::<DlManagedTensor>(py, data, len, HOST, owner)
}

/// A capsule (version 1 when `versioned`) of the `len` bytes of device memory at `ptr` on
/// CUDA device `ordinal`, a one-dimensional `uint8` tensor whose memory `owner` keeps
/// alive. The memory must stay valid for as long as `owner` lives.
pub fn device_capsule(
    py: Python<'_>,
    ptr: u64,
    len: usize,
    ordinal: u32,
    owner: Owner,
    versioned: bool,
) -> PyResult<Py<PyAny>> {
    let device = DlDevice {
        device_type: KDL_CUDA,
        device_id: i32::try_from(ordinal).map_err(|_| PyValueError::new_err("bad device"))?,
    };
    tensor_capsule(py, ptr as usize as *mut u8, len, device, owner, versioned)
}

/// [`tensor_capsule`] in the protocol `T`, of memory on `device`.
fn capsule_of<T: Protocol>(
    py: Python<'_>,
    data: *mut u8,
    len: usize,
    device: DlDevice,
    owner: Owner,
) -> PyResult<Py<PyAny>> {
    let len = i64::try_from(len).map_err(|_| PyValueError::new_err("tensor too large"))?;
    let mut m = Box::new(Managed {
        tensor: T::managed(bytes_on(data, device), delete_managed::<T>),
        shape: [len],
        strides: [1],
        _owner: owner,
    });
    // The box never moves: pointers into it stay valid until the deleter frees it.
    let (shape, strides) = (m.shape.as_mut_ptr(), m.strides.as_mut_ptr());
    let dl = m.tensor.dl_tensor();
    dl.shape = shape;
    dl.strides = strides;
    let p = Box::into_raw(m);
    // SAFETY: `p` is a valid `Managed<T>` whose first field is the managed tensor; the name
    // is a static C string; on failure the box is freed below.
    let cap = unsafe {
        ffi::PyCapsule_New(
            p.cast::<c_void>(),
            T::NAME.as_ptr(),
            Some(capsule_destructor::<T>),
        )
    };
    if cap.is_null() {
        // SAFETY: the capsule was not made, so `p` is still ours alone.
        unsafe { delete_managed::<T>(p.cast::<T>()) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}
