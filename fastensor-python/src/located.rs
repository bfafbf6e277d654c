//! Paths handed back to Python, local or object.

use pyo3::prelude::*;
use std::path::PathBuf;

/// A path handed to Python: a local path as a `pathlib.Path` (as pyo3 converts a
/// `PathBuf`), an object URL as a `str` (a `pathlib.Path` would fold `s3://` into `s3:/`).
#[derive(Debug, Clone)]
pub struct Located(pub PathBuf);

impl From<&std::path::Path> for Located {
    fn from(p: &std::path::Path) -> Self {
        Located(p.to_path_buf())
    }
}

impl<'py> IntoPyObject<'py> for Located {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.0.to_str() {
            Some(url) if fastensor::core::location::is_object(&self.0) => {
                Ok(pyo3::types::PyString::new(py, url).into_any())
            }
            _ => Ok(self.0.into_pyobject(py)?.into_any()),
        }
    }
}
