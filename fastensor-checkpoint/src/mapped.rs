//! Loads into new host memory by mapping the checkpoint file copy-on-write: the device
//! fills page-cache pages that the tensors then use as they are (no zeroing of fresh memory,
//! no copy), brought in by several threads at once before the load returns.
//!
//! The file is mapped under a read lease taken right after it is opened
//! ([`fastensor_sys::lease`]): another program that opens it for writing or truncates it
//! waits until the loaded tensors' pages are moved into memory of this process, so they
//! keep their bytes whatever is done to the file. Where no lease can be had, the load reads
//! the file instead, or maps it unprotected where the caller chose that ([`WithoutLease`]).

use super::header::read_header_with;
use super::header::Header;
use super::loaded::Checkpoint;
use super::sums::Checksums;
use super::{Arena, IO_THREADS};
use crate::{Error, ErrorKind, Result};
use fastensor_core::align::align_down;
use fastensor_core::parallel;
use fastensor_sys::filemap::FileMap;
use fastensor_sys::lease;
use std::ops::Range;
use std::path::Path;
use std::sync::Mutex;

/// Bytes one worker brings in at a time.
const WINDOW: u64 = 16 << 20;

/// What a mapped load does where it cannot have a read lease on its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WithoutLease {
    /// Fails with [`ErrorKind::Unsupported`], naming the refusal: the caller reads the
    /// file into memory of its own instead.
    Read,
    /// Maps the file unprotected (see [`crate::Placement::Unprotected`]).
    Map,
}

impl WithoutLease {
    /// `Map` where the opener allows unprotected maps
    /// ([`NewLoadFacts::unprotected_maps`](fastensor_core::policy::NewLoadFacts::unprotected_maps)).
    pub(crate) fn when(unprotected_maps: bool) -> WithoutLease {
        if unprotected_maps {
            WithoutLease::Map
        } else {
            WithoutLease::Read
        }
    }
}

/// Maps the whole file at `path` (opened once: header and bytes come from the same file,
/// whatever is renamed over the path meanwhile) and brings in the file ranges of the
/// entries `keep` accepts, several windows at once; the checkpoint holds those entries.
/// A file that shrinks during the load is [`ErrorKind::Changed`]. With `verify`, every kept
/// tensor is checked against the checksum the header stores (see [`Checksums`]), each
/// window's share computed by the thread that brought it in, from a copy the kernel makes
/// (so that a page cut from the file is an error there too).
pub(crate) fn load(
    path: &Path,
    keep: &dyn Fn(&Header, usize) -> bool,
    verify: bool,
    without: WithoutLease,
) -> Result<Checkpoint> {
    let mapped = map(path, keep, without)?;
    let sums = if verify {
        Some(Checksums::from_header(&mapped.header, path)?)
    } else {
        None
    };
    let base = mapped.map.as_ptr() as usize;
    let spans = merged(&mapped.ranges);
    let pieces = bring_in(base, &spans, &mapped.ranges, sums.is_some(), path)?;
    if let Some(sums) = &sums {
        check(sums, &mapped.ranges, pieces, path)?;
    }
    mapped.into_checkpoint(path)
}

/// [`load`] without bringing the pages in: the checkpoint is returned as soon as the file
/// is mapped, with the [`PendingPages`] that bring its tensors' pages in.
pub(crate) fn load_later(
    path: &Path,
    keep: &dyn Fn(&Header, usize) -> bool,
    without: WithoutLease,
) -> Result<(Checkpoint, PendingPages)> {
    let mapped = map(path, keep, without)?;
    let pending = PendingPages {
        spans: merged(&mapped.ranges),
        base: mapped.map.as_ptr() as usize,
        path: path.to_path_buf(),
    };
    Ok((mapped.into_checkpoint(path)?, pending))
}

/// The pages of a mapped checkpoint's tensors still to be brought into memory (see
/// [`super::load_later`]).
#[derive(Debug)]
pub struct PendingPages {
    /// File ranges (= offsets in the mapping) to bring in, in file order.
    spans: Vec<Range<u64>>,
    /// Where the mapping they belong to starts.
    base: usize,
    path: std::path::PathBuf,
}

