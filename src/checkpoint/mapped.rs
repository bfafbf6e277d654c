//! Loads into new host memory by mapping the checkpoint file copy-on-write: the device
//! fills page-cache pages that the tensors then use as they are (no zeroing of fresh memory,
//! no copy), brought in by several threads at once before the load returns.

use super::header::Header;
use super::load::{read_header, Checkpoint};
use super::{Arena, IO_THREADS};
use crate::core::align::align_down;
use crate::core::parallel;
use crate::{BackendFile, Error, ErrorKind, MemMut, MemRef, Result};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes one worker brings in at a time.
const WINDOW: u64 = 16 << 20;

/// Maps the whole file at `path` (opened once: header and bytes come from the same file,
/// whatever is renamed over the path meanwhile) and brings in the file ranges of the
/// entries `keep` accepts, several windows at once; the checkpoint holds those entries.
/// A file that shrinks during the load is [`ErrorKind::Changed`].
pub(crate) fn load(path: &Path, keep: &dyn Fn(&Header, usize) -> bool) -> Result<Checkpoint> {
    let file = PlainFile {
        file: crate::atomic::open_regular(path)?,
        path: path.to_path_buf(),
    };
    let header = read_header(&file, path)?;
    let len = usize::try_from(header.file_len()).map_err(|_| {
        Error::new(ErrorKind::OutOfMemory, "the file does not fit in memory").with_path(path)
    })?;
    // What a file changed in place does to the mapping: see `Arena`.
    let map = fastensor_sys::populate::map_private(&file.file, len)
        .map_err(|e| map_failed(e, &header).with_path(path))?;
    let kept: Vec<usize> = (0..header.entries().len())
        .filter(|&i| keep(&header, i))
        .collect();
    let ranges: Vec<Range<u64>> = kept
        .iter()
        .map(|&i| header.file_range(&header.entries()[i]))
        .collect();
    bring_in(&map, &merged(&ranges), path)?;
    let (all, metadata) = header.into_parts();
    let mut entries = Vec::with_capacity(kept.len());
    let mut all = all.into_iter().enumerate();
    for (i, r) in kept.into_iter().zip(ranges) {
        let (_, e) = all
            .find(|(j, _)| *j == i)
            .expect("kept entries are in file order");
        entries.push((e.desc, r.start as usize..r.end as usize));
    }
    Checkpoint::from_parts(path, Arena::mapped(map), entries, metadata)
}

/// Why the file could not be mapped: out of memory (the mapping is charged as memory that
/// may be written) names the size and the largest tensor.
fn map_failed(e: std::io::Error, header: &Header) -> Error {
    if e.raw_os_error() != Some(rustix::io::Errno::NOMEM.raw_os_error()) {
        return Error::io(e, "cannot map the file");
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

/// Brings the pages of `ranges` of the mapping into memory, [`WINDOW`] bytes per job on
/// [`IO_THREADS`] threads: each window is read into the page cache and mapped
/// (`MADV_POPULATE_READ`), then touched from the same thread.
fn bring_in(map: &memmap2::MmapMut, ranges: &[Range<u64>], path: &Path) -> Result<()> {
    let windows: Vec<(usize, usize)> = ranges
        .iter()
        .flat_map(|r| {
            let start = align_down(r.start, 4096);
            (start..r.end)
                .step_by(WINDOW as usize)
                .map(move |at| (at as usize, (r.end - at).min(WINDOW) as usize))
        })
        .collect();
    parallel::for_each(windows, IO_THREADS, |(at, n)| {
        let mem = &map[at..at + n];
        let failed = |e: std::io::Error| {
            let err = if e.raw_os_error() == Some(libc_efault()) {
                Error::new(ErrorKind::Changed, "the file shrank while it was loaded")
            } else {
                Error::io(e, "cannot read the file into its mapping")
            };
            err.with_path(path).with_offset(at as u64)
        };
        match fastensor_sys::populate::populate_read(mem) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
            Err(e) => return Err(failed(e)),
        }
        fastensor_sys::populate::touch(mem).map_err(failed)
    })
}

/// `EFAULT`: a page of the range could not be brought in (past the end of the file).
fn libc_efault() -> i32 {
    rustix::io::Errno::FAULT.raw_os_error()
}

/// The file the header is read from, as a [`BackendFile`] (reads only).
struct PlainFile {
    file: File,
    path: PathBuf,
}

impl std::fmt::Debug for PlainFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlainFile")
            .field("path", &self.path)
            .finish()
    }
}

impl BackendFile for PlainFile {
    fn path(&self) -> &Path {
        &self.path
    }
    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let MemMut::Host(buf) = dst else {
            return Err(Error::new(ErrorKind::Unsupported, "host memory only"));
        };
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(e, "cannot read").with_path(&self.path)),
            }
        }
        Ok(done)
    }
    fn write_at(&self, _offset: u64, _src: MemRef<'_>) -> Result<()> {
        Err(Error::new(ErrorKind::Unsupported, "opened for reading").with_path(&self.path))
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn len(&self) -> Result<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| Error::io(e, "cannot stat").with_path(&self.path))
    }
    fn set_len(&self, _len: u64) -> Result<()> {
        Err(Error::new(ErrorKind::Unsupported, "opened for reading").with_path(&self.path))
    }
}
