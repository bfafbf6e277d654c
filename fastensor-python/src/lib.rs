//! The native part of the `fastensor` Python package (private: `fastensor._native`): the
//! Rust engine and checkpoint calls. Python passes the objects that own memory (tensors,
//! arrays, buffers), never addresses: [`memory`] takes each object's memory from its own
//! export and checks every range against it. Every byte moves in Rust, detached from the
//! interpreter.

mod c10;
mod checksum;
mod device_array;
mod dlpack;
mod engine;
mod errors;
mod export;
mod files;
mod format;
mod group;
mod later;
mod located;
mod memory;
mod offload;
mod sharded;
mod slice;
mod snapshot;
mod source;
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

/// `value` as an on/off switch (`1`/`0`, `true`/`false`, `on`/`off`, `yes`/`no`, any case,
/// surrounding spaces ignored), as the engine reads its knobs; `None` when it is neither.
#[pyfunction]
fn parse_flag(value: &str) -> Option<bool> {
    fastensor::core::knobs::parse_flag(value.trim())
}

/// Where a new tensor of `nbytes` (elements of `itemsize` bytes) at `file_offset` in its
/// file starts in memory allocated at `address` with `DATA_ALIGN` bytes to spare: the
/// padding, in bytes (see `fastensor::checkpoint::direct_read_pad`). Arithmetic only:
/// `address` is never dereferenced.
#[pyfunction]
fn direct_read_pad(file_offset: u64, address: u64, nbytes: u64, itemsize: u64) -> u64 {
    fastensor::checkpoint::direct_read_pad(file_offset, address, nbytes, itemsize)
}

/// Writes `data` to `path` durably and atomically (an unnamed temporary file, synced,
/// linked over `path`, directory synced): the old file or the new one, never a torn one.
#[pyfunction]
fn write_atomic(py: Python<'_>, path: std::path::PathBuf, data: Vec<u8>) -> PyResult<()> {
    use errors::IntoPy;
    py.detach(|| fastensor::atomic::write(&path, &data))
        .py_err()
}

/// The type of the file system holding `path` (its directory when it does not exist):
/// `"ext4"`, `"tmpfs"`, ...; empty when unknown.
#[pyfunction]
fn fs_type(path: std::path::PathBuf) -> String {
    fastensor::sys::file_location(&path).fs_type
}

/// Makes glibc's malloc serve requests of at least `threshold` bytes from mappings of their
/// own, unmapped when freed (`mallopt(M_MMAP_THRESHOLD)`, process-wide, for the rest of the
/// process). Returns whether glibc took it.
#[pyfunction]
fn set_mmap_threshold(threshold: usize) -> bool {
    const M_MMAP_THRESHOLD: libc::c_int = -3;
    let Ok(t) = libc::c_int::try_from(threshold) else {
        return false;
    };
    // SAFETY: mallopt only changes a malloc tunable; any value is checked by glibc.
    unsafe { libc::mallopt(M_MMAP_THRESHOLD, t) == 1 }
}

/// What the read leases of mapped loads did in this process so far: `taken`, `refused`,
/// `breaks` (answered), `bytes_moved` (into memory of the process by those breaks),
/// `seconds_held` (writers held, in all), `longest_held`, `failed` (breaks whose memory
/// could not be moved), `late` (breaks that ended after the lease-break time), `adopted` (leases a `fork` child made its own at its start) and
/// `moved_at_start` (bytes a child moved at its start where it had no lease).
#[pyfunction]
fn lease_stats() -> std::collections::BTreeMap<&'static str, f64> {
    let s = fastensor::sys::lease::stats();
    std::collections::BTreeMap::from([
        ("taken", s.taken as f64),
        ("refused", s.refused as f64),
        ("breaks", s.breaks as f64),
        ("bytes_moved", s.bytes_moved as f64),
        ("seconds_held", s.seconds_held),
        ("longest_held", s.longest_held),
        ("failed", s.failed as f64),
        ("late", s.late as f64),
        ("adopted", s.adopted as f64),
        ("moved_at_start", s.moved_at_start as f64),
    ])
}

/// Before `os.fork`: takes a read lease for the child per lease this process holds (see
/// `fastensor_sys::lease::inherit`). Registered with `os.register_at_fork`.
#[pyfunction]
fn leases_before_fork(py: Python<'_>) {
    py.detach(fastensor::sys::lease::inherit::prepare);
}

/// After `os.fork`, in the parent: closes its descriptors of the children's leases.
#[pyfunction]
fn leases_after_fork_in_parent() {
    fastensor::sys::lease::inherit::in_parent();
}

/// After `os.fork`, in the child: makes the leases taken for it its own (its memory is
/// then moved on a break, as its parent's is).
#[pyfunction]
fn leases_after_fork_in_child(py: Python<'_>) {
    py.detach(fastensor::sys::lease::inherit::in_child);
}

/// The target paths of this process's background saves that have not finished.
#[pyfunction]
fn pending_saves() -> Vec<located::Located> {
    snapshot::pending_paths()
        .into_iter()
        .map(located::Located)
        .collect()
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
    m.add_class::<later::PyPendingPages>()?;
    m.add_class::<device_array::PyDeviceArray>()?;
    offload::register(m)?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    m.add_function(wrap_pyfunction!(default_profile_path, m)?)?;
    m.add_function(wrap_pyfunction!(parse_flag, m)?)?;
    m.add_function(wrap_pyfunction!(direct_read_pad, m)?)?;
    m.add_function(wrap_pyfunction!(write_atomic, m)?)?;
    m.add_function(wrap_pyfunction!(pending_saves, m)?)?;
    m.add_function(wrap_pyfunction!(fs_type, m)?)?;
    m.add_function(wrap_pyfunction!(set_mmap_threshold, m)?)?;
    m.add_function(wrap_pyfunction!(wait_pending_saves, m)?)?;
    m.add_function(wrap_pyfunction!(lease_stats, m)?)?;
    m.add_function(wrap_pyfunction!(leases_before_fork, m)?)?;
    m.add_function(wrap_pyfunction!(leases_after_fork_in_parent, m)?)?;
    m.add_function(wrap_pyfunction!(leases_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(source::read_new, m)?)?;
    format::register(m)?;
    sharded::register(m)?;
    group::register(m)?;
    files::register(m)?;
    slice::register(m)?;
    checksum::register(m)?;
    torch_alloc::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LOAD_ATTEMPTS", fastensor::checkpoint::LOAD_ATTEMPTS)?;
    m.add("CHECKSUMS_KEY", fastensor::checkpoint::CHECKSUMS_KEY)?;
    m.add("DATA_ALIGN", fastensor::checkpoint::DATA_ALIGN)?;
    Ok(())
}
