//! Reading sharded checkpoints: every shard's requests in flight together.

use super::index::{corrupt, read_index, ShardedIndex};
use crate::checkpoint::checksum::Checksums;
use crate::checkpoint::header::{Header, HeaderEntry};
use crate::checkpoint::load::{read_header, retry_changed};
use crate::checkpoint::plan::{Staged, SMALL};
use crate::checkpoint::{Arena, Checkpoint, FileOpener, IO_THREADS};
use crate::core::parallel;
use crate::{BackendFile, Error, ErrorKind, MemMut, OpenMode, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Alignment of file offsets and memory for zero-copy direct reads.
const ALIGN: u64 = 4096;

/// Host reads longer than this are split into windows of this many bytes, each faulted in
/// and read by one of the workers (page faults of fresh memory overlap other reads).
const READ_WINDOW: usize = 8 << 20;

/// One open shard.
pub(super) struct Shard {
    path: PathBuf,
    file: Box<dyn BackendFile>,
    header: Header,
}

/// A sharded checkpoint opened once: its index, every shard's validated header, and reads
/// of its tensors into caller buffers across all shards at once.
pub struct ShardedFile {
    index: ShardedIndex,
    pub(super) shards: Vec<Shard>,
    /// Tensor name -> (shard, entry), for every name of the weight map.
    by_name: HashMap<String, (usize, usize)>,
    /// Set by [`verifying`](ShardedFile::verifying): each shard's checksums.
    checksums: Option<Vec<Checksums>>,
}

impl std::fmt::Debug for ShardedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedFile")
            .field("index", &self.index.path)
            .field("shards", &self.shards.len())
            .field("tensors", &self.by_name.len())
            .finish()
    }
}

/// Opens the sharded checkpoint at `path` (a directory or an index file): validates the
/// index and every shard's header (read in parallel). A tensor of the weight map missing
/// from its shard is [`ErrorKind::Corrupt`]; a missing shard [`ErrorKind::NotFound`]. A
/// shard replaced (renamed over) while it is opened makes the whole checkpoint be opened
/// again (up to 3 tries; then [`ErrorKind::Changed`]).
pub fn open_sharded<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<ShardedFile> {
    retry_changed(|| open_once(opener, path))
}

fn open_once<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<ShardedFile> {
    let index = read_index(path)?;
    let names = index.shard_names();
    let slots: Mutex<Vec<Option<Shard>>> = Mutex::new((0..names.len()).map(|_| None).collect());
    let dir = index.dir().to_path_buf();
    parallel::for_each(
        names.iter().enumerate().collect(),
        IO_THREADS,
        |(i, name)| {
            let path = dir.join(name);
            let file = opener.open_file(&path, OpenMode::Read)?;
            let header = read_header(&*file, &path)?;
            slots.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(Shard { path, file, header });
            Ok(())
        },
    )?;
    let shards: Vec<Shard> = slots
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|s| s.expect("every shard was opened"))
        .collect();
    let shard_of: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut by_name = HashMap::with_capacity(index.weight_map.len());
    for (name, file) in &index.weight_map {
        let s = shard_of[file.as_str()];
        let e = shards[s].header.position(name).ok_or_else(|| {
            corrupt(
                format!("the index puts tensor `{name}` in {file}, which lacks it"),
                &index.path,
            )
        })?;
        by_name.insert(name.clone(), (s, e));
    }
    Ok(ShardedFile {
        index,
        shards,
        by_name,
        checksums: None,
    })
}

impl ShardedFile {
    /// The parsed index.
    pub fn index(&self) -> &ShardedIndex {
        &self.index
    }

    /// The shards' paths, in sorted order.
    pub fn shard_paths(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// The shards' headers, in the order of [`shard_paths`](Self::shard_paths).
    pub fn headers(&self) -> Vec<&Header> {
        self.shards.iter().map(|s| &s.header).collect()
    }

    /// Every tensor of the weight map: its shard's index, its header entry and its absolute
    /// file range, shard by shard in file order.
    pub fn entries(&self) -> Vec<(usize, &HeaderEntry, Range<u64>)> {
        let mut out: Vec<(usize, usize)> = self.by_name.values().copied().collect();
        out.sort_unstable();
        out.into_iter()
            .map(|(s, e)| {
                let h = &self.shards[s].header;
                let entry = &h.entries()[e];
                (s, entry, h.file_range(entry))
            })
            .collect()
    }

    /// The `__metadata__` of the first shard (our writer gives every shard the same).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        self.shards
            .first()
            .map(|s| s.header.metadata().clone())
            .unwrap_or_default()
    }