impl PendingPages {
    /// Brings the pages in as a load does before it returns: read into the page cache and
    /// mapped by the I/O threads, several windows at once. `arena` is the arena of the
    /// checkpoint these pages came with (another is [`ErrorKind::InvalidInput`]); borrowing
    /// it keeps the mapping alive for the call. The arena's memory may be read and written
    /// meanwhile: this process never reads it directly, the kernel does. A file that shrank
    /// under the mapping is [`ErrorKind::Changed`]; a device error is an I/O error, both
    /// naming the file and the offset.
    pub fn bring_in(self, arena: &Arena) -> Result<()> {
        if arena.base_ptr() as usize != self.base {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "these pages belong to another checkpoint's mapping",
            )
            .with_path(&self.path));
        }
        bring_in(self.base, &self.spans, &[], false, &self.path).map(drop)
    }

    /// Bytes left to bring in.
    pub fn bytes(&self) -> u64 {
        self.spans.iter().map(|r| r.end - r.start).sum()
    }
}

/// A file mapped whole, its header, and the entries kept (indices and file ranges).
struct Mapped {
    map: FileMap,
    header: Header,
    kept: Vec<usize>,
    ranges: Vec<Range<u64>>,
}

/// Opens the file at `path`, takes a read lease on it, reads its header, picks the entries
/// `keep` accepts and maps the file, the pages of those entries guarded by the lease; no
/// data page is brought in. (A place that cannot be mapped is not asked here: see
/// `load::mappable`.)
/// Without a lease, `without` says what to do. A lease broken
/// before the mapping was guarded (the file may have changed since its header was read) is
/// [`ErrorKind::Changed`].
fn map(
    path: &Path,
    keep: &dyn Fn(&Header, usize) -> bool,
    without: WithoutLease,
) -> Result<Mapped> {
    let file = fastensor_sys::atomic::open_regular(path)?;
    let lease = match lease::take(&file) {
        Ok(lease) => Some(lease),
        Err(_) if without == WithoutLease::Map => None,
        Err(refused) => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{refused}: the file is read instead of mapped"),
            )
            .with_path(path))
        }
    };
    let file_len = file
        .metadata()
        .map_err(|e| Error::io(e, "cannot stat").with_path(path))?
        .len();
    let read_at = |at: u64, buf: &mut [u8]| {
        fastensor_sys::pread_full(&file, buf, at)
            .map_err(|e| Error::io(e, "cannot read").with_path(path))
    };
    let header = read_header_with(file_len, &read_at, path)?;
    let len = usize::try_from(header.file_len()).map_err(|_| {
        Error::new(ErrorKind::OutOfMemory, "the file does not fit in memory").with_path(path)
    })?;
    let kept: Vec<usize> = (0..header.entries().len())
        .filter(|&i| keep(&header, i))
        .collect();
    let ranges: Vec<Range<u64>> = kept
        .iter()
        .map(|&i| header.file_range(&header.entries()[i]))
        .collect();
    // A break must move the guarded memory before the kernel lets the writer go: what
    // cannot be moved in time is read instead (once mapping it did not fail first, which
    // names the tensor that does not fit).
    let too_slow = match (&lease, without) {
        (Some(lease), WithoutLease::Read) => {
            let bytes: u64 = merged(&ranges).iter().map(|r| r.end - r.start).sum();
            lease.in_time(bytes).err()
        }
        _ => None,
    };
    // What a file changed in place does to the mapping: see `Arena`.
    let failed = |e| map_failed(e, &header).with_path(path);
    let map = match lease {
        Some(lease) => FileMap::leased(&file, len, lease, &merged(&ranges))
            .map_err(failed)?
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Changed,
                    "the file was opened for writing while it was mapped",
                )
                .with_path(path)
            })?,
        None => FileMap::unprotected(&file, len).map_err(failed)?,
    };
    if let Some(too_slow) = too_slow {
        drop(map); // and its lease
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("{too_slow}: the file is read instead of mapped"),
        )
        .with_path(path));
    }
    Ok(Mapped {
        map,
        header,
        kept,
        ranges,
    })
}

