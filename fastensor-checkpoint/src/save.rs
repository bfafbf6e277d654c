//! Durable, atomic saves: the data section goes out in large aligned writes, in file order,
//! each split by the backend into requests in flight in parallel; straight from the caller's
//! buffers where they are aligned and through staging buffers where they are not (small
//! tensors are coalesced, never written one by one).

use super::checksum::{self, CHECKSUMS_KEY};
use super::header::{self, validate, DATA_ALIGN};
use super::view::{TensorView, Tensors};
use super::FileOpener;
use crate::{BackendFile, Error, ErrorKind, HostBuffer, MemRef, OpenMode, Result, TensorDesc};
use fastensor_core::Commit;
use fastensor_sys::atomic::AtomicFile;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::mpsc;

/// Bytes of the data section written by one job (a multiple of [`DATA_ALIGN`]).
const WINDOW: u64 = 16 << 20;

/// A piece of an aligned buffer at least this long is written in place, not staged.
const DIRECT_MIN: u64 = 256 << 10;

/// Saves `tensors` to `path` as a safetensors file; see [`save_with_metadata`].
pub fn save<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    tensors: &[TensorView<'_>],
) -> Result<()> {
    save_with_metadata(opener, path, tensors, &BTreeMap::new())
}

/// Saves `tensors` (in this order) and a `__metadata__` map to `path`.
///
/// The file is written through [`AtomicFile`]: after a crash `path` holds either the old
/// or the new checkpoint, whole, and after return the new one, durably; a target that is
/// not a regular file is refused, a symbolic link at `path` is replaced (never followed),
/// the mode (and owner, as root) of a regular file replaced is kept. On error nothing is left behind, and the error names
/// `path` (and says "no space left on device" when the disk is full). A descriptor whose
/// byte length differs from its data's, a duplicate name, or the name `__metadata__` is
/// [`ErrorKind::InvalidInput`]. Beyond the tensors' bytes, memory in use stays within a
/// few dozen bytes per tensor and a few MiB: the header is written as it is encoded.
pub fn save_with_metadata<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    tensors: &[TensorView<'_>],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    save_tensors(opener, path, &Views(tensors), metadata, false)
}

/// [`save_with_metadata`], and a checksum of every tensor (CRC-32C, computed while the data
/// is written) stored in the metadata under
/// [`CHECKSUMS_KEY`](super::checksum::CHECKSUMS_KEY) (replacing any there).
pub fn save_checked<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    tensors: &[TensorView<'_>],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    save_tensors(opener, path, &Views(tensors), metadata, true)
}

struct Views<'s, 'a>(&'s [TensorView<'a>]);

impl<'s: 'a, 'a> Tensors<'a> for Views<'s, 'a> {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn desc(&self, i: usize) -> &'a TensorDesc {
        &self.0[i].desc
    }
    fn data(&self, i: usize) -> MemRef<'a> {
        self.0[i].data
    }
}

/// Saves tensors whose bytes lie one after another in `data`, in the order of `descs` (the
/// layout of a safetensors data section), with a `__metadata__` map, like
/// [`save_with_metadata`]. `data` is written in large requests straight from memory where it
/// is aligned (a page-aligned buffer is, whole), never tensor by tensor. `data` must hold
/// exactly the tensors' bytes, else [`ErrorKind::InvalidInput`]. With `checksums`, as
/// [`save_checked`].
pub fn save_section<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    descs: &[TensorDesc],
    data: MemRef<'_>,
    metadata: &BTreeMap<String, String>,
    checksums: bool,
) -> Result<()> {
    let mut starts = Vec::with_capacity(descs.len() + 1);
    let mut at = 0u64;
    for d in descs {
        starts.push(at);
        at = at.saturating_add(d.byte_len().map_err(|e| e.with_path(path))?);
    }
    if at != data.len() as u64 {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "the data section holds {} bytes, its tensors {at}",
                data.len()
            ),
        )
        .with_path(path));
    }
    starts.push(at);
    save_tensors(
        opener,
        path,
        &Section {
            descs,
            starts,
            data,
        },
        metadata,
        checksums,
    )
}

