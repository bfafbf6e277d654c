//! Whole-file operations on local paths and `s3://` objects alike (the engine's
//! `read_whole`, `write_whole`, `remove`, `list_names`): what checkpoint metadata needs
//! (DCP's `.metadata`, indexes, removing superseded files).

use crate::engine::PyEngine;
use crate::errors::IntoPy;
use fastensor::core::FileOpener;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;

/// The whole file or object at `path`, as bytes.
#[pyfunction]
fn read_whole<'py>(
    py: Python<'py>,
    engine: &PyEngine,
    path: PathBuf,
) -> PyResult<Bound<'py, PyBytes>> {
    let bytes = py.detach(|| engine.engine.read_whole(&path)).py_err()?;
    Ok(PyBytes::new(py, &bytes))
}

/// Writes `data` (a `bytes`, borrowed for the call: never converted element by element)
/// as the file or object at `path`, atomically and durably.
#[pyfunction]
fn write_whole(py: Python<'_>, engine: &PyEngine, path: PathBuf, data: &[u8]) -> PyResult<()> {
    py.detach(|| engine.engine.write_whole(&path, data))
        .py_err()
}

/// Removes the file or object at `path` (nothing there is not an error).
#[pyfunction]
fn remove(py: Python<'_>, engine: &PyEngine, path: PathBuf) -> PyResult<()> {
    py.detach(|| engine.engine.remove(&path)).py_err()
}

/// The names directly inside the directory or object prefix `path`, sorted.
#[pyfunction]
fn list_names(py: Python<'_>, engine: &PyEngine, path: PathBuf) -> PyResult<Vec<String>> {
    py.detach(|| engine.engine.list_names(&path)).py_err()
}

/// True when the place `path` names, as the engine resolves it
/// (`fastensor::engine::place_of`), has directories of its own (a local file system: `os`
/// calls apply), false for an object store's prefix or object.
#[pyfunction]
fn has_directories(path: PathBuf) -> bool {
    fastensor::engine::place_of(&path).directories
}

/// Registers this module's functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_whole, m)?)?;
    m.add_function(wrap_pyfunction!(write_whole, m)?)?;
    m.add_function(wrap_pyfunction!(remove, m)?)?;
    m.add_function(wrap_pyfunction!(list_names, m)?)?;
    m.add_function(wrap_pyfunction!(has_directories, m)?)?;
    Ok(())
}
