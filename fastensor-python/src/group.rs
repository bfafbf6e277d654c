//! What the ranks of a process group need from Rust to load one checkpoint together
//! (`fastensor._group` runs the collectives): the digest ranks compare before sharing bytes,
//! the plan of who reads what (`fastensor::checkpoint::group`), reads of raw byte spans of
//! an open checkpoint, and the engine's choice between reading once and broadcasting or
//! every rank reading (`Engine::choose_group_read`), taught by each load's time.

use crate::engine::{PyCheckpointFile, PyEngine};
use crate::errors::IntoPy;
use crate::memory::{self, Access, Lender};
use crate::sharded::PyShardedFile;
use fastensor::checkpoint::group::{plan_group_read, GroupTensor, PlanOptions};
use fastensor::checkpoint::CheckpointSource;
use fastensor::engine::{GroupContext, GroupRead, GroupSource};
use fastensor::MemoryKind;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::time::Duration;

/// A planned message as Python takes it: `(owner, file, start, end, pieces)`, each piece
/// `(tensor, start, end)` with `tensor` an index into the file's `entries()` and the bytes
/// relative to the tensor's first byte.
type MessageRow = (usize, usize, u64, u64, Vec<(usize, u64, u64)>);

/// One span to read: `(file, start, end, object, byte_offset)`: bytes `start..end` of the
/// source's file `file` into the object's memory from `byte_offset`.
type SpanSpec<'py> = (usize, u64, u64, Bound<'py, PyAny>, usize);

/// Runs `f` on the source of `file`, an open `CheckpointFile` or `ShardedFile`.
fn with_source<T>(
    file: &Bound<'_, PyAny>,
    f: impl FnOnce(&CheckpointSource) -> PyResult<T>,
) -> PyResult<T> {
    if let Ok(one) = file.cast::<PyCheckpointFile>() {
        return f(one.get().file.source());
    }
    let sharded = file.cast::<PyShardedFile>()?;
    f(sharded.get().source())
}

/// The digest of what `file` holds (`CheckpointSource::digest`).
#[pyfunction]
fn source_digest(file: &Bound<'_, PyAny>) -> PyResult<u64> {
    with_source(file, |s| Ok(s.digest()))
}

/// The plan of `ranks` ranks reading the tensors `indices` of `file` (indices into its
/// `entries()`; every tensor when `None`), each tensor read whole when `split` is false.
/// Pieces name tensors by their `entries()` index.
#[pyfunction]
#[pyo3(signature = (file, ranks, split, indices=None))]
fn group_plan(
    file: &Bound<'_, PyAny>,
    ranks: usize,
    split: bool,
    indices: Option<Vec<usize>>,
) -> PyResult<Vec<MessageRow>> {
    with_source(file, |s| {
        let all = s.entries();
        let chosen: Vec<usize> = match indices {
            Some(ix) => ix,
            None => (0..all.len()).collect(),
        };
        let mut tensors = Vec::with_capacity(chosen.len());
        for &i in &chosen {
            let (f, _, range) = all.get(i).ok_or_else(|| {
                pyo3::exceptions::PyIndexError::new_err(format!(
                    "no tensor {i} in a checkpoint of {} tensors",
                    all.len()
                ))
            })?;
            tensors.push(GroupTensor {
                file: *f,
                range: range.clone(),
            });
        }
        let total = tensors.iter().map(|t| t.range.end - t.range.start).sum();
        let mut opts = PlanOptions::for_total(total, ranks);
        opts.split = split;
        let plan = plan_group_read(&tensors, ranks, opts);
        Ok(plan
            .messages
            .into_iter()
            .map(|m| {
                let pieces = m
                    .pieces
                    .iter()
                    .map(|p| (chosen[p.tensor], p.bytes.start, p.bytes.end))
                    .collect();
                (m.owner, m.file, m.range.start, m.range.end, pieces)
            })
            .collect())
    })
}

