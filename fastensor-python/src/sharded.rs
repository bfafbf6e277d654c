//! Sharded checkpoints (the Hugging Face layout) and raw ranged reads across files, for
//! `fastensor.torch.save_sharded` / `load_sharded` and the `torch.distributed.checkpoint`
//! storage layer (`fastensor.dcp`). Every transfer runs detached from the interpreter.

use crate::engine::{
    entry_rows, lend_for_save, read_targets, views, PyEngine, SaveSpec, TargetSpec,
};
use crate::errors::IntoPy;
use crate::located::Located;
use crate::memory::{self, Access, Lender};
use fastensor::checkpoint::{self, ShardedFile};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One raw range to read: `(path, file_offset, object, byte_offset, nbytes)`: `nbytes` bytes
/// of the file from `file_offset` go to the object's memory from `byte_offset`.
pub type RangeSpec<'py> = (PathBuf, u64, Bound<'py, PyAny>, usize, usize);

/// Saves tensors given as raw memory specs as a sharded checkpoint in `directory`: shards of
/// at most `max_shard_bytes`, written concurrently and durably, then the index, atomically.
/// Returns the weight map (tensor name -> shard file name).
#[pyfunction]
#[pyo3(signature = (engine, directory, specs, max_shard_bytes, metadata=None))]
pub fn save_sharded(
    py: Python<'_>,
    engine: &PyEngine,
    directory: PathBuf,
    specs: Vec<SaveSpec<'_>>,
    max_shard_bytes: u64,
    metadata: Option<BTreeMap<String, String>>,
) -> PyResult<BTreeMap<String, String>> {
    let metadata = metadata.unwrap_or_default();
    let (_lender, tensors) = lend_for_save(&specs, &directory)?;
    py.detach(|| {
        // SAFETY: `_lender` keeps every tensor's memory lent until after this closure.
        let views = unsafe { views(&tensors) };
        checkpoint::save_sharded_with_metadata(
            &engine.engine,
            &directory,
            &views,
            max_shard_bytes,
            &metadata,
        )
        .map(|index| index.weight_map)
    })
    .py_err()
}

/// Opens a sharded checkpoint (its directory or its index) and validates every shard's
/// header; reads come later. With `verify`, every tensor read is checked against the
/// checksum its shard stores (`ShardedFile::verifying`).
#[pyfunction]
#[pyo3(signature = (engine, path, verify=false))]
pub fn open_sharded(
    py: Python<'_>,
    engine: &PyEngine,
    path: PathBuf,
    verify: bool,
) -> PyResult<PyShardedFile> {
    let file = py
        .detach(|| {
            let file = checkpoint::open_sharded(&engine.engine, &path)?;
            if verify {
                file.verifying()
            } else {
                Ok(file)
            }
        })
        .py_err()?;
    Ok(PyShardedFile { file })
}

/// Reads raw byte ranges `(path, file_offset, object, byte_offset, nbytes)` of any files
/// into the objects' memory, as one job: every file's requests in flight together.
#[pyfunction]
pub fn read_ranges(py: Python<'_>, engine: &PyEngine, ranges: Vec<RangeSpec<'_>>) -> PyResult<()> {
    let mut lender = Lender::new(Access::Write);
    let mut regions = Vec::with_capacity(ranges.len());
    for (path, _, obj, at, nbytes) in &ranges {
        let what = format!("destination of a range of {}", path.display());
        let region = lender
            .region(obj, &what)
            .and_then(|r| r.range(*at, *nbytes, &what))
            .map_err(|e| e.with_path(path))
            .py_err()?;
        regions.push(region);
    }
    memory::check_disjoint(regions.iter().map(|r| (*r, "a range"))).py_err()?;
    lender.check_writable().py_err()?;
    let files: Vec<(PathBuf, u64)> = ranges.iter().map(|r| (r.0.clone(), r.1)).collect();
    py.detach(|| {
        let reqs = files
            .iter()
            .zip(&regions)
            .map(|((path, offset), region)| {
                // SAFETY: `lender` keeps each destination lent (writable) until after this
                // closure; they were checked to fit and not to overlap.
                (path.as_path(), *offset, unsafe { region.as_mut() })
            })
            .collect();
        checkpoint::read_ranges(&engine.engine, reqs)
    })
    .py_err()
}

