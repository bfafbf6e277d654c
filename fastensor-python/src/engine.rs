//! `fastensor.Engine`: the Rust engine (backend registry + selector), and the checkpoint
//! calls made through it. Every transfer runs detached from the interpreter (the GIL is
//! released), so other Python threads keep running.

use crate::errors::IntoPy;
use crate::memory::{self, desc_of, mem_ref, SaveSpec, TargetSpec};
use crate::snapshot::{SaveHandle, Snapshot, StagingPool};
use fastensor::checkpoint::{self, CheckpointFile, TensorView};
use fastensor::{Engine, Result};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// A fastensor engine: the backends it may use, the selector that picks one per transfer,
/// and the profile where what it learns is kept.
#[pyclass(name = "Engine", module = "fastensor._native", frozen)]
pub struct PyEngine {
    pub(crate) engine: Engine,
    staging: Arc<StagingPool>,
}

/// The tensors of a save spec list as views of the callers' memory.
///
/// # Safety
/// Every spec must satisfy [`mem_ref`]'s contract for `'a`.
unsafe fn views<'a>(specs: &[SaveSpec]) -> Result<Vec<TensorView<'a>>> {
    specs
        .iter()
        .map(|s| {
            let desc = desc_of(s)?;
            // SAFETY: forwarded from this function's contract.
            let data = unsafe { mem_ref(s.3, s.4, s.5)? };
            Ok(TensorView { desc, data })
        })
        .collect()
}

#[pymethods]
impl PyEngine {
    /// Builds an engine. `backends`: the names allowed (default: every available one);
    /// `profile`: where the selection profile is loaded from and saved to (default: none,
    /// nothing is remembered); `pin`: one backend for every transfer.
    #[new]
    #[pyo3(signature = (backends=None, profile=None, pin=None))]
    fn new(
        py: Python<'_>,
        backends: Option<Vec<String>>,
        profile: Option<PathBuf>,
        pin: Option<String>,
    ) -> PyResult<Self> {
        let engine = py
            .detach(|| {
                let mut b = Engine::builder();
                if let Some(names) = backends {
                    b = b.backends(names);
                }
                if let Some(p) = profile {
                    b = b.profile(p);
                }
                if let Some(p) = pin {
                    b = b.pin(p);
                }
                b.build()
            })
            .py_err()?;
        Ok(PyEngine {
            engine,
            staging: Arc::new(StagingPool::default()),
        })
    }

    /// The names of the backends this engine may use, sorted.
    fn backend_names(&self) -> Vec<String> {
        self.engine.backend_names()
    }

    /// Uses `backend` for every transfer, or lets the selector choose again with `None`.
    #[pyo3(signature = (backend=None))]
    fn pin(&self, backend: Option<String>) -> PyResult<()> {
        self.engine.pin(backend.as_deref()).py_err()
    }

    /// The pinned backend, if any.
    #[getter]
    fn pinned(&self) -> Option<String> {
        self.engine.pinned()
    }

    /// Why the profile was not used (another machine or format version), if it was not.
    #[getter]
    fn profile_warning(&self) -> Option<String> {
        self.engine.load_warning().map(|w| w.to_string())
    }

    /// What the engine chose and measured so far, as a table.
    fn report(&self) -> String {
        self.engine.report().to_string()
    }

    /// Saves what the engine learned to its profile (atomically).
    fn save_profile(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.engine.save_profile()).py_err()
    }

    /// Saves tensors given as raw memory specs to `path` (durable and atomic).
    #[pyo3(signature = (path, specs, metadata=None))]
    fn save(
        &self,
        py: Python<'_>,
        path: PathBuf,
        specs: Vec<SaveSpec>,
        metadata: Option<BTreeMap<String, String>>,
    ) -> PyResult<()> {
        let metadata = metadata.unwrap_or_default();
        py.detach(|| {
            // SAFETY: the Python wrapper holds every tensor named in `specs` until this
            // call returns, and the specs describe their live, unmoved memory.
            let tensors = unsafe { views(&specs) }.map_err(|e| e.with_path(&path))?;
            checkpoint::save_with_metadata(&self.engine, &path, &tensors, &metadata)
        })
        .py_err()
    }

    /// Copies host tensors into staging memory (returning then), and saves the copy to
    /// `path` in the background. The returned handle's `wait()` gives the outcome.
    #[pyo3(signature = (path, specs, metadata=None))]
    fn save_async(
        &self,
        py: Python<'_>,
        path: PathBuf,
        specs: Vec<SaveSpec>,
        metadata: Option<BTreeMap<String, String>>,
    ) -> PyResult<SaveHandle> {
        let metadata = metadata.unwrap_or_default();
        let snapshot = py
            .detach(|| {
                // SAFETY: as in `save`: the tensors stay alive until this call returns,
                // and `Snapshot::take` copies their bytes before it returns.
                let tensors = unsafe { views(&specs) }.map_err(|e| e.with_path(&path))?;
                Snapshot::take(&self.staging, &tensors)
            })
            .py_err()?;
        Ok(SaveHandle::spawn(
            self.engine.clone(),
            self.staging.clone(),
            path,
            snapshot,
            metadata,
        ))
    }

    /// Opens a safetensors file and validates its header; reads come later.
    fn open(&self, py: Python<'_>, path: PathBuf) -> PyResult<PyCheckpointFile> {
        let file = py
            .detach(|| checkpoint::open(&self.engine, &path))
            .py_err()?;
        Ok(PyCheckpointFile { file })
    }

    /// Bytes of staging memory kept for the next `save_async` (one buffer, reused).
    #[getter]
    fn staging_bytes(&self) -> usize {
        self.staging.bytes()
    }

    /// Frees the staging memory kept for the next `save_async`.
    fn release_staging(&self) {
        self.staging.clear();
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.engine)
    }
}

/// An open safetensors file: its header, and reads of its tensors into caller memory.
#[pyclass(name = "CheckpointFile", module = "fastensor._native", frozen)]
pub struct PyCheckpointFile {
    file: CheckpointFile,
}

#[pymethods]
impl PyCheckpointFile {
    /// Every tensor as `(name, dtype, shape, file_offset, nbytes)`, in file order.
    fn entries(&self) -> Vec<(String, &'static str, Vec<u64>, u64, u64)> {
        let h = self.file.header();
        h.entries()
            .iter()
            .map(|e| {
                let r = h.file_range(e);
                (
                    e.desc.name.clone(),
                    e.desc.dtype.name(),
                    e.desc.shape.clone(),
                    r.start,
                    r.end - r.start,
                )
            })
            .collect()
    }

    /// The file's `__metadata__` map.
    fn metadata(&self) -> BTreeMap<String, String> {
        self.file.header().metadata().clone()
    }

    /// The path the file was opened at.
    #[getter]
    fn path(&self) -> PathBuf {
        self.file.path().to_path_buf()
    }

    /// Fills each target `(name, address, nbytes, device)` with that tensor's bytes.
    fn read_into(&self, py: Python<'_>, targets: Vec<TargetSpec>) -> PyResult<()> {
        py.detach(|| {
            // SAFETY: the Python wrapper allocated or holds each destination tensor until
            // this call returns and hands out none of them meanwhile.
            let dsts =
                unsafe { memory::targets(&targets) }.map_err(|e| e.with_path(self.file.path()))?;
            self.file.read_into(dsts)
        })
        .py_err()
    }
}
