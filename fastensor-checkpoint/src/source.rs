//! One checkpoint source for every checkpoint form: a single safetensors file, a Hugging
//! Face sharded checkpoint (an index and its shard files), or a set of files read as raw
//! byte ranges (DCP's per-rank files). A source is opened and validated once: its files
//! opened, their headers read and checked, every tensor's place known (name -> file, dtype,
//! shape, byte range). All its reads go through the one planner ([`super::plan`]).

use super::header::read_header;
use super::header::{Header, HeaderEntry};
use super::plan::{execute, How, Request};
use super::retry::retry_changed;
use super::shard_index::{corrupt, read_index_from, ShardedIndex};
use super::source_file::SourceFile;
use super::sums::Checksums;
use super::{FileOpener, IO_THREADS};
use crate::{Error, ErrorKind, MemMut, OpenMode, Result};
use fastensor_core::debug_fields;
use fastensor_core::parallel;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// How a source's tensor names are resolved.
enum Names {
    /// One safetensors file: its header.
    OneFile,
    /// A sharded checkpoint: its index, and every name of its weight map -> (file, entry).
    Index {
        index: ShardedIndex,
        by_name: HashMap<String, (usize, usize)>,
    },
    /// Raw files: no names.
    Raw,
}

/// A checkpoint opened once: its files, their validated headers and where every tensor is.
/// Reads of its tensors (or of raw byte ranges) into caller memory go out as one job per
/// file, the files' requests in flight together.
pub struct CheckpointSource {
    files: Vec<SourceFile>,
    names: Names,
}

debug_fields!(CheckpointSource, "CheckpointSource", |s| { path: s.path(), files: s.files.len() });

/// `path`, or the local copy of it the opener reads instead (a cache of remote objects:
/// [`FileOpener::local_copy`]).
pub(crate) fn readable<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<PathBuf> {
    Ok(opener
        .local_copy(path)?
        .unwrap_or_else(|| path.to_path_buf()))
}

/// Opens `path` (or its local copy) and reads its header (validated).
fn open_file<O: FileOpener + ?Sized>(opener: &O, path: PathBuf) -> Result<SourceFile> {
    let path = readable(opener, &path)?;
    let file = opener.open_file(&path, OpenMode::Read)?;
    let header = Some(read_header(&*file, &path)?);
    Ok(SourceFile {
        path,
        file,
        header,
        checksums: None,
    })
}

impl CheckpointSource {
    /// The safetensors file at `path`, its header validated.
    pub(crate) fn single<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<Self> {
        Ok(CheckpointSource {
            files: vec![open_file(opener, path.to_path_buf())?],
            names: Names::OneFile,
        })
    }

    /// The sharded checkpoint at `path` (a directory or an index file): the index and every
    /// shard's header validated (shards opened in parallel). A tensor of the weight map
    /// missing from its shard is [`ErrorKind::Corrupt`]; a missing shard
    /// [`ErrorKind::NotFound`].
    pub(crate) fn sharded<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<Self> {
        let index = read_index_from(opener, path)?;
        let names = index.shard_names();
        let slots: Mutex<Vec<Option<SourceFile>>> =
            Mutex::new((0..names.len()).map(|_| None).collect());
        let dir = index.dir().to_path_buf();
        let jobs = names.iter().enumerate().collect();
        parallel::for_each(jobs, IO_THREADS, |(i, name)| {
            let file = open_file(opener, dir.join(name))?;
            slots.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(file);
            Ok(())
        })?;
        let files: Vec<SourceFile> = slots
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .into_iter()
            .map(|s| s.expect("every shard was opened"))
            .collect();
        let shard_of: HashMap<&str, usize> =
            names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let mut by_name = HashMap::with_capacity(index.weight_map.len());
        for (name, file) in &index.weight_map {
            let s = shard_of[file.as_str()];
            let e = files[s].header().position(name).ok_or_else(|| {
                corrupt(
                    format!("the index puts tensor `{name}` in {file}, which lacks it"),
                    &index.path,
                )
            })?;
            by_name.insert(name.clone(), (s, e));
        }
        Ok(CheckpointSource {
            files,
            names: Names::Index { index, by_name },
        })
    }

    /// The files `paths`, each opened once and read as raw byte ranges (no header).
    pub(crate) fn raw<O: FileOpener + ?Sized>(opener: &O, paths: &[&Path]) -> Result<Self> {
        let files = paths
            .iter()
            .map(|p| {
                Ok(SourceFile {
                    path: p.to_path_buf(),
                    file: opener.open_file(p, OpenMode::Read)?,
                    header: None,
                    checksums: None,
                })
            })
            .collect::<Result<_>>()?;
        Ok(CheckpointSource {
            files,
            names: Names::Raw,
        })
    }

