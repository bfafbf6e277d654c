//! Sharded checkpoints (the Hugging Face layout) and raw ranged reads across files, for
//! `fastensor.torch.save_sharded` / `load_sharded` and the `torch.distributed.checkpoint`
//! storage layer (`fastensor.dcp`). Every transfer runs detached from the interpreter.

use crate::engine::PyEngine;
use crate::errors::IntoPy;
use crate::memory::{self, desc_of, mem_mut, mem_ref, SaveSpec, TargetSpec};
use fastensor::checkpoint::{self, ShardedFile, TensorView};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One raw range to read: `(path, file_offset, address, nbytes, device)`.
pub type RangeSpec = (PathBuf, u64, usize, usize, i64);

/// Saves tensors given as raw memory specs as a sharded checkpoint in `directory`: shards of
/// at most `max_shard_bytes`, written concurrently and durably, then the index, atomically.
/// Returns the weight map (tensor name -> shard file name).
#[pyfunction]
#[pyo3(signature = (engine, directory, specs, max_shard_bytes, metadata=None))]
pub fn save_sharded(
    py: Python<'_>,
    engine: &PyEngine,
    directory: PathBuf,
    specs: Vec<SaveSpec>,
    max_shard_bytes: u64,
    metadata: Option<BTreeMap<String, String>>,
) -> PyResult<BTreeMap<String, String>> {
    let metadata = metadata.unwrap_or_default();
    py.detach(|| {
        let mut tensors = Vec::with_capacity(specs.len());
        for s in &specs {
            let desc = desc_of(s).map_err(|e| e.with_path(&directory))?;
            // SAFETY: the Python wrapper holds every tensor named in `specs` until this call
            // returns, and the specs describe their live, unmoved memory.
            let data = unsafe { mem_ref(s.3, s.4, s.5)? };
            tensors.push(TensorView { desc, data });
        }
        checkpoint::save_sharded_with_metadata(
            &engine.engine,
            &directory,
            &tensors,
            max_shard_bytes,
            &metadata,
        )
        .map(|index| index.weight_map)
    })
    .py_err()
}

/// Opens a sharded checkpoint (its directory or its index) and validates every shard's
/// header; reads come later.
#[pyfunction]
pub fn open_sharded(py: Python<'_>, engine: &PyEngine, path: PathBuf) -> PyResult<PyShardedFile> {
    let file = py
        .detach(|| checkpoint::open_sharded(&engine.engine, &path))
        .py_err()?;
    Ok(PyShardedFile { file })
}

/// Reads raw byte ranges `(path, file_offset, address, nbytes, device)` of any files into
/// the given memory, as one job: every file's requests in flight together.
#[pyfunction]
pub fn read_ranges(py: Python<'_>, engine: &PyEngine, ranges: Vec<RangeSpec>) -> PyResult<()> {
    memory::check_disjoint(
        ranges
            .iter()
            .map(|r| (r.4, r.2, r.3, r.0.to_str().unwrap_or("a range"))),
    )
    .py_err()?;
    py.detach(|| {
        let mut reqs = Vec::with_capacity(ranges.len());
        for (path, offset, addr, nbytes, device) in &ranges {
            // SAFETY: the Python caller allocated or holds each destination until this call
            // returns and uses none of them meanwhile; they were checked not to overlap.
            let dst = unsafe { mem_mut(*addr, *nbytes, *device)? };
            reqs.push((path.as_path(), *offset, dst));
        }
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

#[pymethods]
impl PyShardedFile {
    /// Every tensor as `(name, dtype, shape, file_offset, nbytes)`, shard by shard in file
    /// order (the offset is within the tensor's shard).
    fn entries(&self) -> Vec<(String, &'static str, Vec<u64>, u64, u64)> {
        self.file
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

    /// The first shard's `__metadata__` map.
    fn metadata(&self) -> BTreeMap<String, String> {
        self.file.metadata()
    }

    /// The index file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.file.index().path.clone()
    }

    /// The shards' paths, sorted.
    #[getter]
    fn shards(&self) -> Vec<PathBuf> {
        self.file
            .shard_paths()
            .into_iter()
            .map(PathBuf::from)
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

    /// Fills each target `(name, address, nbytes, device)` with that tensor's bytes.
    fn read_into(&self, py: Python<'_>, targets: Vec<TargetSpec>) -> PyResult<()> {
        py.detach(|| {
            // SAFETY: the Python wrapper allocated or holds each destination tensor until
            // this call returns and hands out none of them meanwhile.
            let dsts = unsafe { memory::targets(&targets) }
                .map_err(|e| e.with_path(&self.file.index().path))?;
            self.file.read_into(dsts)
        })
        .py_err()
    }

    fn __repr__(&self) -> String {
        format!(
            "<ShardedFile {} ({} shards)>",
            self.file.index().path.display(),
            self.file.shard_paths().len()
        )
    }
}

/// Registers this module's classes and functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyShardedFile>()?;
    m.add_function(wrap_pyfunction!(save_sharded, m)?)?;
    m.add_function(wrap_pyfunction!(open_sharded, m)?)?;
    m.add_function(wrap_pyfunction!(read_ranges, m)?)?;
    Ok(())
}
