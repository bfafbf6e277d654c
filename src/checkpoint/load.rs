//! Loads: the whole data section into one aligned arena, a selection of tensors (only the
//! ranges needed, neighbours merged), or the caller's own buffers.

use super::header::{
    check_header_len, header_len_of, lookup, parse_header, parse_header_from, Header, HeaderEntry,
    PARSE_WHOLE_MAX,
};
use super::plan::{plan_reads, ReadJob};
use super::save::{TensorView, Tensors};
use super::{validate, Arena, FileOpener, IO_THREADS};
use crate::core::align::align_down;
use crate::core::parallel;
use crate::core::ReadJob as JobShape;
use crate::{
    BackendFile, Error, ErrorKind, HostBuffer, MemMut, MemRef, MemoryKind, OpenMode, Result,
    TensorDesc,
};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Alignment of file offsets and memory for zero-copy direct reads.
pub(crate) const ALIGN: u64 = 4096;

/// The first read of a file: enough for most headers.
const FIRST_READ: u64 = 64 << 10;

/// Bytes of one read of a load (a multiple of [`ALIGN`]).
const READ_WINDOW: usize = 8 << 20;

/// Selected tensors closer than this are read in one request, gap included.
const MERGE_GAP: u64 = 1 << 20;

/// A read of [`load_into`]: a file range and its destination.
pub(crate) type Request<'a> = (Range<u64>, MemMut<'a>);

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

/// Reads and validates the header of an open file; one longer than [`PARSE_WHOLE_MAX`] is
/// parsed as it is read, in pieces of [`FIRST_READ`] bytes (its JSON never held whole).
pub(crate) fn read_header(file: &dyn BackendFile, path: &Path) -> Result<Header> {
    let file_len = file.len().map_err(|e| e.with_path(path))?;
    read_header_with(file_len, &|at, buf| file.read_metadata_at(at, buf), path)
}

/// [`read_header`] of a file of `file_len` bytes read through `read_at` (a read at an
/// offset into a buffer: the bytes read, short only at the end of the file).
pub(crate) fn read_header_with(file_len: u64, read_at: &ReadAt<'_>, path: &Path) -> Result<Header> {
    let ctx = |e: Error| e.with_path(path);
    let mut buf = HostBuffer::new(file_len.min(FIRST_READ) as usize)?;
    let n = read_at(0, &mut buf).map_err(ctx)?;
    let header_len = header_len_of(&buf[..n]).map_err(ctx)?;
    check_header_len(header_len, file_len).map_err(ctx)?;
    let need = 8 + header_len as usize;
    if need <= n {
        return parse_header(&buf[..n], file_len).map_err(ctx);
    }
    if header_len <= PARSE_WHOLE_MAX {
        buf = HostBuffer::new(need)?;
        let got = read_at(0, &mut buf).map_err(ctx)?;
        if got < need {
            return Err(ctx(Error::new(
                ErrorKind::Corrupt,
                "the file shrank while its header was read",
            )));
        }
        return parse_header(&buf[..need], file_len).map_err(ctx);
    }
    let reader = FileReader {
        read_at,
        buf,
        filled: n,
        at: 8,
        pos: 0,
    };
    parse_header_from(reader, header_len, file_len).map_err(ctx)
}

/// A read of a file at an offset into a buffer (see [`read_header_with`]).
pub(crate) type ReadAt<'a> = dyn Fn(u64, &mut [u8]) -> Result<usize> + 'a;

/// Reads a file from an offset on, a buffer at a time.
struct FileReader<'a> {
    read_at: &'a ReadAt<'a>,
    buf: HostBuffer,
    /// Bytes of `buf` holding the file from `pos`.
    filled: usize,
    /// Next byte of `buf` to hand out.
    at: usize,
    /// File offset of `buf[0]`.
    pos: u64,
}

impl std::io::Read for FileReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.filled {
            self.pos += self.filled as u64;
            self.at = 0;
            self.filled = (self.read_at)(self.pos, &mut self.buf).map_err(std::io::Error::other)?;
            if self.filled == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file shrank while its header was read",
                ));
            }
        }
        let n = out.len().min(self.filled - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn truncated(path: &Path, offset: u64) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        "the file ended before its data section did (truncated)",
    )
    .with_path(path)
    .with_offset(offset)
}

/// Tries of one load whose file is replaced (renamed over) while it is read.
const ATTEMPTS: usize = 5;