impl Mapped {
    /// The checkpoint of the kept entries over the mapping.
    fn into_checkpoint(self, path: &Path) -> Result<Checkpoint> {
        let (all, metadata) = self.header.into_parts();
        let mut entries = Vec::with_capacity(self.kept.len());
        let mut all = all.into_iter().enumerate();
        for (i, r) in self.kept.into_iter().zip(self.ranges) {
            let (_, e) = all
                .find(|(j, _)| *j == i)
                .expect("kept entries are in file order");
            entries.push((e.desc, r.start as usize..r.end as usize));
        }
        Checkpoint::from_parts(path, Arena::mapped(self.map), entries, metadata)
    }
}

/// A mapped load of the tensors `names` of `path` ([`load`] of those); a name the file
/// lacks is [`ErrorKind::NotFound`].
pub(crate) fn load_named(
    path: &Path,
    names: &[&str],
    verify: bool,
    without: WithoutLease,
) -> Result<Checkpoint> {
    let wanted = Wanted::new(names);
    let ckpt = load(path, &|h, i| wanted.keeps(h, i), verify, without)?;
    wanted.all_found(ckpt, path)
}

/// [`load_later`] of every tensor, or of `names` (a name the file lacks is
/// [`ErrorKind::NotFound`]).
pub(crate) fn load_later_named(
    path: &Path,
    names: Option<&[&str]>,
    without: WithoutLease,
) -> Result<(Checkpoint, PendingPages)> {
    let Some(names) = names else {
        return load_later(path, &|_, _| true, without);
    };
    let wanted = Wanted::new(names);
    let (ckpt, pending) = load_later(path, &|h, i| wanted.keeps(h, i), without)?;
    Ok((wanted.all_found(ckpt, path)?, pending))
}

/// The tensors a load by name keeps.
struct Wanted<'a> {
    names: &'a [&'a str],
    /// Per header entry, whether it is named (worked out at the first entry).
    kept: std::cell::OnceCell<Vec<bool>>,
}

impl<'a> Wanted<'a> {
    fn new(names: &'a [&'a str]) -> Self {
        Wanted {
            names,
            kept: std::cell::OnceCell::new(),
        }
    }

    fn keeps(&self, header: &Header, i: usize) -> bool {
        self.kept.get_or_init(|| {
            let mut w = vec![false; header.entries().len()];
            for name in self.names {
                if let Some(j) = header.position(name) {
                    w[j] = true;
                }
            }
            w
        })[i]
    }

    /// `ckpt`, or [`ErrorKind::NotFound`] for the first name it lacks.
    fn all_found(&self, ckpt: Checkpoint, path: &Path) -> Result<Checkpoint> {
        match self.names.iter().find(|n| ckpt.tensor(n).is_none()) {
            Some(n) => Err(Error::new(
                ErrorKind::NotFound,
                format!("no tensor `{n}` in the checkpoint"),
            )
            .with_path(path)),
            None => Ok(ckpt),
        }
    }
}

/// Why the file could not be mapped: out of memory (the mapping is charged as memory that
/// may be written) names the size and the largest tensor; anything else is
/// [`ErrorKind::Unsupported`] (the load then reads the file instead).
fn map_failed(e: std::io::Error, header: &Header) -> Error {
    if e.raw_os_error() != Some(rustix::io::Errno::NOMEM.raw_os_error()) {
        // A file system that cannot map files: the load reads the file instead.
        return Error::new(ErrorKind::Unsupported, "the file cannot be mapped").with_source(e);
    }
    let largest = header.entries().iter().max_by_key(|e| e.byte_len());
    let what = largest.map_or(String::new(), |e| {
        format!(
            " (the largest tensor, `{}`, is {} bytes)",
            e.desc.name,
            e.byte_len()
        )
    });
    Error::new(
        ErrorKind::OutOfMemory,
        format!(
            "the checkpoint's {} bytes do not fit in memory{what}",
            header.file_len()
        ),
    )
    .with_source(e)
}

/// `ranges` (in file order) with neighbours less than a window apart joined.
fn merged(ranges: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for r in ranges.iter().filter(|r| !r.is_empty()) {
        match out.last_mut() {
            Some(last) if r.start <= last.end + WINDOW => last.end = last.end.max(r.end),
            _ => out.push(r.clone()),
        }
    }
    out
}

