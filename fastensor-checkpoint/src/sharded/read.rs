//! Reading sharded checkpoints and raw byte ranges: [`CheckpointSource`]s of many files,
//! every file's requests in flight together.

use crate::header::{Header, HeaderEntry};
use crate::into_arena::{load_chosen, named};
use crate::loaded::Checkpoint;
use crate::plan::{How, Request};
use crate::retry::retry_changed;
use crate::shard_index::{read_index_from, ShardedIndex};
use crate::source::CheckpointSource;
use crate::FileOpener;
use crate::{Error, ErrorKind, MemMut, Result};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::Path;

/// A sharded checkpoint opened once: its index, every shard's validated header, and reads
/// of its tensors into caller buffers across all shards at once. A [`CheckpointSource`] of
/// the index's shards.
#[derive(Debug)]
pub struct ShardedFile(CheckpointSource);

/// Opens the sharded checkpoint at `path` (a directory or an index file): validates the
/// index and every shard's header (read in parallel). A tensor of the weight map missing
/// from its shard is [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt); a missing shard
/// [`ErrorKind::NotFound`](crate::ErrorKind::NotFound). A shard replaced (renamed over)
/// while it is opened makes the whole checkpoint be opened again (at most
/// [`LOAD_ATTEMPTS`](crate::LOAD_ATTEMPTS) tries; then
/// [`ErrorKind::Changed`](crate::ErrorKind::Changed)).
pub fn open_sharded<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<ShardedFile> {
    retry_changed(|| {
        CheckpointSource::sharded(opener, path)
            .map(ShardedFile)
            .map_err(|e| replaced(opener, path, e))
    })
}

/// `e`, or, where it is a shard of an object checkpoint found missing because a save
/// replaced the checkpoint meanwhile (the index read now no longer names that shard: a
/// save under an object prefix deletes the previous save's shards once its own index is
/// in place), [`ErrorKind::Changed`], which makes the load start again on the new index.
fn replaced<O: FileOpener + ?Sized>(opener: &O, path: &Path, e: Error) -> Error {
    if e.kind() != ErrorKind::NotFound
        || opener.place(path).commit != fastensor_core::Commit::OnSync
    {
        return e;
    }
    let Some(shard) = e.path().map(Path::to_path_buf) else {
        return e;
    };
    let Some(name) = shard.file_name().and_then(|n| n.to_str()) else {
        return e;
    };
    match read_index_from(opener, path) {
        Ok(index) if !index.weight_map.values().any(|v| v == name) => Error::new(
            ErrorKind::Changed,
            "the checkpoint was replaced while it was read: its index no longer names this shard",
        )
        .with_path(&shard),
        _ => e,
    }
}

impl ShardedFile {
    /// The parsed index.
    pub fn index(&self) -> &ShardedIndex {
        self.0.index().expect("a sharded source has an index")
    }

    /// The checkpoint as a [`CheckpointSource`].
    pub fn source(&self) -> &CheckpointSource {
        &self.0
    }

    /// The shards' paths, in sorted order.
    pub fn shard_paths(&self) -> Vec<&Path> {
        self.0.paths()
    }

    /// The shards' headers, in the order of [`shard_paths`](Self::shard_paths).
    pub fn headers(&self) -> Vec<&Header> {
        self.0.headers()
    }

    /// Every tensor of the weight map: its shard's index, its header entry and its absolute
    /// file range, shard by shard in file order.
    pub fn entries(&self) -> Vec<(usize, &HeaderEntry, Range<u64>)> {
        self.0.entries()
    }

    /// The `__metadata__` of the first shard (our writer gives every shard the same).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        self.0.metadata()
    }

    /// Fills each `(name, destination)` pair with that tensor's bytes, with the requests of
    /// every shard in flight together: see [`CheckpointSource::read_into`].
    pub fn read_into(&self, targets: Vec<(&str, MemMut<'_>)>) -> Result<()> {
        self.0.read_into(targets)
    }

    /// This checkpoint, its reads verified from now on: every tensor read by
    /// [`read_into`](Self::read_into) is checked against the checksum its shard's header
    /// stores; a mismatch is [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt) naming the
    /// shard and the tensor. Errors as
    /// [`Checksums::from_header`](crate::Checksums::from_header), for any shard.
    pub fn verifying(self) -> Result<ShardedFile> {
        self.0.verifying().map(ShardedFile)
    }

    /// Loads every tensor of the weight map into one arena (see [`load_sharded`]).
    pub(super) fn load_all(self) -> Result<ShardedCheckpoint> {
        let tensors = load_chosen(&self.0, &self.0.tensors(), 0)?;
        Ok(ShardedCheckpoint::new(self.0, tensors))
    }
}

