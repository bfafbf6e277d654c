//! `fastensor._native.DeviceArray`: bytes in CUDA device memory that fastensor allocates,
//! exported through DLPack as a one-dimensional `uint8` tensor on their device. A small
//! producer and consumer of CUDA DLPack capsules that needs no framework: the offload
//! store's GPU path is tested with it where no framework has a GPU (the CUDA stand-in).
//!
//! Who owns what: the array owns its device memory; every capsule it exports keeps the
//! memory alive until the consumer deletes it.

use crate::errors::IntoPy;
use fastensor::gds::copies::{self, StreamRef};
use fastensor::gds::DeviceBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Arc;

/// Bytes in device memory of one CUDA device (see the module documentation).
#[pyclass(name = "DeviceArray", module = "fastensor._native", frozen)]
pub struct PyDeviceArray {
    buf: Arc<DeviceBuffer>,
}

#[pymethods]
impl PyDeviceArray {
    /// A copy of `data` in device memory of device `device`.
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8], device: u32) -> PyResult<Self> {
        let buf = py
            .detach(|| DeviceBuffer::from_host(data, device))
            .py_err()?;
        Ok(PyDeviceArray { buf: Arc::new(buf) })
    }

    /// `nbytes` zero bytes in device memory of device `device`.
    #[staticmethod]
    fn zeros(py: Python<'_>, nbytes: usize, device: u32) -> PyResult<Self> {
        let buf = py.detach(|| DeviceBuffer::new(nbytes, device)).py_err()?;
        Ok(PyDeviceArray { buf: Arc::new(buf) })
    }

    /// The bytes, copied to the host once the work queued on the default stream (where
    /// `OffloadStore.get_into` queues its copies without a stream) has passed.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let buf = self.buf.clone();
        let bytes = py
            .detach(move || {
                // SAFETY: 0 is the default stream of every context.
                copies::synchronize(unsafe { StreamRef::from_raw(0, buf.ordinal()) })?;
                buf.to_vec()
            })
            .py_err()?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.len()
    }

    /// DLPack's device: `(kDLCUDA, ordinal)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (crate::dlpack::KDL_CUDA, self.buf.ordinal() as i32)
    }

    /// A DLPack capsule of the bytes (version 1 when `max_version` allows). The memory is
    /// ready at once (the array's own copies are synchronous): `stream` needs no handshake.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None, read_only=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Py<PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<Py<PyAny>>,
        copy: Option<bool>,
        read_only: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, dl_device, copy, read_only);
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let owner: crate::export::Owner = Box::new(self.buf.clone());
        crate::export::device_capsule(
            py,
            self.buf.ptr(),
            self.buf.len(),
            self.buf.ordinal(),
            owner,
            versioned,
        )
    }
}
