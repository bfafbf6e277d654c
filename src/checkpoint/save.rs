//! Durable, atomic saves: the data section goes out in large aligned writes, in file order,
//! each split by the backend into requests in flight in parallel; straight from the caller's
//! buffers where they are aligned and through staging buffers where they are not (small
//! tensors are coalesced, never written one by one).

use super::header::{self, HeaderEntry, DATA_ALIGN};
use super::{validate, FileOpener};
use crate::atomic::AtomicFile;
use crate::core::parallel;
use crate::{BackendFile, Error, ErrorKind, HostBuffer, MemRef, OpenMode, Result, TensorDesc};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

/// Bytes of the data section written by one job (a multiple of [`DATA_ALIGN`]).
const WINDOW: u64 = 16 << 20;

/// Jobs written at once. One: the jobs go out in file order, each already split into parallel
/// requests by the backend (`posix-direct`: 4 x 4 MiB). Measured on a virtio ext4 disk under
/// sustained writes (1.35 GiB saves, 6 rounds, order rotated), one job at a time saved in a
/// median 2.435 s against 2.681 s for four jobs at once: out-of-order windows cost more than
/// the extra requests in flight win.
const SAVE_JOBS_IN_FLIGHT: usize = 1;

/// A piece of an aligned buffer at least this long is written in place, not staged.
const DIRECT_MIN: u64 = 256 << 10;

/// A tensor to save: its descriptor and its bytes (host or device memory).
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    /// Name, dtype and shape.
    pub desc: TensorDesc,
    /// The tensor's bytes; exactly `desc.byte_len()` of them.
    pub data: MemRef<'a>,
}

impl<'a> TensorView<'a> {
    /// A view of `data` described by `desc`.
    pub fn new(desc: TensorDesc, data: impl Into<MemRef<'a>>) -> Self {
        TensorView {
            desc,
            data: data.into(),
        }
    }
}

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
/// not a regular file is refused, a symbolic link is followed, the mode (and owner, as
/// root) of a file replaced is kept. On error nothing is left behind, and the error names
/// `path` (and says "no space left on device" when the disk is full). A descriptor whose byte length
/// differs from its data's, a duplicate name, or the name `__metadata__` is
/// [`ErrorKind::InvalidInput`].
pub fn save_with_metadata<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
    tensors: &[TensorView<'_>],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let entries = layout(tensors).map_err(|e| e.with_path(path))?;
    let prefix = header::encode(&entries, metadata);
    let data_start = prefix.len() as u64;
    let total = data_start + entries.last().map_or(0, |e| e.offsets.end);
    let header_buf = HostBuffer::from_slice(&prefix)?;

    let temp = AtomicFile::new(path)?;
    let written = (|| {
        let file = opener.open_file(&temp.path(), OpenMode::Truncate)?;
        file.write_at(0, header_buf.as_mem())?;
        write_data(&*file, data_start, tensors, &entries)?;
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

/// Checks the tensors and lays them out one after another.
fn layout(tensors: &[TensorView<'_>]) -> Result<Vec<HeaderEntry>> {
    let mut names = HashSet::with_capacity(tensors.len());
    let mut pos = 0u64;
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let name = &t.desc.name;
        validate::tensor_name(name)?;
        if !names.insert(name.as_str()) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("tensor `{name}` is given twice"),
            ));
        }
        let len = t.desc.byte_len()?;
        if len != t.data.len() as u64 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "tensor `{name}`: {} × {:?} is {len} bytes but its data holds {}",
                    t.desc.dtype,
                    t.desc.shape,
                    t.data.len()
                ),
            ));
        }
        out.push(HeaderEntry {
            desc: t.desc.clone(),
            offsets: pos..pos + len,
        });
        pos += len;
    }
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
fn jobs<'a>(data_start: u64, tensors: &[TensorView<'a>], entries: &[HeaderEntry]) -> Vec<Job<'a>> {
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
    for (t, e) in tensors.iter().zip(entries) {
        let mut pos = e.offsets.start;
        while pos < e.offsets.end {
            // Pieces end at window boundaries of the file.
            let abs = data_start + pos;
            let window_end = (abs / WINDOW + 1) * WINDOW - data_start;
            let end = e.offsets.end.min(window_end);
            let src = t
                .data
                .slice((pos - e.offsets.start) as usize, (end - pos) as usize);
            let direct = match src {
                MemRef::Device(_) => true,
                MemRef::Host(_) => {
                    end - pos >= DIRECT_MIN && abs % DATA_ALIGN == 0 && src.addr() % DATA_ALIGN == 0
                }
            };
            if direct {
                flush(&mut run, &mut jobs);
                jobs.push(Job::Direct { offset: abs, src });
            } else if let MemRef::Host(bytes) = src {
                match &mut run {
                    Some((offset, len, pieces))
                        if *offset + *len as u64 == abs && (abs % WINDOW != 0) =>
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

/// Writes the data section of `tensors`, laid out as `entries`, from `data_start`.
fn write_data(
    file: &dyn BackendFile,
    data_start: u64,
    tensors: &[TensorView<'_>],
    entries: &[HeaderEntry],
) -> Result<()> {
    let jobs = jobs(data_start, tensors, entries);
    let pool: Mutex<Vec<HostBuffer>> = Mutex::new(Vec::new());
    parallel::for_each(jobs, SAVE_JOBS_IN_FLIGHT, |job| match job {
        Job::Direct { offset, src } => file.write_at(offset, src),
        Job::Staged {
            offset,
            len,
            pieces,
        } => {
            let taken = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let mut buf = match taken {
                Some(b) => b,
                None => HostBuffer::new(WINDOW as usize)?,
            };
            let mut at = 0;
            for p in pieces {
                buf[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            let res = file.write_at(offset, MemRef::Host(&buf[..len]));
            pool.lock().unwrap_or_else(|p| p.into_inner()).push(buf);
            res
        }
    })
}