/// Runs `attempt` (a whole load: open the path, read the header, read the data) again
/// while it fails with [`ErrorKind::Changed`] (the file was replaced by another while it was
/// read), at most [`ATTEMPTS`] times in all; each try reads one version of the file, and a
/// failed try's bytes are never returned. The last error is returned as it is.
pub(crate) fn retry_changed<T>(mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut tries = 1;
    loop {
        match attempt() {
            Err(e) if e.kind() == ErrorKind::Changed && tries < ATTEMPTS => tries += 1,
            done => return done,
        }
    }
}

/// Loads every tensor of the safetensors file at `path`.
///
/// One decision for the whole load: where the opener maps new loads
/// ([`FileOpener::maps_new_loads`], the engine's default) the file is mapped copy-on-write
/// and its pages brought in by several threads (see [`Arena`] for what a mapping shares
/// with the file); otherwise, or where the file system cannot map the file, the data section
/// is read into one page-aligned arena of its own. When the data
/// section is not aligned in the file (files written by other tools), the arena is offset so
/// that file and memory alignments still match and direct I/O still copies nothing. A file
/// replaced (renamed over) during the load is loaded again, whole (up to 3 tries); when it
/// keeps changing the error is [`ErrorKind::Changed`].
pub fn load<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<Checkpoint> {
    if opener.maps_new_loads(path) {
        let mapped = retry_changed(|| super::mapped::load(path, &|_, _| true, false));
        if let Some(done) = super::mapped::mappable(mapped) {
            return done;
        }
    }
    retry_changed(|| {
        let file = opener.open_file(path, OpenMode::Read)?;
        let header = read_header(&*file, path)?;
        let spans = vec![(header.data_start(), header.file_len())];
        read_spans(&*file, path, header, spans, |_| true)
    })
}

/// Loads only the tensors in `names` from the file at `path`. Only their byte ranges are
/// read; ranges closer than 1 MiB are merged into one request. A name the file lacks is
/// [`ErrorKind::NotFound`]; a file replaced during the load is handled as [`load`] does.
pub fn load_selected<O, I, S>(opener: &O, path: &Path, names: I) -> Result<Checkpoint>
where
    O: FileOpener + ?Sized,
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let names: Vec<S> = names.into_iter().collect();
    if opener.maps_new_loads(path) {
        let wanted: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
        let mapped = retry_changed(|| super::mapped::load_named(path, &wanted, false));
        if let Some(done) = super::mapped::mappable(mapped) {
            return done;
        }
    }
    retry_changed(|| {
        let file = opener.open_file(path, OpenMode::Read)?;
        let header = read_header(&*file, path)?;
        let mut wanted = vec![false; header.entries().len()];
        for name in &names {
            wanted[index_of(&header, name.as_ref(), path)?] = true;
        }
        let spans = merged_spans(&header, &wanted);
        read_spans(&*file, path, header, spans, |i| wanted[i])
    })
}

/// [`load`] (all tensors) or [`load_selected`] (`names`), every tensor loaded checked
/// against the checksum the file's header stores ([`super::checksum`]): as its bytes are
/// brought in where the file is mapped, right after the read otherwise. A mismatch is
/// [`ErrorKind::Corrupt`] naming the file and the tensor; a file saved without checksums is
/// [`ErrorKind::InvalidInput`].
pub fn load_verified<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    names: Option<&[&str]>,
) -> Result<Checkpoint> {
    if opener.maps_new_loads(path) {
        let mapped = retry_changed(|| match names {
            None => super::mapped::load(path, &|_, _| true, true),
            Some(names) => super::mapped::load_named(path, names, true),
        });
        if let Some(done) = super::mapped::mappable(mapped) {
            return done;
        }
    }
    let ckpt = match names {
        None => load(opener, path)?,
        Some(names) => load_selected(opener, path, names.iter().copied())?,
    };
    super::checksum::check_loaded(&ckpt)?;
    Ok(ckpt)
}

/// The file ranges of the `wanted` entries, neighbours closer than [`MERGE_GAP`] merged.
fn merged_spans(header: &Header, wanted: &[bool]) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for (e, _) in header.entries().iter().zip(wanted).filter(|(_, &w)| w) {
        let r = header.file_range(e);
        match spans.last_mut() {
            Some(last) if r.start <= last.1 + MERGE_GAP => last.1 = last.1.max(r.end),
            _ => spans.push((r.start, r.end)),
        }
    }
    spans
}