    /// Fills each `(name, destination)` pair with that tensor's bytes, with the requests of
    /// every shard in flight together; the rules of
    /// [`CheckpointFile::read_into`](crate::checkpoint::CheckpointFile::read_into) hold (lengths
    /// checked first, a missing name is [`ErrorKind::NotFound`]).
    pub fn read_into(&self, mut targets: Vec<(&str, MemMut<'_>)>) -> Result<()> {
        self.fill(&mut targets)
    }

    /// This checkpoint, its reads verified from now on: every tensor read by
    /// [`read_into`](Self::read_into) is checked against the checksum its shard's header
    /// stores (after the reads, in parallel); a mismatch is [`ErrorKind::Corrupt`] naming
    /// the shard and the tensor. Errors as [`Checksums::from_header`], for any shard.
    pub fn verifying(mut self) -> Result<ShardedFile> {
        let sums = self
            .shards
            .iter()
            .map(|s| Checksums::from_header(&s.header, &s.path))
            .collect::<Result<_>>()?;
        self.checksums = Some(sums);
        Ok(self)
    }

    /// [`read_into`](Self::read_into) with the targets borrowed, so that a retried load can
    /// fill them again.
    fn fill(&self, targets: &mut [(&str, MemMut<'_>)]) -> Result<()> {
        let mut reqs = Vec::with_capacity(targets.len());
        for (name, dst) in targets.iter_mut() {
            let &(s, e) = self.by_name.get(*name).ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!("no tensor `{name}` in the checkpoint"),
                )
                .with_path(&self.index.path)
            })?;
            let h = &self.shards[s].header;
            let entry = &h.entries()[e];
            if dst.len() as u64 != entry.byte_len() {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "tensor `{name}` is {} bytes but its destination holds {}",
                        entry.byte_len(),
                        dst.len()
                    ),
                )
                .with_path(&self.shards[s].path));
            }
            reqs.push((s, h.file_range(entry), dst.reborrow()));
        }
        let files: Vec<(&dyn BackendFile, &Path)> = self
            .shards
            .iter()
            .map(|s| (&*s.file, s.path.as_path()))
            .collect();
        read_requests(&files, reqs)?;
        let Some(sums) = &self.checksums else {
            return Ok(());
        };
        let checks: Vec<(usize, Range<u64>, &MemMut<'_>)> = targets
            .iter()
            .map(|(name, dst)| {
                let (s, e) = self.by_name[*name];
                let h = &self.shards[s].header;
                (s, h.file_range(&h.entries()[e]), dst)
            })
            .collect();
        parallel::for_each(checks, IO_THREADS, |(s, r, dst)| {
            sums[s].check_dst(&self.shards[s].path, &r, dst)
        })
    }
}

/// One range to read: a file (an index into the open files), its byte range, and where to.
type Request<'a> = (usize, Range<u64>, MemMut<'a>);

/// One read job: a lone request, or small host requests of one file read together.
enum ReadJob<'a> {
    Single(Request<'a>),
    Staged(usize, Staged<'a>),
}

fn truncated(path: &Path, offset: u64) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        "the file ended before the range read did (truncated)",
    )
    .with_path(path)
    .with_offset(offset)
}