/// Tensors laid out one after another in one buffer.
struct Section<'a> {
    descs: &'a [TensorDesc],
    /// Offset of each tensor in `data`, and the end.
    starts: Vec<u64>,
    data: MemRef<'a>,
}

impl<'a> Tensors<'a> for Section<'a> {
    fn count(&self) -> usize {
        self.descs.len()
    }
    fn desc(&self, i: usize) -> &'a TensorDesc {
        &self.descs[i]
    }
    fn data(&self, i: usize) -> MemRef<'a> {
        let (from, to) = (self.starts[i] as usize, self.starts[i + 1] as usize);
        self.data.slice(from, to - from)
    }
    fn section(&self) -> Option<MemRef<'a>> {
        Some(self.data)
    }
}

/// Saves `tensors` and `metadata` to `path` (see [`save_with_metadata`]).
pub(crate) fn save_tensors<'a, O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    tensors: &dyn Tensors<'a>,
    metadata: &BTreeMap<String, String>,
    checksums: bool,
) -> Result<()> {
    let laid = Laid {
        tensors,
        offsets: layout(tensors).map_err(|e| e.with_path(path))?,
    };
    let views: Vec<TensorView<'a>> = if checksums {
        (0..tensors.count())
            .map(|i| TensorView::new(tensors.desc(i).clone(), tensors.data(i)))
            .collect()
    } else {
        Vec::new()
    };
    // The header is laid out with a placeholder of the checksums' exact length (8 hex
    // digits a tensor) and written once they are known, after the data.
    let layout_metadata = if checksums {
        with_sums(
            metadata,
            &views.iter().map(|v| (v.desc.name.clone(), 0)).collect(),
        )
    } else {
        metadata.clone()
    };
    let layout_len = laid.json_len(&layout_metadata);
    let data_start = header::padded_len(layout_len);
    let total = data_start + laid.offsets.last().map_or(0, |r| r.end);

    let commit = opener.place(path).commit;
    let temp = Target::new(path, commit)?;
    let written = (|| {
        let file = opener.open_file(&temp.path(), OpenMode::Truncate)?;
        if commit == Commit::OnSync {
            // The length said before the first byte (an upload's part size fits it in S3's
            // 10 000 parts, or it is refused now, before any byte is uploaded).
            file.set_len(total)?;
        }
        let sums = write_hashing(&*file, data_start, &laid, checksums.then_some(&views[..]))?;
        let metadata = match &sums {
            Some(sums) => {
                let m = with_sums(metadata, sums);
                if laid.json_len(&m) != layout_len {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        "the checksums changed the header's length (a bug): not saved",
                    ));
                }
                m
            }
            None => layout_metadata.clone(),
        };
        laid.write_header(&*file, data_start, &metadata)?;
        if file.len()? != total {
            file.set_len(total)?;
        }
        file.sync()
    })();
    written.map_err(|e| {
        let what = match e.kind() {
            ErrorKind::StorageFull => "cannot save the checkpoint: no space left on device",
            _ => "cannot save the checkpoint",
        };
        Error::new(e.kind(), what).with_path(path).with_source(e)
    })?;
    temp.commit()
}

/// Where a save writes, so that no reader ever sees part of it, as the place commits
/// ([`Commit`]): under a temporary name renamed over its path once synced ([`AtomicFile`]),
/// or at the path itself, which shows the whole when synced (an upload: nothing when
/// dropped before).
enum Target {
    File(AtomicFile),
    Object(std::path::PathBuf),
}

impl Target {
    fn new(path: &Path, commit: Commit) -> Result<Self> {
        match commit {
            Commit::OnSync => Ok(Target::Object(path.to_path_buf())),
            Commit::RenameOver => AtomicFile::new(path).map(Target::File),
        }
    }

    /// The path to open for writing.
    fn path(&self) -> std::path::PathBuf {
        match self {
            Target::File(f) => f.path(),
            Target::Object(url) => url.clone(),
        }
    }

    /// Puts the written file in place (an object is in place once synced).
    fn commit(self) -> Result<()> {
        match self {
            Target::File(f) => f.commit(),
            Target::Object(_) => Ok(()),
        }
    }
}

