//! `fastensor.Engine`: the Rust engine (backend registry + selector), and the checkpoint
//! calls made through it. Every transfer runs detached from the interpreter (the GIL is
//! released), so other Python threads keep running.

use crate::errors::IntoPy;
use crate::memory::{self, Access, Lender, Region};
use crate::snapshot::{SaveHandle, Snapshot, StagingPool};
use fastensor::checkpoint::{self, Arena, CheckpointFile, CheckpointSource, TensorView};
use fastensor::{DType, Engine, Error, ErrorKind, MemMut, Result, TensorDesc};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A fastensor engine: the backends it may use, the selector that picks one per transfer,
/// and the profile where what it learns is kept.
#[pyclass(name = "Engine", module = "fastensor._native", frozen)]
pub struct PyEngine {
    pub(crate) engine: Engine,
    staging: Arc<StagingPool>,
}

/// One tensor to save: `(name, dtype, shape, object)`, the object a contiguous tensor,
/// array or buffer whose memory holds exactly the tensor's bytes.
pub type SaveSpec<'py> = (String, String, Vec<u64>, Bound<'py, PyAny>);

/// One destination to fill: `(name, object, byte_offset, nbytes)`: tensor `name`'s bytes go
/// to `nbytes` bytes of the object's memory from `byte_offset` (checked to fit, and to be
/// the tensor's length by the read).
pub type TargetSpec<'py> = (String, Bound<'py, PyAny>, usize, usize);

/// Loaded tensors as `(name, dtype, shape, capsule)`.
pub type Exported = Vec<(String, String, Vec<u64>, Py<PyAny>)>;

/// What `load_new` returns: the tensors, the metadata, and where their bytes live
/// (`fastensor::checkpoint::Placement`: `read`, `leased`, `moved` or `unprotected`).
pub type Loaded = (Exported, BTreeMap<String, String>, &'static str);

/// What `load_new_later` returns: the tensors and metadata of `load_new`, and the pages
/// still to be brought in (if any).
pub type LoadedLater = (
    Exported,
    BTreeMap<String, String>,
    Option<crate::later::PyPendingPages>,
);

/// The tensors of a loaded checkpoint as `(name, dtype, shape, capsule)`, each capsule a
/// `uint8` DLPack tensor over its bytes holding the arena (returned too) alive; the metadata.
pub(crate) fn exported(
    py: Python<'_>,
    ckpt: checkpoint::Checkpoint,
    versioned: bool,
) -> PyResult<(Exported, BTreeMap<String, String>, Arc<Arena>)> {
    let (mut arena, entries, metadata) = ckpt.into_parts();
    let base = arena.as_mut_ptr();
    let owner = Arc::new(arena);
    let mut out = Vec::with_capacity(entries.len());
    for (desc, range) in entries {
        // SAFETY of the capsule: `range` lies within the arena, whose memory stays valid
        // and writable while `owner` (held by the capsule) lives; Rust neither reads nor
        // writes the arena once it is shared here (pages still to be brought in are read
        // by the kernel only).
        let data = base.wrapping_add(range.start);
        let owned = Box::new(owner.clone());
        let host = crate::export::HOST;
        let cap = crate::export::tensor_capsule(py, data, range.len(), host, owned, versioned)?;
        out.push((desc.name, desc.dtype.to_string(), desc.shape, cap));
    }
    Ok((out, metadata, owner))
}

/// The tensors of save specs: each described, its object lent (read-only) by `lender`.
pub fn save_tensors(
    specs: &[SaveSpec<'_>],
    lender: &mut Lender,
) -> Result<Vec<(TensorDesc, Region)>> {
    specs
        .iter()
        .map(|(name, dtype, shape, obj)| {
            let dtype: DType = dtype.parse()?;
            let desc = TensorDesc::new(name.clone(), dtype, shape.clone());
            let want = desc.byte_len()?;
            let region = lender.region(obj, &format!("tensor `{name}`"))?;
            if want != region.len() as u64 {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "tensor `{name}`: {dtype} × {shape:?} is {want} bytes, its memory {}",
                        region.len()
                    ),
                ));
            }
            Ok((desc, region))
        })
        .collect()
}

