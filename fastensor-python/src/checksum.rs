//! Per-tensor checksums for Python: computed for a save (`save_file(..., checksum=True)`),
//! and files opened with every whole-tensor read verified (`verify=True`). The bytes are
//! hashed in Rust, detached from the interpreter.

use crate::engine::{save_tensors, views, PyCheckpointFile, PyEngine, SaveSpec};
use crate::errors::IntoPy;
use crate::memory::{Access, Lender};
use fastensor::checkpoint::{self, checksum};
use pyo3::prelude::*;
use std::path::PathBuf;

/// The value to store under `fastensor.checksums` in the metadata of a save of `specs`
/// (`(name, dtype, shape, object)`, host memory): a JSON map of each tensor's name to the
/// CRC-32C of its bytes, computed in parallel.
#[pyfunction]
pub fn checksums(py: Python<'_>, specs: Vec<SaveSpec<'_>>) -> PyResult<String> {
    let mut lender = Lender::new(Access::Read);
    let tensors = save_tensors(&specs, &mut lender).py_err()?;
    py.detach(|| {
        // SAFETY: `lender` keeps every tensor's memory lent until after this closure.
        let views = unsafe { views(&tensors) };
        checksum::compute(&views).map(|sums| checksum::encode(&sums))
    })
    .py_err()
}

/// Opens the safetensors file at `path` with its reads verified: each tensor read whole is
/// checked against its stored checksum on the I/O thread that read it (see
/// `CheckpointFile::verifying`); a file saved without checksums is an `InvalidInputError`.
#[pyfunction]
pub fn open_verified(
    py: Python<'_>,
    engine: &PyEngine,
    path: PathBuf,
) -> PyResult<PyCheckpointFile> {
    let file = py
        .detach(|| checkpoint::open(&engine.engine, &path).and_then(|f| f.verifying()))
        .py_err()?;
    Ok(PyCheckpointFile { file })
}

/// Checks every tensor of the file at `path` against its checksum without loading it
/// (streamed through small buffers). Returns `(tensors, bytes)` checked.
#[pyfunction]
pub fn verify_file(py: Python<'_>, engine: &PyEngine, path: PathBuf) -> PyResult<(usize, u64)> {
    py.detach(|| checkpoint::verify_file(&engine.engine, &path))
        .map(|v| (v.tensors, v.bytes))
        .py_err()
}

/// Adds the checksum calls to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(checksums, m)?)?;
    m.add_function(wrap_pyfunction!(open_verified, m)?)?;
    m.add_function(wrap_pyfunction!(verify_file, m)?)
}