    /// This source, its reads verified from now on: every whole tensor read is checked
    /// against the checksum its file's header stores; a mismatch is
    /// [`ErrorKind::Corrupt`] naming the file and the tensor. Errors as
    /// [`Checksums::from_header`], for any file.
    pub(crate) fn verifying(mut self) -> Result<Self> {
        for f in &mut self.files {
            if let Some(h) = &f.header {
                f.checksums = Some(Checksums::from_header(h, &f.path)?);
            }
        }
        Ok(self)
    }

    /// What the source is named by: its file, or its index.
    pub fn path(&self) -> &Path {
        match &self.names {
            Names::Index { index, .. } => &index.path,
            _ => self.files.first().map_or(Path::new(""), |f| &f.path),
        }
    }

    /// The index of a sharded checkpoint.
    pub(crate) fn index(&self) -> Option<&ShardedIndex> {
        match &self.names {
            Names::Index { index, .. } => Some(index),
            _ => None,
        }
    }

    /// The source's files, opened.
    pub(crate) fn files(&self) -> &[SourceFile] {
        &self.files
    }

    /// The files' paths (a sharded checkpoint's shards in sorted order).
    pub fn paths(&self) -> Vec<&Path> {
        self.files.iter().map(|f| f.path.as_path()).collect()
    }

    /// The files' headers, in the order of [`paths`](Self::paths) (none for raw files).
    pub fn headers(&self) -> Vec<&Header> {
        self.files
            .iter()
            .filter_map(|f| f.header.as_ref())
            .collect()
    }