/// The tensors of save specs lent (read-only) for a save to `path`: the lender that keeps
/// them lent (held until the save is done) and each tensor's descriptor and memory; errors
/// name `path`.
pub fn lend_for_save(
    specs: &[SaveSpec<'_>],
    path: &Path,
) -> PyResult<(Lender, Vec<(TensorDesc, Region)>)> {
    let mut lender = Lender::new(Access::Read);
    let tensors = save_tensors(specs, &mut lender)
        .map_err(|e| e.with_path(path))
        .py_err()?;
    Ok((lender, tensors))
}

/// Every tensor of `source` as `(name, dtype, shape, file_offset, nbytes)`, file by file
/// in file order (the offset is within the tensor's file).
pub fn entry_rows(source: &CheckpointSource) -> Vec<(String, &'static str, Vec<u64>, u64, u64)> {
    source
        .entries()
        .into_iter()
        .map(|(_, e, r)| {
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

/// Fills each target `(name, object, byte_offset, nbytes)` with that tensor's bytes from
/// `source` (see `CheckpointSource::read_into`), the GIL released; errors name the source.
pub fn read_targets(
    py: Python<'_>,
    source: &CheckpointSource,
    targets: Vec<TargetSpec<'_>>,
) -> PyResult<()> {
    let mut lender = Lender::new(Access::Write);
    let dsts = target_regions(&targets, &mut lender)
        .map_err(|e| e.with_path(source.path()))
        .py_err()?;
    py.detach(|| {
        // SAFETY: `lender` keeps every destination lent (writable) until after this
        // closure; they were checked to fit and not to overlap.
        let dsts = unsafe { destinations(&dsts) };
        source.read_into(dsts)
    })
    .py_err()
}

/// `names` as the Rust calls take them.
pub(crate) fn name_refs(names: &Option<Vec<String>>) -> Option<Vec<&str>> {
    names
        .as_ref()
        .map(|n| n.iter().map(String::as_str).collect())
}

/// Views of lent tensors, for a save.
///
/// # Safety
/// Every region must come from a `Lender` alive for `'a`.
pub unsafe fn views<'a>(tensors: &[(TensorDesc, Region)]) -> Vec<TensorView<'a>> {
    tensors
        .iter()
        .map(|(desc, region)| TensorView {
            desc: desc.clone(),
            // SAFETY: forwarded from this function's contract.
            data: unsafe { region.as_ref() },
        })
        .collect()
}

/// Lent destinations as memory to write.
///
/// # Safety
/// Every region must come from a writable `Lender` alive for `'a`, checked by
/// [`target_regions`].
pub unsafe fn destinations<'a>(dsts: &'a [(String, Region)]) -> Vec<(&'a str, MemMut<'a>)> {
    dsts.iter()
        .map(|(n, r)| {
            // SAFETY: forwarded from this function's contract.
            (n.as_str(), unsafe { r.as_mut() })
        })
        .collect()
}

/// The destinations of target specs, lent writable and checked to fit, not to overlap and
/// to be mapped writable.
pub fn target_regions(
    targets: &[TargetSpec<'_>],
    lender: &mut Lender,
) -> Result<Vec<(String, Region)>> {
    let mut out = Vec::with_capacity(targets.len());
    for (name, obj, offset, nbytes) in targets {
        let what = format!("destination of `{name}`");
        let region = lender.region(obj, &what)?.range(*offset, *nbytes, &what)?;
        out.push((name.clone(), region));
    }
    memory::check_disjoint(out.iter().map(|(n, r)| (*r, n.as_str())))?;
    lender.check_writable()?;
    Ok(out)
}

#[pymethods]
impl PyEngine {
    /// Builds an engine. `backends`: the names allowed (default: every available one);
    /// `profile`: where the selection profile is loaded from and saved to (default: none,
    /// nothing is remembered); `pin`: one backend for every transfer; `mapped_loads`:
    /// whether loads into new host memory may map the file; `unprotected_maps`: whether
    /// such a load that cannot have a read lease on the file maps it anyway, unprotected
    /// from changes to the file, rather than reading it; `cache_dir`: a cache of remote
    /// objects there, of at most `cache_max_bytes` (default: a quarter of its file system),
    /// instead of the one `FASTENSOR_CACHE_DIR` names.
    #[new]
    #[pyo3(signature = (backends=None, profile=None, pin=None, mapped_loads=true, unprotected_maps=false, cache_dir=None, cache_max_bytes=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        backends: Option<Vec<String>>,
        profile: Option<PathBuf>,
        pin: Option<String>,
        mapped_loads: bool,
        unprotected_maps: bool,
        cache_dir: Option<PathBuf>,
        cache_max_bytes: Option<u64>,
    ) -> PyResult<Self> {
        let engine = py
            .detach(|| {
                let mut b = Engine::builder()
                    .mapped_loads(mapped_loads)
                    .unprotected_maps(unprotected_maps);
                match (cache_dir, cache_max_bytes) {
                    (Some(dir), max) => {
                        b = b.object_cache(Some(fastensor::object::ObjectCache::new(dir, max)?));
                    }
                    (None, Some(_)) => {
                        return Err(fastensor::Error::new(
                            fastensor::ErrorKind::InvalidInput,
                            "cache_max_bytes needs cache_dir",
                        ));
                    }
                    (None, None) => {}
                }
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

    /// Loads into new host memory decided so far: `(mapped, read)`.
    fn new_loads(&self) -> (u64, u64) {
        self.engine.new_loads()
    }

    /// What the engine decided so far: loads into new memory mapped and read, jobs of
    /// reads given one backend, and the selector's choices and explorations.
    fn decisions(&self) -> BTreeMap<&'static str, u64> {
        let (mapped, read) = self.engine.new_loads();
        let stats = self.engine.selector_stats();
        BTreeMap::from([
            ("mapped_loads", mapped),
            ("read_loads", read),
            ("read_jobs", self.engine.read_jobs()),
            ("choices", stats.choices),
            ("explorations", stats.explorations),
        ])
    }

    /// The names of the backends this engine may use, sorted.
    fn backend_names(&self) -> Vec<String> {
        self.engine.backend_names()
    }

    /// Whether a backend the engine may use takes GPU device memory (its capabilities'
    /// `device_memory`): device tensors then move with no stop in host memory. Given the
    /// `path` of a transfer, for that file (an object's bytes always arrive in host memory).
    #[pyo3(signature = (path=None))]
    fn takes_device_memory(&self, path: Option<PathBuf>) -> bool {
        match path {
            Some(p) => self.engine.takes_device_memory_at(&p),
            None => self.engine.takes_device_memory(),
        }
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

    /// Saves tensors given as raw memory specs to `path` (durable and atomic); with
    /// `checksum`, a checksum of every tensor, computed while the data is written, is stored
    /// in the metadata (see `fastensor::checkpoint::save_checked`).
    #[pyo3(signature = (path, specs, metadata=None, checksum=false))]
    fn save(
        &self,
        py: Python<'_>,
        path: PathBuf,
        specs: Vec<SaveSpec<'_>>,
        metadata: Option<BTreeMap<String, String>>,
        checksum: bool,
    ) -> PyResult<()> {
        let metadata = metadata.unwrap_or_default();
        let (_lender, tensors) = lend_for_save(&specs, &path)?;
        py.detach(|| {
            // SAFETY: `_lender` keeps every tensor's memory lent until after this closure.
            let views = unsafe { views(&tensors) };
            if checksum {
                checkpoint::save_checked(&self.engine, &path, &views, &metadata)
            } else {
                checkpoint::save_with_metadata(&self.engine, &path, &views, &metadata)
            }
        })
        .py_err()
    }

    /// Copies host tensors into staging memory (returning then), and saves the copy to
    /// `path` in the background. The returned handle's `wait()` gives the outcome. With
    /// `checksum`, as `save` (computed in the background).
    #[pyo3(signature = (path, specs, metadata=None, checksum=false))]
    fn save_async(
        &self,
        py: Python<'_>,
        path: PathBuf,
        specs: Vec<SaveSpec<'_>>,
        metadata: Option<BTreeMap<String, String>>,
        checksum: bool,
    ) -> PyResult<SaveHandle> {
        let metadata = metadata.unwrap_or_default();
        let (_lender, tensors) = lend_for_save(&specs, &path)?;
        let snapshot = py
            .detach(|| {
                // SAFETY: `_lender` keeps every tensor's memory lent until after this
                // closure, and `Snapshot::take` copies their bytes before it returns.
                let views = unsafe { views(&tensors) };
                Snapshot::take(&self.staging, &views)
            })
            .py_err()?;
        SaveHandle::spawn(
            self.engine.clone(),
            self.staging.clone(),
            path,
            snapshot,
            metadata,
            checksum,
        )
        .py_err()
    }

    /// Loads the tensors of the safetensors file `path` (all, or those named) into new host
    /// memory, one decision for the whole load: the file mapped copy-on-write, or read into
    /// memory of its own (see `fastensor::checkpoint::load`). Returns the tensors in file
    /// order, `(name, dtype, shape, capsule)`, each capsule a `uint8` DLPack tensor over its
    /// bytes that keeps the loaded memory alive (unmapped or freed when the last tensor
    /// dies), the file's metadata, and where the bytes live: `read` (memory of their own),
    /// `leased` (the file mapped under a read lease: a writer of the file waits until the
    /// pages are moved into memory of the process), `moved` (so moved already) or
    /// `unprotected` (mapped without a lease, where none could be had and the engine maps
    /// those). `versioned`: capsules of
    /// version 1 of the protocol (numpy makes writable arrays only from those), else
    /// unversioned ones (what `torch.from_dlpack` takes). `verify`: every tensor checked
    /// against the checksum the file stores (see `fastensor::checkpoint::load_verified`).
    #[pyo3(signature = (path, names=None, versioned=false, verify=false))]
    fn load_new(
        &self,
        py: Python<'_>,
        path: PathBuf,
        names: Option<Vec<String>>,
        versioned: bool,
        verify: bool,
    ) -> PyResult<Loaded> {
        let ckpt = py
            .detach(|| {
                let names = name_refs(&names);
                match (&names, verify) {
                    (_, true) => checkpoint::load_verified(&self.engine, &path, names.as_deref()),
                    (None, false) => checkpoint::load(&self.engine, &path),
                    (Some(n), false) => checkpoint::load_selected(&self.engine, &path, n),
                }
            })
            .py_err()?;
        let placement = ckpt.arena().placement().as_str();
        let (out, metadata, _) = exported(py, ckpt, versioned)?;
        Ok((out, metadata, placement))
    }

    /// `load_new` (torch's capsules) returning as soon as the file is mapped, while the
    /// pages of its tensors are still coming in (on a thread started here): returns the
    /// tensors, the metadata, and the `PendingPages` whose `wait()` waits for them (`None`
    /// where the load was whole: the engine reads new loads, or the file cannot be mapped).
    /// See `fastensor::checkpoint::load_later` for what reading a tensor earlier does.
    #[pyo3(signature = (path, names=None))]
    fn load_new_later(
        &self,
        py: Python<'_>,
        path: PathBuf,
        names: Option<Vec<String>>,
    ) -> PyResult<LoadedLater> {
        let (ckpt, pending) = py
            .detach(|| {
                let names = name_refs(&names);
                checkpoint::load_later(&self.engine, &path, names.as_deref())
            })
            .py_err()?;
        let (out, metadata, owner) = exported(py, ckpt, false)?;
        let pending = pending
            .map(|pages| crate::later::PyPendingPages::start(pages, owner))
            .transpose()?;
        Ok((out, metadata, pending))
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
    pub(crate) file: CheckpointFile,
}

#[pymethods]
impl PyCheckpointFile {
    /// Every tensor as `(name, dtype, shape, file_offset, nbytes)`, in file order.
    fn entries(&self) -> Vec<(String, &'static str, Vec<u64>, u64, u64)> {
        entry_rows(self.file.source())
    }

    /// The file's `__metadata__` map.
    fn metadata(&self) -> BTreeMap<String, String> {
        self.file.header().metadata().clone()
    }

    /// The path the file was opened at.
    #[getter]
    fn path(&self) -> crate::located::Located {
        crate::located::Located::from(self.file.path())
    }

    /// Fills each target `(name, object, byte_offset, nbytes)` with that tensor's bytes.
    fn read_into(&self, py: Python<'_>, targets: Vec<TargetSpec<'_>>) -> PyResult<()> {
        read_targets(py, self.file.source(), targets)
    }
}
