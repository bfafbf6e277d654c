//! Loads: the whole data section into one aligned arena, a selection of tensors (only the
//! ranges needed, neighbours merged), or the caller's own buffers.

use super::header::Header;
use super::into_arena::{load_chosen, named};
use super::loaded::Checkpoint;
use super::mapped::{PendingPages, WithoutLease};
use super::retry::retry_changed;
use super::source::CheckpointSource;
use super::FileOpener;
use crate::{Error, ErrorKind, MemMut, Result};
use fastensor_core::policy::{plan_new_load, NewLoads};
use std::path::Path;

/// Selected tensors closer than this are read in one request, gap included.
const MERGE_GAP: u64 = 1 << 20;

/// Loads every tensor of the safetensors file at `path`.
///
/// One decision for the whole load: where the opener maps new loads
/// ([`plan_new_load`] of its [facts](FileOpener::new_load_facts), the engine's default) the file is mapped copy-on-write
/// under a read lease and its pages brought in by several threads: the tensors share the
/// page cache's pages, and another program that opens the file for writing or truncates it
/// waits until they are moved into memory of this process (see [`Arena`](super::Arena)). Otherwise,
/// where the file system cannot map the file, or where no lease can be had (unless the
/// opener [maps those unprotected](fastensor_core::policy::NewLoadFacts::unprotected_maps)), the data section
/// is read into one page-aligned arena of its own. When the data
/// section is not aligned in the file (files written by other tools), the arena is offset so
/// that file and memory alignments still match and direct I/O still copies nothing. A file
/// replaced (renamed over) during the load is loaded again, whole (at most
/// [`LOAD_ATTEMPTS`](super::LOAD_ATTEMPTS) tries); when it keeps changing the error is [`ErrorKind::Changed`].
pub fn load<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<Checkpoint> {
    planned(opener, |placement, without| {
        load_as(opener, path, None, false, placement, without)
    })
}

/// [`load`] with its placement given rather than asked of the opener (`fastensor tune`
/// measures both), and the placement it ended with (a mapping refused is read).
pub fn load_placed<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    placement: NewLoads,
) -> Result<(Checkpoint, NewLoads)> {
    let unprotected = opener.new_load_facts().unprotected_maps;
    let (done, ended) = placed(placement, unprotected, |placement, without| {
        load_as(opener, path, None, false, placement, without)
    });
    Ok((done?, ended))
}

/// A load into new host memory (all tensors or a selection): `load` (one try, placed as its
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

/// [`ErrorKind::Unsupported`] where the opener says `path`'s place cannot be mapped (an
/// object): the load reads it instead (see [`placed`]).
fn mappable<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> Result<()> {
    if opener.place(path).mappable {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Unsupported,
        "this file cannot be mapped: it is read instead",
    )
    .with_path(path))
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
    let local = super::source::readable(opener, path)?;
    let path = local.as_path();
    if placement == NewLoads::Mapped {
        mappable(opener, path)?;
        return match names {
            None => super::mapped::load(path, &|_, _| true, verify, without),
            Some(names) => super::mapped::load_named(path, names, verify, without),
        };
    }
    let source = CheckpointSource::single(opener, path)?;
    if verify {
        // Each tensor checked on the I/O thread right after its read, while its bytes are
        // in cache (no second pass over the checkpoint).
        return source.verifying()?.read_new(names);
    }
    let chosen = match names {
        None => source.tensors(),
        Some(names) => named(&source, names)?,
    };
    load_chosen(&source, &chosen, MERGE_GAP)
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
/// ([`NewLoadFacts::unprotected_maps`](fastensor_core::policy::NewLoadFacts::unprotected_maps)), a file that shrinks before its pages are in makes
/// `bring_in` fail with [`ErrorKind::Changed`] (load it again), and a page cut from the
/// file raises `SIGBUS` in a reader.
pub fn load_later<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    names: Option<&[&str]>,
) -> Result<(Checkpoint, Option<PendingPages>)> {
    planned(opener, |placement, without| match placement {
        NewLoads::Mapped => super::source::readable(opener, path)
            .and_then(|local| {
                mappable(opener, &local)?;
                super::mapped::load_later_named(&local, names, without)
            })
            .map(|(ckpt, pending)| (ckpt, Some(pending))),
        NewLoads::Read => {
            load_as(opener, path, names, false, placement, without).map(|ckpt| (ckpt, None))
        }
    })
}

/// Loads tensors straight into the caller's buffers: each `(name, destination)` pair is
/// filled with that tensor's bytes; see [`CheckpointFile::read_into`]. Returns the file's
/// header. A file replaced (renamed over) during the load is opened and read again, every
/// destination filled anew from the new version (at most [`LOAD_ATTEMPTS`](super::LOAD_ATTEMPTS) tries); when it
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
/// [`LOAD_ATTEMPTS`](super::LOAD_ATTEMPTS) tries); one replaced later makes reads that would reach the new file
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