/// `metadata` with the checksums `sums` stored under [`CHECKSUMS_KEY`].
fn with_sums(
    metadata: &BTreeMap<String, String>,
    sums: &BTreeMap<String, u32>,
) -> BTreeMap<String, String> {
    let mut m = metadata.clone();
    m.insert(CHECKSUMS_KEY.to_string(), checksum::encode(sums));
    m
}

/// Writes the data section of `laid`; where `views` are given, their checksums are
/// computed meanwhile on one more thread (reading the same memory) and returned.
fn write_hashing(
    file: &dyn BackendFile,
    data_start: u64,
    laid: &Laid<'_, '_>,
    views: Option<&[TensorView<'_>]>,
) -> Result<Option<BTreeMap<String, u32>>> {
    std::thread::scope(|scope| {
        // One thread: the writes' own threads (and a copier) keep the others busy.
        let hashing = views.map(|v| scope.spawn(move || checksum::compute_on(v, 1)));
        let wrote = write_data(file, data_start, laid.tensors, &laid.offsets);
        let sums = hashing.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        wrote.and(sums.transpose())
    })
}

/// Tensors and the byte ranges of the data section they are laid out at.
struct Laid<'t, 'a> {
    tensors: &'t dyn Tensors<'a>,
    offsets: Vec<Range<u64>>,
}

impl Laid<'_, '_> {
    /// Bytes of the JSON header of these tensors with `metadata`.
    fn json_len(&self, metadata: &BTreeMap<String, String>) -> u64 {
        let mut counter = header::Counter::default();
        // The encoder writes a few bytes at a time: through a buffer.
        let mut out = std::io::BufWriter::with_capacity(64 << 10, &mut counter);
        header::write_json(&mut out, self.offsets.len(), |i| self.tensor(i), metadata)
            .and_then(|()| std::io::Write::flush(&mut out))
            .expect("counting never fails");
        drop(out);
        counter.0
    }

    /// Writes the header (its length, then the JSON padded to `data_start`) at the start
    /// of `file`.
    fn write_header(
        &self,
        file: &dyn BackendFile,
        data_start: u64,
        metadata: &BTreeMap<String, String>,
    ) -> Result<()> {
        let mut out = HeaderWriter::new(file)?;
        let header_len = data_start - 8;
        let encoded = {
            let mut buffered = std::io::BufWriter::with_capacity(64 << 10, &mut out);
            std::io::Write::write_all(&mut buffered, &header_len.to_le_bytes())
                .and_then(|()| {
                    let tensor = |i| self.tensor(i);
                    header::write_json(&mut buffered, self.offsets.len(), tensor, metadata)
                })
                .and_then(|()| std::io::Write::flush(&mut buffered))
        };
        encoded.map_err(|e| {
            out.take_error()
                .unwrap_or_else(|| Error::io(e, "cannot write the header"))
        })?;
        out.finish(data_start)
    }

    /// The `i`-th tensor and its byte range.
    fn tensor(&self, i: usize) -> (&TensorDesc, Range<u64>) {
        (self.tensors.desc(i), self.offsets[i].clone())
    }
}

/// Writes the header to the start of a file in aligned pieces of [`HEADER_PIECE`] bytes.
struct HeaderWriter<'f> {
    file: &'f dyn BackendFile,
    buf: HostBuffer,
    filled: usize,
    /// File offset of `buf[0]`.
    pos: u64,
    error: Option<Error>,
}

/// Bytes of one write of a header (a multiple of [`DATA_ALIGN`]).
const HEADER_PIECE: usize = 1 << 20;

impl<'f> HeaderWriter<'f> {
    fn new(file: &'f dyn BackendFile) -> Result<Self> {
        Ok(HeaderWriter {
            file,
            buf: HostBuffer::new(HEADER_PIECE)?,
            filled: 0,
            pos: 0,
            error: None,
        })
    }

    fn flush_piece(&mut self) -> Result<()> {
        self.file
            .write_at(self.pos, MemRef::Host(&self.buf[..self.filled]))?;
        self.pos += self.filled as u64;
        self.filled = 0;
        Ok(())
    }