/// Reads each span `(file, start, end, object, byte_offset)` of `file` into the object's
/// memory (`CheckpointSource::read_spans`: one job, checked where a span is a whole tensor
/// of a verifying file), the GIL released.
#[pyfunction]
fn read_spans(py: Python<'_>, file: &Bound<'_, PyAny>, spans: Vec<SpanSpec<'_>>) -> PyResult<()> {
    with_source(file, |source| {
        let mut lender = Lender::new(Access::Write);
        let mut regions = Vec::with_capacity(spans.len());
        for (_, start, end, obj, at) in &spans {
            let what = format!("destination of bytes {start}..{end}");
            let len = usize::try_from(end.saturating_sub(*start)).unwrap_or(usize::MAX);
            let region = lender
                .region(obj, &what)
                .and_then(|r| r.range(*at, len, &what))
                .map_err(|e| e.with_path(source.path()))
                .py_err()?;
            regions.push(region);
        }
        memory::check_disjoint(regions.iter().map(|r| (*r, "a span"))).py_err()?;
        lender.check_writable().py_err()?;
        let places: Vec<(usize, std::ops::Range<u64>)> =
            spans.iter().map(|(f, s, e, _, _)| (*f, *s..*e)).collect();
        py.detach(|| {
            let reqs = places
                .into_iter()
                .zip(&regions)
                // SAFETY: `lender` keeps each destination lent (writable) until after this
                // closure; they were checked to fit and not to overlap.
                .map(|((f, r), region)| (f, r, unsafe { region.as_mut() }))
                .collect();
            source.read_spans(reqs)
        })
        .py_err()
    })
}

/// The context of a group load of `path`.
fn context(path: PathBuf, ranks: u32, hosts: u32, bytes: u64, cuda: bool) -> GroupContext {
    GroupContext {
        ranks,
        hosts,
        bytes,
        memory: if cuda {
            MemoryKind::Device { ordinal: 0 }
        } else {
            MemoryKind::Host
        },
        source: GroupSource::of(&path),
    }
}

/// How a group of `ranks` ranks on `hosts` hosts should load `bytes` of `path` (to CUDA
/// memory when `cuda`): `(way, exploring, reason)`, the way `"broadcast"` or `"each"`.
#[pyfunction]
fn group_choose(
    engine: &PyEngine,
    path: PathBuf,
    ranks: u32,
    hosts: u32,
    bytes: u64,
    cuda: bool,
) -> (&'static str, bool, String) {
    let c = engine
        .engine
        .choose_group_read(&context(path, ranks, hosts, bytes, cuda));
    (c.read.name(), c.exploring, c.reason)
}

/// The way the engine's rule gives a group load of `path` by `ranks` ranks on `hosts` hosts
/// (the same on every rank), or `None` where the way is learned (rank 0's to choose).
#[pyfunction]
fn group_rule(
    path: PathBuf,
    ranks: u32,
    hosts: u32,
    bytes: u64,
    cuda: bool,
) -> Option<&'static str> {
    context(path, ranks, hosts, bytes, cuda)
        .rule()
        .map(|(read, _)| read.name())
}

/// Teaches the engine that a group load as [`group_choose`] described it, done `way`'s way,
/// took `seconds` until every rank held every tensor.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn group_record(
    engine: &PyEngine,
    path: PathBuf,
    ranks: u32,
    hosts: u32,
    bytes: u64,
    cuda: bool,
    way: &str,
    seconds: f64,
) -> PyResult<()> {
    let read = GroupRead::parse(way).py_err()?;
    let wall = Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::ZERO);
    engine
        .engine
        .record_group_read(&context(path, ranks, hosts, bytes, cuda), read, wall);
    Ok(())
}

/// Adds the functions to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(source_digest, m)?)?;
    m.add_function(wrap_pyfunction!(group_plan, m)?)?;
    m.add_function(wrap_pyfunction!(read_spans, m)?)?;
    m.add_function(wrap_pyfunction!(group_choose, m)?)?;
    m.add_function(wrap_pyfunction!(group_rule, m)?)?;
    m.add_function(wrap_pyfunction!(group_record, m)?)?;
    Ok(())
}