/// An open sharded checkpoint: the tensors of every shard, and reads of them into caller
/// memory with the requests of all shards in flight together. It offers what
/// `CheckpointFile` offers, so the same Python code loads from either.
#[pyclass(name = "ShardedFile", module = "fastensor._native", frozen)]
pub struct PyShardedFile {
    file: ShardedFile,
}

impl PyShardedFile {
    /// The checkpoint as the source its reads go through.
    pub(crate) fn source(&self) -> &fastensor::checkpoint::CheckpointSource {
        self.file.source()
    }
}

#[pymethods]
impl PyShardedFile {
    /// Every tensor as `(name, dtype, shape, file_offset, nbytes)`, shard by shard in file
    /// order (the offset is within the tensor's shard).
    fn entries(&self) -> Vec<(String, &'static str, Vec<u64>, u64, u64)> {
        entry_rows(self.file.source())
    }

    /// The tensors of the weight map per shard: `(shard path, names in file order)`, shards
    /// in the order of `shards`.
    fn names_by_shard(&self) -> Vec<(Located, Vec<String>)> {
        let paths = self.file.shard_paths();
        let mut out: Vec<(Located, Vec<String>)> = paths
            .iter()
            .map(|p| (Located::from(*p), Vec::new()))
            .collect();
        for (s, e, _) in self.file.entries() {
            out[s].1.push(e.desc.name.clone());
        }
        out
    }

    /// The first shard's `__metadata__` map.
    fn metadata(&self) -> BTreeMap<String, String> {
        self.file.metadata()
    }

    /// The index file.
    #[getter]
    fn path(&self) -> Located {
        Located(self.file.index().path.clone())
    }

    /// The shards' paths, sorted.
    #[getter]
    fn shards(&self) -> Vec<Located> {
        self.file
            .shard_paths()
            .into_iter()
            .map(Located::from)
            .collect()
    }

    /// The index's weight map: tensor name -> shard file name.
    #[getter]
    fn weight_map(&self) -> BTreeMap<String, String> {
        self.file.index().weight_map.clone()
    }

    /// The index's `metadata.total_size`, if given.
    #[getter]
    fn total_size(&self) -> Option<u64> {
        self.file.index().total_size
    }

    /// Fills each target `(name, object, byte_offset, nbytes)` with that tensor's bytes.
    fn read_into(&self, py: Python<'_>, targets: Vec<TargetSpec<'_>>) -> PyResult<()> {
        read_targets(py, self.file.source(), targets)
    }

    fn __repr__(&self) -> String {
        format!(
            "<ShardedFile {} ({} shards)>",
            self.file.index().path.display(),
            self.file.shard_paths().len()
        )
    }
}

/// True when `path` names a sharded checkpoint (`checkpoint::sharded::is_sharded` at the
/// place the engine resolves `path` to): a directory, or a file ending in `.index.json`;
/// under an object prefix, any name but a `.safetensors` one.
#[pyfunction]
fn is_sharded(path: PathBuf) -> bool {
    checkpoint::sharded::is_sharded_at(fastensor::engine::place_of(&path), &path)
}

/// Registers this module's classes and functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyShardedFile>()?;
    m.add_function(wrap_pyfunction!(save_sharded, m)?)?;
    m.add_function(wrap_pyfunction!(open_sharded, m)?)?;
    m.add_function(wrap_pyfunction!(is_sharded, m)?)?;
    m.add_function(wrap_pyfunction!(read_ranges, m)?)?;
    Ok(())
}
