//! Loads: the whole data section into one aligned arena, a selection of tensors (only the
//! ranges needed, neighbours merged), or the caller's own buffers.

use super::header::validate;
use super::header::{
    check_header_len, header_len_of, lookup, parse_header, parse_header_from, Header,
    PARSE_WHOLE_MAX,
};
use super::into_arena::{load_chosen, named};
use super::mapped::{PendingPages, WithoutLease};
use super::save::{TensorView, Tensors};
use super::source::CheckpointSource;
use super::{Arena, FileOpener};
use crate::core::policy::{plan_new_load, NewLoads};
use crate::{BackendFile, Error, ErrorKind, HostBuffer, MemMut, MemRef, Result, TensorDesc};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The first read of a file: enough for most headers.
const FIRST_READ: u64 = 64 << 10;

/// Selected tensors closer than this are read in one request, gap included.
const MERGE_GAP: u64 = 1 << 20;

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

/// Tries of one load whose file is replaced (renamed over) while it is read: the one
/// retry of fastensor (the Python package adds none).
pub const LOAD_ATTEMPTS: usize = 5;

/// Runs `attempt` (a whole load: open the path, read the header, read the data) again
/// while it fails with [`ErrorKind::Changed`] (the file was replaced by another while it was
/// read), at most [`LOAD_ATTEMPTS`] times in all; each try reads one version of the file,
/// and a failed try's bytes are never returned. The last error is returned as it is.
pub(crate) fn retry_changed<T>(mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut tries = 1;
    loop {
        match attempt() {
            Err(e) if e.kind() == ErrorKind::Changed && tries < LOAD_ATTEMPTS => tries += 1,
            done => return done,
        }
    }
}

/// Loads every tensor of the safetensors file at `path`.
///
/// One decision for the whole load: where the opener maps new loads
/// ([`plan_new_load`] of its [facts](FileOpener::new_load_facts), the engine's default) the file is mapped copy-on-write
/// under a read lease and its pages brought in by several threads: the tensors share the
/// page cache's pages, and another program that opens the file for writing or truncates it
/// waits until they are moved into memory of this process (see [`Arena`]). Otherwise,
/// where the file system cannot map the file, or where no lease can be had (unless the
/// opener [maps those unprotected](crate::core::policy::NewLoadFacts::unprotected_maps)), the data section
/// is read into one page-aligned arena of its own. When the data
/// section is not aligned in the file (files written by other tools), the arena is offset so
/// that file and memory alignments still match and direct I/O still copies nothing. A file
/// replaced (renamed over) during the load is loaded again, whole (at most
/// [`LOAD_ATTEMPTS`] tries); when it keeps changing the error is [`ErrorKind::Changed`].
pub fn load<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<Checkpoint> {
    planned(opener, |placement, without| {
        load_as(opener, path, None, false, placement, without)
    })
}

/// [`load`] with its placement given rather than asked of the opener (`fastensor tune`
/// measures both).
pub(crate) fn load_placed<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    placement: NewLoads,
) -> Result<Checkpoint> {
    let unprotected = opener.new_load_facts().unprotected_maps;
    let (done, _) = placed(placement, unprotected, |placement, without| {
        load_as(opener, path, None, false, placement, without)
    });
    done
}

/// A load of a whole checkpoint into new host memory: `load` (one try, placed as its
/// argument says) run as [`plan_new_load`] plans it from the opener's facts, and the
/// placement it ended with noted to the opener, once.
fn planned<O: FileOpener + ?Sized, T>(
    opener: &O,
    load: impl Fn(NewLoads, WithoutLease) -> Result<T>,
) -> Result<T> {
    let facts = opener.new_load_facts();
    let (done, placement) = placed(plan_new_load(&facts), facts.unprotected_maps, load);
    opener.note_new_load(placement);
    done
}

/// `load` tried as `placement` (each placement's tries through [`retry_changed`]); a
/// mapping refused ([`ErrorKind::Unsupported`]: a file system that cannot map the file, no
/// read lease where `unprotected` maps are not allowed) is read instead. Returns the
/// outcome and the placement it ended with.
fn placed<T>(
    placement: NewLoads,
    unprotected: bool,
    load: impl Fn(NewLoads, WithoutLease) -> Result<T>,
) -> (Result<T>, NewLoads) {
    let without = WithoutLease::when(unprotected);
    if placement == NewLoads::Mapped {
        match retry_changed(|| load(NewLoads::Mapped, without)) {
            Err(e) if e.kind() == ErrorKind::Unsupported => {}
            done => return (done, NewLoads::Mapped),
        }
    }
    (
        retry_changed(|| load(NewLoads::Read, without)),
        NewLoads::Read,
    )
}