/// The CRC-32C of `len` bytes of tensor `tensor` from `offset` within it, computed by the
/// thread that brought them in.
struct Piece {
    tensor: usize,
    offset: u64,
    len: u64,
    crc: u32,
}

/// Bytes copied out at a time for a checksum.
const COPY_CHUNK: usize = 1 << 20;

/// Brings the pages of `spans` of the mapping at `base` into memory, [`WINDOW`] bytes per job on
/// [`IO_THREADS`] threads: each window is read into the page cache and mapped
/// (`MADV_POPULATE_READ`), then touched from the same thread; with `checksums`, touched by
/// copying the bytes of the `tensors` (file ranges, in file order) it holds and hashing
/// them, one [`Piece`] per tensor and window.
fn bring_in(
    base: usize,
    spans: &[Range<u64>],
    tensors: &[Range<u64>],
    checksums: bool,
    path: &Path,
) -> Result<Vec<Piece>> {
    let windows: Vec<(usize, usize)> = spans
        .iter()
        .flat_map(|r| {
            let start = align_down(r.start, 4096);
            (start..r.end)
                .step_by(WINDOW as usize)
                .map(move |at| (at as usize, (r.end - at).min(WINDOW) as usize))
        })
        .collect();
    let pieces = Mutex::new(Vec::new());
    parallel::for_each(windows, IO_THREADS, |(at, n)| {
        // Only the kernel reads the mapping (the caller may be using it meanwhile).
        let mem = (base + at) as *const u8;
        let failed = |e: std::io::Error| {
            let err = if e.raw_os_error() == Some(libc_efault()) {
                Error::new(ErrorKind::Changed, "the file shrank while it was loaded")
            } else {
                Error::io(e, "cannot read the file into its mapping")
            };
            err.with_path(path).with_offset(at as u64)
        };
        match fastensor_sys::populate::populate_read(mem, n) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
            Err(e) => return Err(failed(e)),
        }
        if !checksums {
            return fastensor_sys::populate::touch(mem, n).map_err(failed);
        }
        let window = at as u64..(at + n) as u64;
        let mut mine = Vec::new();
        let mut scratch = vec![0u8; COPY_CHUNK.min(n)];
        let first = tensors.partition_point(|t| t.end <= window.start);
        for (i, t) in tensors.iter().enumerate().skip(first) {
            if t.start >= window.end {
                break;
            }
            let (from, to) = (t.start.max(window.start), t.end.min(window.end));
            let mut crc = 0u32;
            let mut pos = from;
            while pos < to {
                let len = ((to - pos) as usize).min(scratch.len());
                let src = (base + pos as usize) as *const u8;
                fastensor_sys::populate::copy_out(src, &mut scratch[..len]).map_err(failed)?;
                crc = crc32c::crc32c_append(crc, &scratch[..len]);
                pos += len as u64;
            }
            mine.push(Piece {
                tensor: i,
                offset: from - t.start,
                len: to - from,
                crc,
            });
        }
        pieces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(mine);
        Ok(())
    })?;
    Ok(pieces.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// Checks each tensor's pieces, joined in order, against its stored checksum.
fn check(
    sums: &Checksums,
    tensors: &[Range<u64>],
    mut pieces: Vec<Piece>,
    path: &Path,
) -> Result<()> {
    pieces.sort_unstable_by_key(|p| (p.tensor, p.offset));
    let mut pieces = pieces.into_iter().peekable();
    for (i, t) in tensors.iter().enumerate() {
        let (mut crc, mut covered) = (0u32, 0u64);
        while let Some(p) = pieces.next_if(|p| p.tensor == i) {
            crc = crc32c::crc32c_combine(crc, p.crc, p.len as usize);
            covered += p.len;
        }
        let Some((name, want)) = sums.at(t) else {
            continue; // an empty tensor: nothing to check
        };
        if covered != t.end - t.start || crc != want {
            return Err(Checksums::mismatch(path, name, want, crc, t.start));
        }
    }
    Ok(())
}

/// `EFAULT`: a page of the range could not be brought in (past the end of the file).
fn libc_efault() -> i32 {
    rustix::io::Errno::FAULT.raw_os_error()
}
