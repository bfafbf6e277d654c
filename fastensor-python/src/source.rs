//! Reads of any open checkpoint, one file or sharded, through its `CheckpointSource`.

use crate::engine::{exported, name_refs, Exported, PyCheckpointFile};
use crate::errors::IntoPy;
use crate::sharded::PyShardedFile;
use pyo3::prelude::*;

/// The tensors `names` (every tensor when `None`) of `file`, an open `CheckpointFile` or
/// `ShardedFile`, read into new host memory (`CheckpointSource::read_new`: one arena laid
/// out for direct reads, each tensor read whole and checked where the file verifies), the
/// GIL released, as `(name, dtype, shape, capsule)` (see `Engine.load_new` for
/// `versioned`).
#[pyfunction]
#[pyo3(signature = (file, names=None, versioned=false))]
pub fn read_new(
    py: Python<'_>,
    file: &Bound<'_, PyAny>,
    names: Option<Vec<String>>,
    versioned: bool,
) -> PyResult<Exported> {
    let one;
    let sharded;
    let source = if let Ok(f) = file.cast::<PyCheckpointFile>() {
        one = f.clone();
        one.get().file.source()
    } else {
        sharded = file.cast::<PyShardedFile>()?.clone();
        sharded.get().source()
    };
    let ckpt = py
        .detach(|| source.read_new(name_refs(&names).as_deref()))
        .py_err()?;
    Ok(exported(py, ckpt, versioned)?.0)
}