fn index_of(header: &Header, name: &str, path: &Path) -> Result<usize> {
    header.position(name).ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            format!("no tensor `{name}` in the checkpoint"),
        )
        .with_path(path)
    })
}

/// Reads the file ranges `spans` (sorted, disjoint) into one arena, each placed so that its
/// aligned-down start sits on an aligned arena offset, and keeps the entries `keep` accepts.
fn read_spans(
    file: &dyn BackendFile,
    path: &Path,
    header: Header,
    spans: Vec<(u64, u64)>,
    keep: impl Fn(usize) -> bool,
) -> Result<Checkpoint> {
    // (file start aligned down, file end, arena offset)
    let mut placed = Vec::with_capacity(spans.len());
    let mut arena_len = 0u64;
    for &(start, end) in &spans {
        let from = align_down(start, ALIGN);
        placed.push((from, end, arena_len));
        arena_len = (arena_len + (end - from)).div_ceil(ALIGN) * ALIGN;
    }
    let arena_len = usize::try_from(arena_len).map_err(|_| {
        Error::new(
            ErrorKind::OutOfMemory,
            "the checkpoint does not fit in memory",
        )
        .with_path(path)
    })?;
    let mut arena = Arena::new(arena_len).map_err(|e| e.with_path(path))?;
    {
        let mut pieces = Vec::with_capacity(placed.len());
        let mut rest: &mut [u8] = &mut arena;
        let mut at = 0u64;
        for &(from, end, arena_off) in &placed {
            let (_, tail) = rest.split_at_mut((arena_off - at) as usize);
            let (piece, tail) = tail.split_at_mut((end - from) as usize);
            pieces.push((from, piece));
            rest = tail;
            at = arena_off + (end - from);
        }
        // Windows of the spans, each faulted in and then read by one of a few workers: the
        // page faults of fresh memory (about 1 s of CPU per GiB) overlap other windows' I/O
        // instead of stalling the reads.
        let windows: Vec<(u64, &mut [u8])> = pieces
            .into_iter()
            .flat_map(|(from, piece)| {
                piece
                    .chunks_mut(READ_WINDOW)
                    .enumerate()
                    .map(move |(i, w)| (from + (i * READ_WINDOW) as u64, w))
            })
            .collect();
        let job = JobShape {
            bytes: windows.iter().map(|(_, w)| w.len() as u64).sum(),
            requests: windows.len(),
            largest: windows
                .iter()
                .map(|(_, w)| w.len() as u64)
                .max()
                .unwrap_or(0),
            in_flight: IO_THREADS as u32,
            memory: MemoryKind::Host,
            fresh: true,
            first_offset: windows.first().map_or(0, |(at, _)| *at),
        };
        let job_file = file.begin_read_job(&job);
        let file: &dyn BackendFile = job_file.as_deref().unwrap_or(file);
        parallel::for_each(windows, IO_THREADS, |(from, window)| {
            super::arena::fault_in(window);
            let want = window.len();
            let got = file.read_at(from, MemMut::Host(window))?;
            if got < want {
                return Err(truncated(path, from + got as u64));
            }
            Ok(())
        })?;
    }
    let data_start = header.data_start();
    let (all, metadata) = header.into_parts();
    let mut entries = Vec::new();
    let mut span = 0;
    for (i, e) in all.into_iter().enumerate() {
        if !keep(i) {
            continue;
        }
        let r = data_start + e.offsets.start..data_start + e.offsets.end;
        // Kept tensors come in file order, as the spans do.
        while !(placed[span].0 <= r.start && r.end <= placed[span].1) {
            span += 1;
        }
        let (from, _, arena_off) = placed[span];
        let start = (arena_off + r.start - from) as usize;
        entries.push((e.desc, start..start + (r.end - r.start) as usize));
    }
    Checkpoint::from_parts(path, arena, entries, metadata)
}

/// Loads tensors straight into the caller's buffers: each `(name, destination)` pair is
/// filled with that tensor's bytes; see [`CheckpointFile::read_into`]. Returns the file's
/// header. A file replaced (renamed over) during the load is opened and read again, every
/// destination filled anew from the new version (up to 3 tries); when it keeps changing
/// the error is [`ErrorKind::Changed`] and the destinations' contents are unspecified.
pub fn load_into<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    mut targets: Vec<(&str, MemMut<'_>)>,
) -> Result<Header> {
    retry_changed(|| {
        let ckpt = open_once(opener, path)?;
        ckpt.fill(&mut targets)?;
        Ok(ckpt.header)
    })
}

