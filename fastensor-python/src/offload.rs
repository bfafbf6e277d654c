//! `fastensor._native.OffloadStore`: the Rust [`OffloadStore`] for `fastensor.torch.offload`.
//!
//! Who owns what:
//! - `put` writes a tensor's memory in place: the store keeps a reference to the Python
//!   object that owns the memory (a torch tensor) until the background write has finished,
//!   then drops it, so torch frees the memory (the reference is dropped without the GIL and
//!   released the next time this module enters the interpreter, at the latest when the next
//!   `put` or `get` returns).
//! - `get` returns a DLPack capsule over a page-aligned block of the process's host pool
//!   (the one torch's large CPU allocations come from while offload runs, see
//!   [`crate::torch_alloc`]) that the store read the bytes into (ahead of time, or on
//!   demand); `torch.from_dlpack` makes it a tensor that owns the block; the capsule's
//!   deleter gives it back to the pool, where later reads and allocations reuse its memory,
//!   already faulted in. No byte is copied on either side.

use crate::engine::PyEngine;
use crate::errors::IntoPy;
use crate::memory::{self, Access, Lent, Place};
use fastensor::gds::copies::{DeviceBytes, DeviceDest, DeviceSource, StreamRef};
use fastensor::offload::{
    defaults, DevicePath, Figure, ForeignBytes, Handle, HostPool, OffloadConfig, OffloadStore,
    Payload,
};
use fastensor::HostBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A tensor's memory, lent to the store by the Python object that owns it.
struct TensorBytes {
    /// Keeps the memory alive and lent; dropped (without the GIL, deferred by pyo3) once
    /// written.
    _lent: Lent,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the memory is only read, from any thread, while `_lent` keeps it alive and lent;
// a `Lent` holds only Python references (dropped under the GIL, which pyo3 takes or
// defers) and a buffer view released under the GIL.
unsafe impl Send for TensorBytes {}
// SAFETY: as above: shared access only reads.
unsafe impl Sync for TensorBytes {}

impl ForeignBytes for TensorBytes {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` lies within the host memory `_lent` keeps lent (checked
        // by `put`); the Python wrapper writes none of it while it is offloaded (autograd
        // refuses saved tensors modified in place).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A CUDA tensor's memory, lent to the store by the object that owns it.
struct DeviceLent {
    range: fastensor::core::DeviceRange,
    /// Keeps the memory alive and lent; dropped (without the GIL, deferred by pyo3) once
    /// copied out or written.
    _lent: Lent,
}

// SAFETY: the value is only read (`range`, plain data) from other threads, and dropped on
// one; a `Lent` holds only Python references (dropped under the GIL, which pyo3 takes or
// defers) and a DLPack capsule (device memory is never lent through the buffer protocol).
unsafe impl Send for DeviceLent {}
// SAFETY: as above: shared access only reads `range`.
unsafe impl Sync for DeviceLent {}

// SAFETY: `range` is the device memory `_lent`'s export describes (checked by `put_device`),
// kept allocated by the export while the value lives; the producer ordered its writes
// before the store's copy stream (the stream handshake), and autograd refuses saved
// tensors modified in place later.
unsafe impl DeviceBytes for DeviceLent {
    fn range(&self) -> fastensor::core::DeviceRange {
        self.range
    }
}

/// One tensor in a store; dropping it (or `release()`) frees its memory and file space.
#[pyclass(name = "OffloadHandle", module = "fastensor._native", frozen)]
pub struct PyHandle {
    handle: Mutex<Option<Handle>>,
    nbytes: u64,
}

impl PyHandle {
    fn with<T>(&self, f: impl FnOnce(&Handle) -> T) -> PyResult<T> {
        let guard = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(h) => Ok(f(h)),
            None => Err(PyValueError::new_err("the offloaded tensor was released")),
        }
    }
}

#[pymethods]
impl PyHandle {
    /// The tensor's length in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Frees the tensor's memory and file space now (a later `get` fails).
    fn release(&self) {
        let h = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(h);
    }
}

/// An offload store: one swap file in `dir`, a memory budget, background writes, and
/// prefetch in backward (last in, first out) order.
#[pyclass(name = "OffloadStore", module = "fastensor._native", frozen)]
pub struct PyOffloadStore {
    /// `None` once closed. The lock is held only to look at or take the store, never
    /// across a call into it (which may wait, the GIL released): a thread that holds the
    /// GIL never waits for a thread that needs it.
    store: Mutex<Option<Arc<OffloadStore>>>,
}

impl PyOffloadStore {
    /// Runs `f` on the open store. A `close` meanwhile does not wait for `f`: the store
    /// goes once the last call using it returns.
    fn with<T>(&self, f: impl FnOnce(&OffloadStore) -> PyResult<T>) -> PyResult<T> {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(store) = store else {
            return Err(PyValueError::new_err("the offload store is closed"));
        };
        let out = f(&store);
        // Alone with the store: it was closed during `f`.
        if let Ok(store) = Arc::try_unwrap(store) {
            drop_in_background(store);
        }
        out
    }
}

/// Drops a closed store in a thread of its own: tearing down its I/O (an io_uring
/// instance, the swap file's blocks) takes time its caller need not wait for.
fn drop_in_background(store: OffloadStore) {
    let spawned = std::thread::Builder::new()
        .name("fastensor-offload-close".into())
        .spawn(move || drop(store));
    // A spawn that fails drops the closure, and the store with it, here.
    let _ = spawned;
}

#[pymethods]
impl PyOffloadStore {
    /// A store whose swap file is a new file in `dir`, opened through `engine`. Every tensor
    /// put goes to the store (the caller keeps small ones itself); the last ones put, up to
    /// `write_behind` bytes (`None`: `OffloadConfig::write_behind`'s default), wait
    /// unwritten and are never written if taken back first; so do the last GPU tensors put,
    /// in their own device memory, up to `device_write_behind` bytes per GPU (`None`: the
    /// budget). `initial_capacity` bytes are
    /// reserved in the swap file at once: growing it later waits for the writes in flight.
    /// With `pack`, chunks that are mostly zeros or two-valued cross to the file as bitmaps
    /// (`OffloadConfig::pack`).
    #[new]
    #[pyo3(signature = (engine, dir, budget, prefetch_depth=defaults::PREFETCH_AS_BUDGET_HOLDS, io_threads=defaults::IO_THREADS, initial_capacity=0, device_path="auto", write_behind=None, pack=defaults::PACK, device_write_behind=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        engine: &PyEngine,
        dir: PathBuf,
        budget: u64,
        prefetch_depth: usize,
        io_threads: usize,
        initial_capacity: u64,
        device_path: &str,
        write_behind: Option<u64>,
        pack: bool,
        device_write_behind: Option<u64>,
    ) -> PyResult<Self> {
        let device_path: DevicePath = device_path.parse().py_err()?;
        let config = OffloadConfig {
            write_behind,
            device_write_behind,
            ..OffloadConfig::new(dir, budget)
        };
        let config = config
            .device_path(device_path)
            .prefetch_depth(prefetch_depth)
            .small_threshold(0)
            .io_threads(io_threads)
            .initial_capacity(initial_capacity)
            .pack(pack)
            .pool(crate::torch_alloc::pool());
        let store = py
            .detach(|| OffloadStore::new(&engine.engine, config))
            .py_err()?;
        Ok(PyOffloadStore {
            store: Mutex::new(Some(Arc::new(store))),
        })
    }

    /// The swap file's path.
    #[getter]
    fn path(&self) -> PyResult<PathBuf> {
        self.with(|s| Ok(s.path().to_path_buf()))
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Closes the store: the handles left fail to `get` from now on; its I/O threads stop
    /// and its swap file (which has no name) goes in a background thread, since tearing
    /// down a store's I/O (an io_uring instance, the file's blocks) takes time a training
    /// step need not wait for. Never waits for a `put` or `get` under way in another thread
    /// (it finishes on the store it started with, which goes once it returns). Closing
    /// twice does nothing.
    fn close(&self, _py: Python<'_>) {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner()).take();
        // A call under way in another thread holds the store: it drops it when it returns.
        if let Some(Ok(store)) = store.map(Arc::try_unwrap) {
            drop_in_background(store);
        }
    }

    /// Offloads the memory of `owner` (a contiguous host tensor, array or buffer), kept
    /// lent until written. With `whole_pages`, a block of the caching allocator is written
    /// to its page-rounded end where the block holds it (a direct write with no copy of a
    /// partial page). Waits while the budget has no room (the GIL released).
    #[pyo3(signature = (owner, label, whole_pages=false))]
    fn put(
        &self,
        py: Python<'_>,
        owner: &Bound<'_, PyAny>,
        label: String,
        whole_pages: bool,
    ) -> PyResult<PyHandle> {
        // A DLPack export only: its release needs no GIL, so the store may drop it on an I/O
        // thread (a buffer view's release would need the GIL there).
        if !owner.hasattr("__dlpack__")? {
            return Err(PyValueError::new_err(
                "an offloaded tensor must export DLPack (a torch tensor or numpy array)",
            ));
        }
        let lent = memory::lend_dlpack(owner, Access::Read, "an offloaded tensor").py_err()?;
        let region = lent.region();
        if region.place() != Place::Host {
            return Err(PyValueError::new_err(
                "an offloaded tensor must be in host memory (copy it to the host first)",
            ));
        }
        let nbytes = region.len();
        let len = if whole_pages {
            crate::torch_alloc::readable_len(region.addr(), nbytes)
        } else {
            nbytes
        };
        let bytes = TensorBytes {
            ptr: region.addr() as *const u8,
            len,
            _lent: lent,
        };
        let handle = self.with(|s| py.detach(|| s.put(Payload::foreign(bytes), label)).py_err())?;
        Ok(PyHandle {
            handle: Mutex::new(Some(handle)),
            nbytes: nbytes as u64,
        })
    }

    /// Offloads the memory of `owner`, a contiguous CUDA tensor (or any object exporting
    /// CUDA memory through DLPack), and returns at once. It is handed over with DLPack's
    /// stream handshake on the store's copy stream of its device (the producer orders its
    /// pending work on the tensor first), kept lent until copied out of device memory (or
    /// written, on the direct path), then given back; nothing waits for the device here.
    fn put_device(
        &self,
        py: Python<'_>,
        owner: &Bound<'_, PyAny>,
        label: String,
    ) -> PyResult<PyHandle> {
        let device = owner
            .call_method0("__dlpack_device__")
            .and_then(|d| d.extract::<(i32, i32)>());
        let Ok((kind, index)) = device else {
            return Err(PyValueError::new_err(
                "put_device takes CUDA memory: an object exporting it through DLPack",
            ));
        };
        if kind != crate::dlpack::KDL_CUDA {
            return Err(PyValueError::new_err(
                "put_device takes CUDA memory (DLPack device type kDLCUDA)",
            ));
        }
        let gpu = u32::try_from(index).map_err(|_| PyValueError::new_err("bad CUDA device"))?;
        let stream = self.with(|s| py.detach(|| s.copy_stream(gpu)).py_err())?;
        let lent = memory::lend_dlpack_on(
            owner,
            Access::Read,
            "an offloaded tensor",
            Some(stream.handle()),
        )
        .py_err()?;
        let region = lent.region();
        if region.place() != Place::Cuda(gpu) {
            return Err(PyValueError::new_err(format!(
                "the tensor's memory is not on CUDA device {gpu}"
            )));
        }
        let nbytes = region.len();
        let bytes = DeviceLent {
            range: fastensor::core::DeviceRange::new(region.addr() as u64, nbytes, gpu),
            _lent: lent,
        };
        let handle = self.with(|s| {
            py.detach(|| {
                let ready = s.ready_after_handshake(gpu)?;
                s.put_device(DeviceSource::new(Box::new(bytes), Some(ready)), label)
            })
            .py_err()
        })?;
        Ok(PyHandle {
            handle: Mutex::new(Some(handle)),
            nbytes: nbytes as u64,
        })
    }

    /// Copies the tensor into `dest` (contiguous CUDA memory of its length) on `stream` (an
    /// object with the stream's handle as `cuda_stream`, such as `torch.cuda.Stream`; `None`:
    /// the default stream) and returns at once: work queued on `stream` after this sees the
    /// bytes. `dest` is handed over with DLPack's stream handshake on `stream`.
    #[pyo3(signature = (handle, dest, stream=None))]
    fn get_into(
        &self,
        py: Python<'_>,
        handle: &PyHandle,
        dest: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let raw: usize = match stream {
            Some(s) => s.getattr("cuda_stream")?.extract()?,
            None => 0,
        };
        if !dest.hasattr("__dlpack__")? {
            return Err(PyValueError::new_err(
                "get_into fills CUDA memory: an object exporting it through DLPack",
            ));
        }
        let handshake = (raw != 0).then_some(raw);
        let lent =
            memory::lend_dlpack_on(dest, Access::Write, "the destination", handshake).py_err()?;
        let region = lent.region();
        let Place::Cuda(gpu) = region.place() else {
            return Err(PyValueError::new_err("get_into fills CUDA memory"));
        };
        let range = fastensor::core::DeviceRange::new(region.addr() as u64, region.len(), gpu);
        // SAFETY: `range` is the memory `dest` exports for writing, on its device; `raw` is
        // the caller's stream of that device (or the default stream). The copy is queued on
        // that stream: the memory's owner, a stream-ordered allocator or the caller, keeps
        // it until the stream's work has passed it (as for any kernel queued there).
        let dest = unsafe { DeviceDest::new(range, StreamRef::from_raw(raw, gpu)) };
        self.with(|s| {
            handle
                .with(|h| py.detach(|| s.get_into_device(h, &dest)))?
                .py_err()
        })?;
        drop(lent);
        Ok(())
    }

    /// The tensor's bytes as a DLPack capsule (one-dimensional `uint8`, host memory) that
    /// owns them; waits (the GIL released) when they are not back yet. `length` shortens the
    /// tensor to the bytes that matter (a `put` may have written a padded length). With
    /// `written`, the bytes as they were put, even where the memory put was changed since
    /// (read from disk once its write has finished).
    #[pyo3(signature = (handle, length=None, written=false))]
    fn get(
        &self,
        py: Python<'_>,
        handle: &PyHandle,
        length: Option<usize>,
        written: bool,
    ) -> PyResult<Py<PyAny>> {
        let (buf, pool) = self.with(|s| {
            let buf = handle
                .with(|h| py.detach(|| if written { s.get_written(h) } else { s.get(h) }))?
                .py_err()?;
            Ok((buf, s.pool().clone()))
        })?;
        let length = length.unwrap_or(buf.len());
        capsule(py, buf, length, pool)
    }

    /// Whether the tensor's write has finished (see `OffloadStore::is_written`): seen true
    /// while the memory put is known unchanged, the bytes on disk are the ones put.
    fn is_written(&self, handle: &PyHandle) -> PyResult<bool> {
        self.with(|s| Ok(handle.with(|h| s.is_written(h)).unwrap_or(false)))
    }

    /// The puts are over: prefetching starts now, in backward order, from the last tensor.
    fn expect_backward(&self) -> PyResult<()> {
        self.with(|s| {
            s.expect_backward();
            Ok(())
        })
    }

    /// The caller has this tensor's bytes in memory and will not `get` it: a write of it not
    /// yet started is cancelled, and the prefetch moves past it.
    fn discard(&self, handle: &PyHandle) -> PyResult<()> {
        self.with(|s| {
            let _ = handle.with(|h| s.discard(h));
            Ok(())
        })
    }

    /// Starts reading these tensors back now, nearest first, as the budget allows.
    fn prefetch(&self, handles: Vec<PyRef<'_, PyHandle>>) -> PyResult<()> {
        let guards: Vec<_> = handles
            .iter()
            .map(|h| h.handle.lock().unwrap_or_else(|p| p.into_inner()))
            .collect();
        let live: Vec<&Handle> = guards.iter().filter_map(|g| g.as_ref()).collect();
        self.with(|s| {
            s.prefetch(&live);
            Ok(())
        })
    }

    /// Writes every tensor still unwritten, and waits until every background write and read
    /// has finished.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(|s| {
            py.detach(|| s.flush());
            Ok(())
        })
    }

    /// The store's counters, every field of `fastensor::offload::OffloadStats` under its
    /// name (bytes as int; times in seconds, named `<field>_s`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(|s| Ok(s.stats()))?;
        let d = PyDict::new(py);
        for (name, figure) in s.figures() {
            match figure {
                Figure::Count(n) => d.set_item(name, n)?,
                Figure::Seconds(t) => d.set_item(name, t)?,
            }
        }
        Ok(d)
    }
}

/// `device_path` parsed (`fastensor::offload::DevicePath`): its name, or a `ValueError`.
#[pyfunction]
fn parse_device_path(device_path: &str) -> PyResult<String> {
    let parsed: DevicePath = device_path.parse().py_err()?;
    Ok(parsed.to_string())
}

/// The defaults of offload (`fastensor::offload::defaults`), as a dict Python reads its own
/// defaults from.
fn defaults_dict(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("budget", defaults::BUDGET)?;
    d.set_item("small_threshold", defaults::SMALL_THRESHOLD)?;
    d.set_item(
        "prefetch_as_budget_holds",
        defaults::PREFETCH_AS_BUDGET_HOLDS,
    )?;
    d.set_item("io_threads", defaults::IO_THREADS)?;
    d.set_item("pack", defaults::PACK)?;
    d.set_item("pool_min_bytes", defaults::POOL_MIN_BYTES)?;
    d.set_item("device_path", DevicePath::default().to_string())?;
    Ok(d)
}

/// Registers this module's classes, functions and the defaults table (`OFFLOAD_DEFAULTS`).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyOffloadStore>()?;
    m.add_class::<PyHandle>()?;
    m.add_function(wrap_pyfunction!(parse_device_path, m)?)?;
    m.add("OFFLOAD_DEFAULTS", defaults_dict(m.py())?)
}

/// A block lent to a tensor: given back to its pool when the tensor dies.
struct Pooled {
    buf: Option<HostBuffer>,
    pool: Arc<HostPool>,
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give(buf);
        }
    }
}

/// `buf` as a DLPack capsule of a one-dimensional `uint8` host tensor of its first `length`
/// bytes (at most all of it) that owns it (given back to `pool` when the tensor is deleted).
fn capsule(
    py: Python<'_>,
    mut buf: HostBuffer,
    length: usize,
    pool: Arc<HostPool>,
) -> PyResult<Py<PyAny>> {
    let len = length.min(buf.len());
    let data = buf.as_mut_ptr();
    // The buffer lives, untouched by the store, until the tensor dies: the owner holds it.
    let owner = Pooled {
        buf: Some(buf),
        pool,
    };
    crate::export::capsule(py, data, len, Box::new(owner))
}