/// Reads raw byte ranges `(file, offset, destination)` of any files (each opened once) into
/// the destinations, as one job per file: every file's requests in flight together, small
/// ranges close together read at once. A range past the end of its file is
/// [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt).
pub fn read_ranges<O: FileOpener + ?Sized>(
    opener: &O,
    requests: Vec<(&Path, u64, MemMut<'_>)>,
) -> Result<()> {
    let mut index: HashMap<&Path, usize> = HashMap::new();
    let mut order: Vec<&Path> = Vec::new();
    for (p, _, _) in &requests {
        index.entry(*p).or_insert_with(|| {
            order.push(*p);
            order.len() - 1
        });
    }
    let source = CheckpointSource::raw(opener, &order)?;
    let mut reqs: Vec<Request<'_>> = requests
        .into_iter()
        .filter(|(_, _, d)| !d.is_empty())
        .map(|(p, off, d)| Request::at(index[p], off, d))
        .collect();
    let how = How {
        fresh: false,
        windows: true,
    };
    source.read(&mut reqs, how)
}

/// A sharded checkpoint loaded into one aligned arena, with zero-copy views.
#[derive(Debug)]
pub struct ShardedCheckpoint {
    index: ShardedIndex,
    tensors: Checkpoint,
}

impl ShardedCheckpoint {
    fn new(source: CheckpointSource, tensors: Checkpoint) -> ShardedCheckpoint {
        let (_, index) = source.into_parts();
        let index = index.expect("a sharded source has an index");
        ShardedCheckpoint { index, tensors }
    }

    /// The index the checkpoint came from.
    pub fn index(&self) -> &ShardedIndex {
        &self.index
    }
}

/// The loaded tensors, as a single file's [`Checkpoint`] holds them (its path is the index,
/// its metadata the first shard's).
impl std::ops::Deref for ShardedCheckpoint {
    type Target = Checkpoint;

    fn deref(&self) -> &Checkpoint {
        &self.tensors
    }
}

/// Loads every tensor of the sharded checkpoint at `path` (a directory or an index file)
/// into one arena: each shard's reads go out as one job, all shards' in flight together. A
/// shard replaced (renamed over) during the load makes the whole load start again (at most
/// [`LOAD_ATTEMPTS`](crate::LOAD_ATTEMPTS) tries; then
/// [`ErrorKind::Changed`](crate::ErrorKind::Changed)).
pub fn load_sharded<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<ShardedCheckpoint> {
    retry_changed(|| {
        CheckpointSource::sharded(opener, path)
            .and_then(|source| ShardedFile(source).load_all())
            .map_err(|e| replaced(opener, path, e))
    })
}

/// Loads only the tensors `names` of the sharded checkpoint at `path`, only their bytes
/// read, across shards at once. A name the index lacks is
/// [`ErrorKind::NotFound`](crate::ErrorKind::NotFound); a shard replaced during the load is
/// handled as [`load_sharded`] does.
pub fn load_selected_sharded<O, I, S>(
    opener: &O,
    path: &Path,
    names: I,
) -> Result<ShardedCheckpoint>
where
    O: FileOpener + ?Sized,
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let names: Vec<S> = names.into_iter().collect();
    retry_changed(|| {
        let attempt = || {
            let source = CheckpointSource::sharded(opener, path)?;
            let tensors = load_chosen(&source, &named(&source, &names)?, 0)?;
            Ok(ShardedCheckpoint::new(source, tensors))
        };
        attempt().map_err(|e| replaced(opener, path, e))
    })
}

/// Fills the caller's buffers `(name, destination)` from the sharded checkpoint at `path`,
/// requests of every shard in flight together; returns the index. A shard replaced (renamed
/// over) during the load makes the whole load start again, every destination filled anew
/// (at most [`LOAD_ATTEMPTS`](crate::LOAD_ATTEMPTS) tries; then
/// [`ErrorKind::Changed`](crate::ErrorKind::Changed), the
/// destinations' contents unspecified).
pub fn load_into_sharded<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    mut targets: Vec<(&str, MemMut<'_>)>,
) -> Result<ShardedIndex> {
    let source =
        CheckpointSource::fill_anew(|| CheckpointSource::sharded(opener, path), &mut targets)?;
    let (_, index) = source.into_parts();
    Ok(index.expect("a sharded source has an index"))
}
