//! Reads of part of a tensor, for `safe_open(...).get_slice(name)[...]`: only the byte runs
//! the slice covers are read, through the file already open.

use crate::engine::PyCheckpointFile;
use crate::errors::IntoPy;
use crate::memory::{Access, Lender};
use fastensor::checkpoint::DimSelection;
use pyo3::prelude::*;

/// Reads the part of tensor `name` of the open `file` that `selection` keeps (one
/// `(start, count, step)` per dimension) into `dst` (host memory of exactly the slice's
/// bytes: a tensor, array or buffer), row-major, the GIL released.
#[pyfunction]
pub fn read_slice(
    py: Python<'_>,
    file: &PyCheckpointFile,
    name: String,
    selection: Vec<(u64, u64, u64)>,
    dst: Bound<'_, PyAny>,
) -> PyResult<()> {
    let file = &file.file;
    let sel: Vec<DimSelection> = selection.into_iter().map(DimSelection::from).collect();
    let mut lender = Lender::new(Access::Write);
    let what = format!("destination of a slice of `{name}`");
    let region = lender
        .region(&dst, &what)
        .map_err(|e| e.with_path(file.path()))
        .py_err()?;
    lender.check_writable().py_err()?;
    py.detach(|| {
        // SAFETY: `lender` keeps the destination lent (writable) until after this closure.
        let dst = unsafe { region.as_mut() };
        file.read_slice(&name, &sel, dst)
    })
    .py_err()
}

/// Adds the slice reads to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_slice, m)?)
}