/// A safetensors file opened once: its validated header, and reads of its tensors through
/// the same open file, as many as the caller wants (what `safe_open` is in Python).
pub struct CheckpointFile {
    path: PathBuf,
    file: Box<dyn BackendFile>,
    header: Header,
    /// Set by [`verifying`](CheckpointFile::verifying): whole-tensor reads are checked.
    pub(super) checksums: Option<super::checksum::Checksums>,
}

impl std::fmt::Debug for CheckpointFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointFile")
            .field("path", &self.path)
            .field("tensors", &self.header.entries().len())
            .finish()
    }
}

/// Opens the safetensors file at `path` and validates its header; nothing else is read. A
/// file replaced (renamed over) while it is opened is opened again (up to 3 tries); one
/// replaced later makes reads that would reach the new file fail with
/// [`ErrorKind::Changed`] (the header read belongs to the file first opened).
pub fn open<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<CheckpointFile> {
    retry_changed(|| open_once(opener, path))
}

fn open_once<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<CheckpointFile> {
    let file = opener.open_file(path, OpenMode::Read)?;
    let header = read_header(&*file, path)?;
    Ok(CheckpointFile {
        path: path.to_path_buf(),
        file,
        header,
        checksums: None,
    })
}

impl CheckpointFile {
    /// The file's validated header: every tensor's descriptor and place, and the metadata.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The path the file was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fills each `(name, destination)` pair with that tensor's bytes. Destinations may be
    /// host or device memory (when the backend takes device memory); each must be exactly
    /// the tensor's byte length, else [`ErrorKind::InvalidInput`]; a name the file lacks is
    /// [`ErrorKind::NotFound`]. Nothing is read before every target is checked. Requests go
    /// out in file order, several in flight; small host tensors next to each other are read
    /// together through a staging buffer. A read that would reach another file than the one
    /// opened (one renamed over the path since) fails with [`ErrorKind::Changed`]: bytes of
    /// two versions are never mixed.
    pub fn read_into(&self, mut targets: Vec<(&str, MemMut<'_>)>) -> Result<()> {
        self.fill(&mut targets)
    }

    /// [`read_into`](Self::read_into) with the targets borrowed, so that a retried load can
    /// fill them again.
    fn fill(&self, targets: &mut [(&str, MemMut<'_>)]) -> Result<()> {
        self.execute(self.requests(targets)?)
    }

    /// Reads each request's file range into its destination (`reqs` sorted by offset).
    pub(super) fn execute(&self, reqs: Vec<Request<'_>>) -> Result<()> {
        let path = self.path.as_path();
        let job = super::plan::job_of(&reqs, false);
        let job_file = job.and_then(|j| self.file.begin_read_job(&j));
        let file: &dyn BackendFile = job_file.as_deref().unwrap_or(&*self.file);
        let jobs = plan_reads(reqs);
        parallel::for_each(jobs, IO_THREADS, |job| match job {
            ReadJob::Single((r, mut dst)) => {
                let got = file.read_at(r.start, dst.reborrow())?;
                if got as u64 != r.end - r.start {
                    return Err(truncated(path, r.start + got as u64));
                }
                match &self.checksums {
                    Some(sums) => sums.check_dst(path, &r, &dst),
                    None => Ok(()),
                }
            }
            ReadJob::Staged(group) => group.read(
                file,
                |at| truncated(path, at),
                |r, bytes| match &self.checksums {
                    Some(sums) => sums.check(path, r, bytes),
                    None => Ok(()),
                },
            ),
        })
    }

    /// The file range and destination of each target, in file order; every length checked.
    fn requests<'t>(&self, targets: &'t mut [(&str, MemMut<'_>)]) -> Result<Vec<Request<'t>>> {
        let (header, path) = (&self.header, self.path.as_path());
        let mut reqs: Vec<Request<'t>> = Vec::with_capacity(targets.len());
        for (name, dst) in targets.iter_mut() {
            let e: &HeaderEntry = header.get(name).ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!("no tensor `{name}` in the checkpoint"),
                )
                .with_path(path)
            })?;
            if dst.len() as u64 != e.byte_len() {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "tensor `{name}` is {} bytes but its destination holds {}",
                        e.byte_len(),
                        dst.len()
                    ),
                )
                .with_path(path));
            }
            reqs.push((header.file_range(e), dst.reborrow()));
        }
        reqs.sort_by_key(|(r, _)| r.start);
        Ok(reqs)
    }
}