/// One try of a load into new host memory of every tensor (`names`: `None`) or those
/// named, checked against their checksums where `verify`, placed as `placement` says.
fn load_as<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    names: Option<&[&str]>,
    verify: bool,
    placement: NewLoads,
    without: WithoutLease,
) -> Result<Checkpoint> {
    if placement == NewLoads::Mapped {
        return match names {
            None => super::mapped::load(path, &|_, _| true, verify, without),
            Some(names) => super::mapped::load_named(path, names, verify, without),
        };
    }
    let source = CheckpointSource::single(opener, path)?;
    let chosen = match names {
        None => source.tensors(),
        Some(names) => named(&source, names)?,
    };
    let ckpt = load_chosen(&source, &chosen, MERGE_GAP)?;
    if verify {
        super::checksum::check_loaded(&ckpt)?;
    }
    Ok(ckpt)
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
    let wanted: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    planned(opener, |placement, without| {
        load_as(opener, path, Some(&wanted), false, placement, without)
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
    planned(opener, |placement, without| {
        load_as(opener, path, names, true, placement, without)
    })
}

/// [`load`] (or [`load_selected`] of `names`) that returns as soon as the file is mapped,
/// before the pages of its tensors are in memory: they come in when the caller calls
/// [`PendingPages::bring_in`], on a thread of its choosing, while the checkpoint is
/// already in use (its tensors handed to code that builds a model around them, say). Where
/// the opener does not map new loads, or the file cannot be mapped, this is the whole load
/// and nothing is pending.
///
/// A file replaced while it is opened is opened again, as [`load`] does. Reading a tensor
/// before `bring_in` returns is correct but slower (its pages fault in on first use). The
/// lease guards every page of the tensors, brought in or not: a writer of the file waits
/// until they are all in memory of this process. Mapped unprotected
/// ([`NewLoadFacts::unprotected_maps`](crate::core::policy::NewLoadFacts::unprotected_maps)), a file that shrinks before its pages are in makes
/// `bring_in` fail with [`ErrorKind::Changed`] (load it again), and a page cut from the
/// file raises `SIGBUS` in a reader.
pub fn load_later<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    names: Option<&[&str]>,
) -> Result<(Checkpoint, Option<PendingPages>)> {
    planned(opener, |placement, without| match placement {
        NewLoads::Mapped => super::mapped::load_later_named(path, names, without)
            .map(|(ckpt, pending)| (ckpt, Some(pending))),
        NewLoads::Read => {
            load_as(opener, path, names, false, placement, without).map(|ckpt| (ckpt, None))
        }
    })
}

/// Loads tensors straight into the caller's buffers: each `(name, destination)` pair is
/// filled with that tensor's bytes; see [`CheckpointFile::read_into`]. Returns the file's
/// header. A file replaced (renamed over) during the load is opened and read again, every
/// destination filled anew from the new version (at most [`LOAD_ATTEMPTS`] tries); when it
/// keeps changing the error is [`ErrorKind::Changed`] and the destinations' contents are
/// unspecified.
pub fn load_into<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    mut targets: Vec<(&str, MemMut<'_>)>,
) -> Result<Header> {
    let source =
        CheckpointSource::fill_anew(|| CheckpointSource::single(opener, path), &mut targets)?;
    let (mut files, _) = source.into_parts();
    Ok(files
        .swap_remove(0)
        .header
        .expect("a checkpoint file has a header"))
}

/// A safetensors file opened once: its validated header, and reads of its tensors through
/// the same open file, as many as the caller wants (what `safe_open` is in Python). A
/// [`CheckpointSource`] of one file.
#[derive(Debug)]
pub struct CheckpointFile(CheckpointSource);

/// Opens the safetensors file at `path` and validates its header; nothing else is read. A
/// file replaced (renamed over) while it is opened is opened again (at most
/// [`LOAD_ATTEMPTS`] tries); one replaced later makes reads that would reach the new file
/// fail with [`ErrorKind::Changed`] (the header read belongs to the file first opened).
pub fn open<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<CheckpointFile> {
    retry_changed(|| CheckpointSource::single(opener, path).map(CheckpointFile))
}

impl CheckpointFile {
    /// The file's validated header: every tensor's descriptor and place, and the metadata.
    pub fn header(&self) -> &Header {
        self.0.files()[0].header()
    }

    /// The path the file was opened at.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// The file as a [`CheckpointSource`].
    pub fn source(&self) -> &CheckpointSource {
        &self.0
    }

    /// Fills each `(name, destination)` pair with that tensor's bytes: see
    /// [`CheckpointSource::read_into`] (one file: the requests go out in file order,
    /// several in flight).
    pub fn read_into(&self, targets: Vec<(&str, MemMut<'_>)>) -> Result<()> {
        self.0.read_into(targets)
    }

    /// This file, its reads verified from now on: every tensor read whole by
    /// [`read_into`](Self::read_into) is checked against the checksum its header stores,
    /// on the I/O thread, right after its bytes arrive; a mismatch is
    /// [`ErrorKind::Corrupt`] naming the file and the tensor. Errors as
    /// [`Checksums::from_header`](super::Checksums::from_header).
    pub fn verifying(self) -> Result<CheckpointFile> {
        self.0.verifying().map(CheckpointFile)
    }
}
