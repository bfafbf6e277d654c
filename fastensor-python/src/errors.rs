//! fastensor errors as Python exceptions: `fastensor.errors` builds the instance of the
//! class that matches the error's kind (each also a builtin exception users already catch).

use fastensor::{Error, ErrorKind};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The `kind` string the Python side maps to an exception class.
fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotFound => "not_found",
        ErrorKind::PermissionDenied => "permission_denied",
        ErrorKind::AlreadyExists => "already_exists",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Unsupported => "unsupported",
        ErrorKind::InvalidInput | ErrorKind::Unaligned => "invalid_input",
        ErrorKind::Corrupt | ErrorKind::UnexpectedEof => "corrupt",
        ErrorKind::StorageFull => "storage_full",
        ErrorKind::OutOfMemory => "out_of_memory",
        ErrorKind::Device => "device",
        ErrorKind::Io => "io",
        ErrorKind::Changed => "changed",
        _ => "other",
    }
}

/// Converts a fastensor error into the matching `fastensor.errors` exception.
pub fn to_py(err: Error) -> PyErr {
    Python::attach(|py| match build(py, &err) {
        Ok(exc) => PyErr::from_value(exc),
        // The errors module failed to import: still raise, with the message.
        Err(_) => PyRuntimeError::new_err(err.to_string()),
    })
}

fn build<'py>(py: Python<'py>, err: &Error) -> PyResult<Bound<'py, PyAny>> {
    let module = py.import("fastensor.errors")?;
    let path = err.path().map(|p| p.to_string_lossy().into_owned());
    module.getattr("_from_native")?.call1((
        kind_name(err.kind()),
        err.to_string(),
        path,
        err.offset(),
        err.backend(),
        err.raw_os_error(),
    ))
}

/// `Result` conversion used by every binding.
pub trait IntoPy<T> {
    /// The value, or the error as a Python exception.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for fastensor::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
