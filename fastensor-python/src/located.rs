//! Paths handed back to Python, local or object.

use pyo3::prelude::*;
use std::path::PathBuf;

/// A path handed to Python: a `pathlib.Path` (as pyo3 converts a `PathBuf`) where that keeps
/// it as it is, else a `str`: an object URL (`pathlib.Path` would fold `s3://` into `s3:/`),
/// or any other path whose spelling `pathlib` would change (`a//b`, a trailing `/`).
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
            Some(text) if !kept_by_pathlib(&self.0) => {
                Ok(pyo3::types::PyString::new(py, text).into_any())
            }
            _ => Ok(self.0.into_pyobject(py)?.into_any()),
        }
    }
}

/// Whether `pathlib.Path` keeps `path` as spelled: it joins its parts with one `/` each (as
/// Rust's components do), so a path equal to its components joined again is kept.
fn kept_by_pathlib(path: &std::path::Path) -> bool {
    let joined: PathBuf = path.components().collect();
    joined.as_os_str() == path.as_os_str()
}

#[cfg(test)]
mod tests {
    use super::kept_by_pathlib;
    use std::path::Path;

    #[test]
    fn paths_pathlib_would_change_are_told() {
        for kept in ["/a/b.safetensors", "a/b", "/", "model.safetensors", "../x"] {
            assert!(kept_by_pathlib(Path::new(kept)), "{kept}");
        }
        for changed in ["s3://b/k", "s3://b/dir/", "/a//b", "a/"] {
            assert!(!kept_by_pathlib(Path::new(changed)), "{changed}");
        }
    }
}