/// Reads every request, all files in flight together: small host ranges close together in
/// one file are joined into one staged read, long host ranges are split into windows (each
/// faulted in by the worker that reads it), and the jobs of the files are interleaved so
/// that the workers read from every file at once.
fn read_requests(files: &[(&dyn BackendFile, &Path)], mut reqs: Vec<Request<'_>>) -> Result<()> {
    reqs.sort_by_key(|(f, r, _)| (*f, r.start));
    // One job per file: its backend chosen once for all its reads.
    let mut job_files: Vec<Option<Box<dyn BackendFile + '_>>> =
        (0..files.len()).map(|_| None).collect();
    for mine in reqs.chunk_by(|a, b| a.0 == b.0) {
        let (f, memory) = (mine[0].0, mine[0].2.kind());
        if mine.iter().any(|(_, _, d)| d.kind() != memory) {
            continue;
        }
        job_files[f] = files[f].0.begin_read_job(&crate::core::ReadJob {
            bytes: mine.iter().map(|(_, r, _)| r.end - r.start).sum(),
            requests: mine.len(),
            largest: mine
                .iter()
                .map(|(_, r, _)| r.end - r.start)
                .max()
                .unwrap_or(0),
            in_flight: IO_THREADS as u32,
            memory,
            fresh: false,
            first_offset: mine[0].1.start,
        });
    }
    let files: Vec<(&dyn BackendFile, &Path)> = files
        .iter()
        .zip(&job_files)
        .map(|(&(file, path), job)| (job.as_deref().unwrap_or(file), path))
        .collect();
    let files = &files[..];
    let mut per_file: Vec<Vec<ReadJob<'_>>> = (0..files.len()).map(|_| Vec::new()).collect();
    for (f, r, dst) in reqs {
        let len = r.end - r.start;
        let jobs = &mut per_file[f];
        match dst {
            MemMut::Host(d) if len < SMALL => match jobs.last_mut() {
                Some(ReadJob::Staged(_, g)) if g.admits(&r) => g.push(r, d),
                _ => jobs.push(ReadJob::Staged(f, Staged::new(r, d))),
            },
            MemMut::Host(d) => {
                let mut at = r.start;
                for w in d.chunks_mut(READ_WINDOW) {
                    let end = at + w.len() as u64;
                    jobs.push(ReadJob::Single((f, at..end, MemMut::Host(w))));
                    at = end;
                }
            }
            dst => jobs.push(ReadJob::Single((f, r, dst))),
        }
    }
    // Round-robin over the files.
    let mut queues: Vec<std::vec::IntoIter<ReadJob<'_>>> =
        per_file.into_iter().map(Vec::into_iter).collect();
    let mut jobs = Vec::new();
    loop {
        let before = jobs.len();
        for q in &mut queues {
            if let Some(j) = q.next() {
                jobs.push(j);
            }
        }
        if jobs.len() == before {
            break;
        }
    }
    parallel::for_each(jobs, IO_THREADS, |job| match job {
        ReadJob::Single((f, r, dst)) => {
            let (file, path) = files[f];
            let mut dst = dst;
            if let MemMut::Host(d) = &mut dst {
                crate::checkpoint::arena::fault_in(d);
            }
            let got = file.read_at(r.start, dst)?;
            if (got as u64) < r.end - r.start {
                return Err(truncated(path, r.start + got as u64));
            }
            Ok(())
        }
        ReadJob::Staged(f, group) => {
            let (file, path) = files[f];
            group.read(file, |at| truncated(path, at), |_, _| Ok(()))
        }
    })
}

/// Reads raw byte ranges `(file, offset, destination)` of any files (each opened once) into
/// the destinations, as one job: every file's requests in flight together, small ranges
/// close together read at once. A range past the end of its file is
/// [`ErrorKind::Corrupt`].
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
    let opened: Vec<Box<dyn BackendFile>> = order
        .iter()
        .map(|p| opener.open_file(p, OpenMode::Read))
        .collect::<Result<_>>()?;
    let files: Vec<(&dyn BackendFile, &Path)> =
        opened.iter().zip(&order).map(|(f, p)| (&**f, *p)).collect();
    let reqs = requests
        .into_iter()
        .filter(|(_, _, d)| !d.is_empty())
        .map(|(p, off, d)| {
            let len = d.len() as u64;
            (index[p], off..off + len, d)
        })
        .collect();
    read_requests(&files, reqs)
}

/// A sharded checkpoint loaded into one aligned arena, with zero-copy views.
#[derive(Debug)]
pub struct ShardedCheckpoint {
    index: ShardedIndex,
    tensors: Checkpoint,
}

