//! A loaded checkpoint: one aligned arena holding the tensors' bytes, and zero-copy views.

use super::header::lookup;
use super::header::validate;
use super::view::{TensorView, Tensors};
use super::Arena;
use crate::{Error, ErrorKind, MemRef, Result, TensorDesc};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// What [`Checkpoint::into_parts`] returns: the arena, each tensor's descriptor and range
/// of it, and the metadata.
pub type CheckpointParts = (
    Arena,
    Vec<(TensorDesc, Range<usize>)>,
    BTreeMap<String, String>,
);

/// A loaded checkpoint: one aligned arena holding the tensors' bytes, and zero-copy views.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    arena: Arena,
    entries: Vec<(TensorDesc, Range<usize>)>,
    /// Indices into `entries`, sorted by name.
    by_name: Vec<u32>,
    metadata: BTreeMap<String, String>,
}

impl Checkpoint {
    /// A checkpoint of `entries` (descriptor and range of `arena`) read from `path`; a name
    /// given twice is [`ErrorKind::Corrupt`].
    pub(crate) fn from_parts(
        path: &Path,
        arena: Arena,
        mut entries: Vec<(TensorDesc, Range<usize>)>,
        metadata: BTreeMap<String, String>,
    ) -> Result<Checkpoint> {
        entries.shrink_to_fit();
        let by_name = validate::by_name(&entries, |(d, _)| &d.name).map_err(|name| {
            Error::new(ErrorKind::Corrupt, format!("tensor `{name}` appears twice")).with_path(path)
        })?;
        Ok(Checkpoint {
            path: path.to_path_buf(),
            arena,
            entries,
            by_name,
            metadata,
        })
    }

    /// The tensor called `name`: its descriptor and bytes (a view into the arena).
    pub fn tensor(&self, name: &str) -> Option<(&TensorDesc, &[u8])> {
        lookup(&self.by_name, name, |i| &self.entries[i].0.name).map(|i| {
            let (d, r) = &self.entries[i];
            (d, &self.arena[r.clone()])
        })
    }

    /// Every loaded tensor, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&TensorDesc, &[u8])> + '_ {
        self.entries
            .iter()
            .map(|(d, r)| (d, &self.arena[r.clone()]))
    }

    /// The loaded tensors as views, ready to [`save`](super::save) again.
    pub fn views(&self) -> Vec<TensorView<'_>> {
        self.iter()
            .map(|(d, b)| TensorView::new(d.clone(), b))
            .collect()
    }

    /// Number of loaded tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no tensor was loaded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The `__metadata__` map of the file.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The file the checkpoint came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The arena holding every tensor's bytes (page-aligned).
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The arena, each tensor's descriptor and range of it (file order), and the metadata.
    pub fn into_parts(self) -> CheckpointParts {
        (self.arena, self.entries, self.metadata)
    }

    /// Total bytes of the loaded tensors.
    pub fn data_bytes(&self) -> u64 {
        self.entries.iter().map(|(_, r)| r.len() as u64).sum()
    }
}

impl<'a> Tensors<'a> for &'a Checkpoint {
    fn count(&self) -> usize {
        self.entries.len()
    }
    fn desc(&self, i: usize) -> &'a TensorDesc {
        &self.entries[i].0
    }
    fn data(&self, i: usize) -> MemRef<'a> {
        MemRef::Host(&self.arena[self.entries[i].1.clone()])
    }
}
