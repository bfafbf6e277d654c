//! The native part of the `fastensor` Python package (private: `fastensor._native`): the
//! Rust engine and checkpoint calls. Python passes the objects that own memory (tensors,
//! arrays, buffers), never addresses: [`memory`] takes each object's memory from its own
//! export and checks every range against it. Every byte moves in Rust, detached from the
//! interpreter.

mod dlpack;
mod engine;
mod errors;
mod forklock;
mod got;
mod memory;
mod offload;
mod sharded;
mod snapshot;
mod torch_alloc;

use fastensor::Availability;
use pyo3::prelude::*;

/// Every backend compiled into this build: `(name, available, detail or reason,
/// capabilities)`.
#[pyfunction]
fn backends() -> Vec<(String, bool, Option<String>, String)> {
    fastensor::registry()
        .entries()
        .map(|e| {
            let b = &e.backend;
            let (ok, why) = match b.probe() {
                Availability::Available => (true, b.detail()),
                Availability::Unavailable { reason } => (false, Some(reason)),
            };
            (b.name().to_string(), ok, why, b.capabilities().summary())
        })
        .collect()
}

/// Where the engine's profile lives by default (as for the `fastensor` command):
/// `$FASTENSOR_PROFILE`, else `$XDG_CACHE_HOME/fastensor/profile.toml`, else
/// `~/.cache/fastensor/profile.toml`.
#[pyfunction]
fn default_profile_path() -> Option<std::path::PathBuf> {
    fastensor::engine::default_profile_path()
}

/// Writes `data` to `path` durably and atomically (an unnamed temporary file, synced,
/// linked over `path`, directory synced): the old file or the new one, never a torn one.
#[pyfunction]
fn write_atomic(py: Python<'_>, path: std::path::PathBuf, data: Vec<u8>) -> PyResult<()> {
    use errors::IntoPy;
    py.detach(|| fastensor::atomic::write(&path, &data))
        .py_err()
}

/// The target paths of this process's background saves that have not finished.
#[pyfunction]
fn pending_saves() -> Vec<std::path::PathBuf> {
    snapshot::pending_paths()
}

/// Blocks (the GIL released) until every background save started so far has finished.
#[pyfunction]
fn wait_pending_saves(py: Python<'_>) {
    py.detach(snapshot::wait_all)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::PyEngine>()?;
    m.add_class::<engine::PyCheckpointFile>()?;
    m.add_class::<snapshot::SaveHandle>()?;
    offload::register(m)?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    m.add_function(wrap_pyfunction!(default_profile_path, m)?)?;
    m.add_function(wrap_pyfunction!(write_atomic, m)?)?;
    m.add_function(wrap_pyfunction!(pending_saves, m)?)?;
    m.add_function(wrap_pyfunction!(wait_pending_saves, m)?)?;
    sharded::register(m)?;
    torch_alloc::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