    /// The `__metadata__` of the first file (our writer gives every shard the same).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        self.headers()
            .first()
            .map(|h| h.metadata().clone())
            .unwrap_or_default()
    }

    /// Every tensor (of a sharded checkpoint: of its weight map) as `(file, entry)`, file
    /// by file in file order.
    pub(crate) fn tensors(&self) -> Vec<(usize, usize)> {
        match &self.names {
            Names::OneFile => (0..self.files[0].header().entries().len())
                .map(|e| (0, e))
                .collect(),
            Names::Index { by_name, .. } => {
                let mut all: Vec<(usize, usize)> = by_name.values().copied().collect();
                all.sort_unstable();
                all
            }
            Names::Raw => Vec::new(),
        }
    }

    /// Every tensor of `tensors`: its file's index, its header entry and
    /// its absolute file range.
    pub fn entries(&self) -> Vec<(usize, &HeaderEntry, Range<u64>)> {
        self.tensors()
            .into_iter()
            .map(|at| {
                let (e, r) = self.entry(at);
                (at.0, e, r)
            })
            .collect()
    }

    /// The tensor called `name`: its file and entry, [`ErrorKind::NotFound`] naming the
    /// source when it has none.
    pub(crate) fn locate(&self, name: &str) -> Result<(usize, usize)> {
        let found = match &self.names {
            Names::OneFile => self.files[0].header().position(name).map(|e| (0, e)),
            Names::Index { by_name, .. } => by_name.get(name).copied(),
            Names::Raw => None,
        };
        found.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("no tensor `{name}` in the checkpoint"),
            )
            .with_path(self.path())
        })
    }

    /// The header entry of tensor `(file, entry)` and its absolute file range.
    pub(crate) fn entry(&self, (f, e): (usize, usize)) -> (&HeaderEntry, Range<u64>) {
        let h = self.files[f].header();
        let entry = &h.entries()[e];
        (entry, h.file_range(entry))
    }

    /// Fills each `(name, destination)` pair with that tensor's bytes. Destinations may be
    /// host or device memory (when the backend takes device memory); each must be exactly
    /// the tensor's byte length, else [`ErrorKind::InvalidInput`] naming its file; a name
    /// the source lacks is [`ErrorKind::NotFound`]. Nothing is read before every target is
    /// checked. Each file's requests go out in file order as one job, the files' in flight
    /// together; small host tensors next to each other are read together through a staging
    /// buffer. A read that would reach another file than the one opened (one renamed over
    /// the path since) fails with [`ErrorKind::Changed`]: bytes of two versions are never
    /// mixed. On a source opened `verifying`, every tensor is checked.
    pub fn read_into(&self, mut targets: Vec<(&str, MemMut<'_>)>) -> Result<()> {
        self.fill(&mut targets)
    }

    /// [`read_into`](Self::read_into) with the targets borrowed, so that a retried load can
    /// fill them again. A sharded source cuts long host reads into windows.
    pub(crate) fn fill(&self, targets: &mut [(&str, MemMut<'_>)]) -> Result<()> {
        let mut reqs = Vec::with_capacity(targets.len());
        for (name, dst) in targets.iter_mut() {
            let at = self.locate(name)?;
            let (entry, range) = self.entry(at);
            if dst.len() as u64 != entry.byte_len() {
                let what = format!("tensor `{name}`");
                let e = wrong_len(&what, entry.byte_len(), dst.len());
                return Err(e.with_path(&self.files[at.0].path));
            }
            reqs.push(Request {
                file: at.0,
                range,
                dst: dst.reborrow(),
            });
        }
        let windows = !matches!(self.names, Names::OneFile);
        self.read(
            &mut reqs,
            How {
                fresh: false,
                windows,
            },
        )
    }

    /// Opens a source with `open` and fills `targets` from it ([`fill`](Self::fill)); a
    /// source whose file is replaced (renamed over) meanwhile is opened and read again,
    /// every destination filled anew (see [`retry_changed`]). Returns the source read.
    pub(crate) fn fill_anew(
        open: impl Fn() -> Result<CheckpointSource>,
        targets: &mut [(&str, MemMut<'_>)],
    ) -> Result<CheckpointSource> {
        retry_changed(|| {
            let source = open()?;
            source.fill(targets)?;
            Ok(source)
        })
    }

    /// Fills each `(file, range, destination)`: bytes `range` of the source's file `file`
    /// (an index into [`paths`](Self::paths)), which must lie within that file's data
    /// section, and the destination exactly the range's length; else
    /// [`ErrorKind::InvalidInput`] naming the file, before anything is read. All requests go
    /// out as one job per file, the files' in flight together. On a source opened
    /// `verifying`, a request that is exactly one tensor's bytes is
    /// checked against its checksum; parts of tensors cannot be checked.
    pub fn read_spans(&self, spans: Vec<(usize, Range<u64>, MemMut<'_>)>) -> Result<()> {
        let mut reqs = Vec::with_capacity(spans.len());
        for (file, range, dst) in spans {
            let f = self.files.get(file).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!("no file {file} in a source of {} files", self.files.len()),
                )
                .with_path(self.path())
            })?;
            if let Some(h) = &f.header {
                let data = h.data_start()..h.data_start() + h.data_len();
                if range.start < data.start || range.end > data.end || range.start > range.end {
                    let e = Error::new(
                        ErrorKind::InvalidInput,
                        format!("bytes {range:?} lie outside the data section {data:?}"),
                    );
                    return Err(e.with_path(&f.path));
                }
            }
            if dst.len() as u64 != range.end - range.start {
                let what = format!("bytes {range:?}");
                return Err(wrong_len(&what, range.end - range.start, dst.len()).with_path(&f.path));
            }
            reqs.push(Request { file, range, dst });
        }
        self.read(
            &mut reqs,
            How {
                fresh: false,
                windows: true,
            },
        )
    }

    /// A digest of what the source holds: every file's tensors (name, dtype, shape, byte
    /// range) and metadata, in file order, and a sharded checkpoint's weight map; equal for
    /// two opens of the same checkpoint, different (but for a 64-bit collision) when any of
    /// these differ. Ranks of a group compare it before they share bytes.
    pub fn digest(&self) -> u64 {
        let mut h = Fnv64::default();
        h.write(&(self.files.len() as u64).to_le_bytes());
        for f in &self.files {
            let Some(header) = &f.header else {
                h.write(b"raw");
                continue;
            };
            h.write(&header.data_start().to_le_bytes());
            for e in header.entries() {
                h.write(e.desc.name.as_bytes());
                h.write(&[0]);
                h.write(e.desc.dtype.name().as_bytes());
                for d in &e.desc.shape {
                    h.write(&d.to_le_bytes());
                }
                let r = header.file_range(e);
                h.write(&r.start.to_le_bytes());
                h.write(&r.end.to_le_bytes());
            }
            for (k, v) in header.metadata() {
                h.write(k.as_bytes());
                h.write(&[0]);
                h.write(v.as_bytes());
                h.write(&[0]);
            }
        }
        if let Names::Index { by_name, .. } = &self.names {
            let mut names: Vec<(&String, &(usize, usize))> = by_name.iter().collect();
            names.sort();
            for (n, (f, e)) in names {
                h.write(n.as_bytes());
                h.write(&(*f as u64).to_le_bytes());
                h.write(&(*e as u64).to_le_bytes());
            }
        }
        h.0
    }

    /// Reads `reqs` (ranges of this source's files) through the planner.
    pub(crate) fn read(&self, reqs: &mut [Request<'_>], how: How) -> Result<()> {
        execute(&self.files, reqs, how)
    }

    /// Consumes the source: its files, and a sharded checkpoint's index.
    pub(crate) fn into_parts(self) -> (Vec<SourceFile>, Option<ShardedIndex>) {
        match self.names {
            Names::Index { index, .. } => (self.files, Some(index)),
            _ => (self.files, None),
        }
    }
}

/// FNV-1a, 64 bits: a stable digest (the same on every machine and version), not a
/// defence against crafted collisions.
struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The error of a destination of `got` bytes for `what`, which is `want` bytes:
/// [`ErrorKind::InvalidInput`].
pub(crate) fn wrong_len(what: &str, want: u64, got: usize) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("{what} is {want} bytes but its destination holds {got}"),
    )
}