    /// Pads with spaces up to `data_start` and writes what is left.
    fn finish(mut self, data_start: u64) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        while self.pos + (self.filled as u64) < data_start {
            let room = self.buf.len() - self.filled;
            let pad = room.min((data_start - self.pos - self.filled as u64) as usize);
            self.buf[self.filled..self.filled + pad].fill(b' ');
            self.filled += pad;
            if self.filled == self.buf.len() {
                self.flush_piece()?;
            }
        }
        if self.filled > 0 {
            self.flush_piece()?;
        }
        Ok(())
    }

    fn take_error(&mut self) -> Option<Error> {
        self.error.take()
    }
}

impl std::io::Write for HeaderWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(self.buf.len() - self.filled);
        self.buf[self.filled..self.filled + n].copy_from_slice(&data[..n]);
        self.filled += n;
        if self.filled == self.buf.len() {
            if let Err(e) = self.flush_piece() {
                self.error = Some(e);
                return Err(std::io::Error::other("the header write failed"));
            }
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Checks the tensors and lays them out one after another: their offsets in the data
/// section.
fn layout(tensors: &dyn Tensors<'_>) -> Result<Vec<Range<u64>>> {
    let mut pos = 0u64;
    let mut out = Vec::with_capacity(tensors.count());
    for i in 0..tensors.count() {
        let desc = tensors.desc(i);
        let name = &desc.name;
        validate::tensor_name(name)?;
        let len = desc.byte_len()?;
        let data_len = tensors.data(i).len();
        if len != data_len as u64 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "tensor `{name}`: {} × {:?} is {len} bytes but its data holds {data_len}",
                    desc.dtype, desc.shape
                ),
            ));
        }
        out.push(pos..pos + len);
        pos += len;
    }
    let descs: Vec<&TensorDesc> = (0..tensors.count()).map(|i| tensors.desc(i)).collect();
    validate::by_name(&descs, |d| &d.name).map_err(|name| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("tensor `{name}` is given twice"),
        )
    })?;
    Ok(out)
}

/// One write of the data section.
enum Job<'a> {
    /// Written straight from the caller's memory.
    Direct { offset: u64, src: MemRef<'a> },
    /// Host pieces copied one after another into a staging buffer, then written at once.
    Staged {
        offset: u64,
        len: usize,
        pieces: Vec<&'a [u8]>,
    },
}