impl ShardedCheckpoint {
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
/// into one arena: the reads of all shards go out as one job. A shard replaced (renamed
/// over) during the load makes the whole load start again (up to 3 tries; then
/// [`ErrorKind::Changed`]).
pub fn load_sharded<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<ShardedCheckpoint> {
    retry_changed(|| load_chosen(open_once(opener, path)?, |_| true))
}

/// Loads only the tensors `names` of the sharded checkpoint at `path`, only their bytes
/// read, across shards as one job. A name the index lacks is [`ErrorKind::NotFound`]; a
/// shard replaced during the load is handled as [`load_sharded`] does.
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
    let names: Vec<String> = names.into_iter().map(|n| n.as_ref().to_string()).collect();
    let wanted: HashSet<&str> = names.iter().map(String::as_str).collect();
    retry_changed(|| {
        let file = open_once(opener, path)?;
        if let Some(n) = names
            .iter()
            .find(|n| !file.by_name.contains_key(n.as_str()))
        {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("no tensor `{n}` in the checkpoint"),
            )
            .with_path(&file.index.path));
        }
        load_chosen(file, |name| wanted.contains(name))
    })
}

pub(super) fn load_chosen(
    file: ShardedFile,
    keep: impl Fn(&str) -> bool,
) -> Result<ShardedCheckpoint> {
    let chosen: Vec<(usize, HeaderEntry, Range<u64>)> = file
        .entries()
        .into_iter()
        .filter(|(_, e, _)| keep(&e.desc.name))
        .map(|(s, e, r)| (s, e.clone(), r))
        .collect();
    // Each tensor is placed where its arena offset and its file offset agree modulo ALIGN
    // (neighbours in a file stay neighbours), so direct reads fill it with no copy.
    let mut places = Vec::with_capacity(chosen.len());
    let mut pos = 0u64;
    let mut prev: Option<(usize, u64)> = None;
    for (s, _, r) in &chosen {
        if prev != Some((*s, r.start)) {
            pos += (r.start % ALIGN + ALIGN - pos % ALIGN) % ALIGN;
        }
        places.push(pos);
        pos += r.end - r.start;
        prev = Some((*s, r.end));
    }
    let len = usize::try_from(pos).map_err(|_| {
        Error::new(
            ErrorKind::OutOfMemory,
            "the checkpoint does not fit in memory",
        )
        .with_path(&file.index.path)
    })?;
    let mut arena = Arena::new(len).map_err(|e| e.with_path(&file.index.path))?;
    {
        let mut targets = Vec::with_capacity(chosen.len());
        let mut rest: &mut [u8] = &mut arena;
        let mut at = 0u64;
        for ((_, e, r), &place) in chosen.iter().zip(&places) {
            let (_, tail) = rest.split_at_mut((place - at) as usize);
            let (piece, tail) = tail.split_at_mut((r.end - r.start) as usize);
            targets.push((e.desc.name.as_str(), MemMut::Host(piece)));
            rest = tail;
            at = place + (r.end - r.start);
        }
        file.read_into(targets)?;
    }
    let entries = chosen
        .iter()
        .zip(&places)
        .map(|((_, e, r), &place)| {
            let start = place as usize;
            (e.desc.clone(), start..start + (r.end - r.start) as usize)
        })
        .collect();
    let tensors = Checkpoint::from_parts(&file.index.path, arena, entries, file.metadata())?;
    Ok(ShardedCheckpoint {
        index: file.index,
        tensors,
    })
}

/// Fills the caller's buffers `(name, destination)` from the sharded checkpoint at `path`,
/// requests of every shard in flight together; returns the index. A shard replaced (renamed
/// over) during the load makes the whole load start again, every destination filled anew
/// (up to 3 tries; then [`ErrorKind::Changed`], the destinations' contents unspecified).
pub fn load_into_sharded<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    mut targets: Vec<(&str, MemMut<'_>)>,
) -> Result<ShardedIndex> {
    retry_changed(|| {
        let file = open_once(opener, path)?;
        file.fill(&mut targets)?;
        Ok(file.index)
    })
}