/// Splits the data section into jobs of at most [`WINDOW`] bytes (aligned in the file).
fn jobs<'a>(data_start: u64, tensors: &dyn Tensors<'a>, offsets: &[Range<u64>]) -> Vec<Job<'a>> {
    let mut jobs = Vec::new();
    let mut run: Option<(u64, usize, Vec<&'a [u8]>)> = None;
    let flush = |run: &mut Option<(u64, usize, Vec<&'a [u8]>)>, jobs: &mut Vec<Job<'a>>| {
        if let Some((offset, len, pieces)) = run.take() {
            jobs.push(Job::Staged {
                offset,
                len,
                pieces,
            });
        }
    };
    // The pieces of the data section: the whole section at once where the tensors come as
    // one buffer, else tensor by tensor.
    let segments: Vec<(Range<u64>, MemRef<'a>)> = match tensors.section() {
        Some(all) => vec![(0..all.len() as u64, all)],
        None => offsets
            .iter()
            .enumerate()
            .map(|(i, r)| (r.clone(), tensors.data(i)))
            .collect(),
    };
    for (range, data) in &segments {
        let (range, data) = (range.clone(), *data);
        let mut pos = range.start;
        while pos < range.end {
            // Pieces end at window boundaries of the file.
            let abs = data_start + pos;
            let window_end = (abs / WINDOW + 1) * WINDOW - data_start;
            let end = range.end.min(window_end);
            let src = data.slice((pos - range.start) as usize, (end - pos) as usize);
            let direct = match src {
                MemRef::Device(_) => true,
                MemRef::Host(_) => {
                    end - pos >= DIRECT_MIN
                        && abs.is_multiple_of(DATA_ALIGN)
                        && src.addr() % DATA_ALIGN == 0
                }
            };
            if direct {
                flush(&mut run, &mut jobs);
                jobs.push(Job::Direct { offset: abs, src });
            } else if let MemRef::Host(bytes) = src {
                match &mut run {
                    Some((offset, len, pieces))
                        if *offset + *len as u64 == abs && !abs.is_multiple_of(WINDOW) =>
                    {
                        *len += bytes.len();
                        pieces.push(bytes);
                    }
                    _ => {
                        flush(&mut run, &mut jobs);
                        run = Some((abs, bytes.len(), vec![bytes]));
                    }
                }
            }
            pos = end;
        }
    }
    flush(&mut run, &mut jobs);
    jobs
}

/// Writes the data section of `tensors`, laid out at `offsets`, from `data_start`: the jobs
/// go out in file order, one at a time (each already split into parallel requests by the
/// backend; four jobs at once measured slower, `docs/lab/loads.md`), while a second thread
/// copies the next staged job's pieces into a spare buffer, so that a save of memory that
/// cannot be written in place costs its writes, not its writes plus its copies.
fn write_data(
    file: &dyn BackendFile,
    data_start: u64,
    tensors: &dyn Tensors<'_>,
    offsets: &[Range<u64>],
) -> Result<()> {
    let jobs = jobs(data_start, tensors, offsets);
    if !jobs.iter().any(|j| matches!(j, Job::Staged { .. })) {
        // Nothing to copy: no second thread.
        for job in jobs {
            if let Job::Direct { offset, src } = job {
                file.write_at(offset, src)?;
            }
        }
        return Ok(());
    }
    let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<Ready<'_>>>(1);
    let (spare_tx, spare_rx) = mpsc::channel::<HostBuffer>();
    std::thread::scope(|scope| {
        scope.spawn(move || stage(jobs, &ready_tx, &spare_rx));
        // Owns the receiving end and the spare buffers' sender, so that an early return
        // (a failed write) stops the copier before the scope waits for it.
        let write = move || -> Result<()> {
            for ready in ready_rx {
                match ready? {
                    Ready::Direct { offset, src } => file.write_at(offset, src)?,
                    Ready::Staged { offset, len, buf } => {
                        file.write_at(offset, MemRef::Host(&buf[..len]))?;
                        let _ = spare_tx.send(buf);
                    }
                }
            }
            Ok(())
        };
        write()
    })
}

/// A job ready to be written: staged ones copied into their buffer.
enum Ready<'a> {
    /// Written straight from the caller's memory.
    Direct { offset: u64, src: MemRef<'a> },
    /// `buf[..len]` goes to `offset`.
    Staged {
        offset: u64,
        len: usize,
        buf: HostBuffer,
    },
}

/// Staging buffers of a save: one being written, one being filled.
const STAGING_BUFFERS: usize = 2;

/// The copier of [`write_data`]: hands the jobs on in order, staged ones copied into a
/// buffer (new ones up to [`STAGING_BUFFERS`], then those the writer gives back). Stops when
/// the writer stops listening.
fn stage<'a>(
    jobs: Vec<Job<'a>>,
    ready: &mpsc::SyncSender<Result<Ready<'a>>>,
    spare: &mpsc::Receiver<HostBuffer>,
) {
    let mut made = 0;
    for job in jobs {
        let next = match job {
            Job::Direct { offset, src } => Ok(Ready::Direct { offset, src }),
            Job::Staged {
                offset,
                len,
                pieces,
            } => {
                let buf = if made < STAGING_BUFFERS {
                    made += 1;
                    HostBuffer::new(WINDOW as usize)
                } else {
                    match spare.recv() {
                        Ok(buf) => Ok(buf),
                        Err(_) => return,
                    }
                };
                buf.map(|mut buf| {
                    let mut at = 0;
                    for p in pieces {
                        buf[at..at + p.len()].copy_from_slice(p);
                        at += p.len();
                    }
                    Ready::Staged { offset, len, buf }
                })
            }
        };
        let failed = next.is_err();
        if ready.send(next).is_err() || failed {
            return;
        }
    }
}
