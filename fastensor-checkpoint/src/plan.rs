//! The one read planner of every checkpoint source: requests (a file of the source, a byte
//! range, a destination) become engine jobs. Per file, one job ([`BackendFile::begin_read_job`])
//! chooses the path of all that file's reads; small host requests close together are read
//! as one staged span; with [`How::windows`], long host requests are cut into windows, each
//! faulted in by the worker that reads it; the files' reads are interleaved so that the
//! workers read from every file at once. Linear in the number of requests.

use super::source_file::SourceFile;
use super::IO_THREADS;
use crate::{BackendFile, Error, ErrorKind, HostBuffer, MemMut, Result};
use fastensor_core::align::align_down;
use fastensor_core::parallel;
use fastensor_core::ReadJob as JobShape;
use std::ops::Range;
use std::path::Path;

/// Alignment of file offsets and memory for zero-copy direct reads.
pub(crate) const ALIGN: u64 = 4096;

/// Requested tensors smaller than this are read through a staging buffer, with neighbours.
pub(crate) const SMALL: u64 = 1 << 20;

/// Bytes to skip from memory at `address` so that the memory and a file offset agree
/// modulo [`DATA_ALIGN`](crate::DATA_ALIGN) (4096): where they agree, a direct read fills the memory with
/// no copy. Every placement of tensors in new memory uses it (the arena's, and one tensor's
/// own allocation, [`direct_read_pad`]).
pub fn congruent_pad(file_offset: u64, address: u64) -> u64 {
    (file_offset % ALIGN + ALIGN - address % ALIGN) % ALIGN
}

/// Where a tensor of `len` bytes (elements of `item` bytes) at `file_offset` starts in a
/// memory of its own allocated at `address` with `DATA_ALIGN` bytes to spare: its padding. The
/// [`congruent_pad`] where the tensor is large enough for a direct read to pay (
/// bytes, 1 MiB, or more) and the padding keeps it aligned to its elements (its offset is a
/// multiple of `item`); else 0 (allocators align to the elements already).
pub fn direct_read_pad(file_offset: u64, address: u64, len: u64, item: u64) -> u64 {
    if len < SMALL || item == 0 || !file_offset.is_multiple_of(item) {
        return 0;
    }
    congruent_pad(file_offset, address)
}

/// Small requested tensors closer than this are read in one staged request.
const JOIN_GAP: u64 = 64 << 10;

/// Largest staging read.
const STAGE_MAX: u64 = 16 << 20;

/// Bytes of one window of a long host read (see [`How::windows`]).
pub(crate) const READ_WINDOW: usize = 8 << 20;

/// One read the planner is asked for: `range` of file `file` of the source into `dst`
/// (exactly the range's length).
pub(crate) struct Request<'a> {
    /// Index of the file among the source's files.
    pub file: usize,
    /// Absolute byte range of the file.
    pub range: Range<u64>,
    /// Where the bytes go.
    pub dst: MemMut<'a>,
}

impl<'a> Request<'a> {
    /// A request of `dst.len()` bytes of file `file` from `offset`.
    pub(crate) fn at(file: usize, offset: u64, dst: MemMut<'a>) -> Request<'a> {
        let range = offset..offset + dst.len() as u64;
        Request { file, range, dst }
    }
}

/// How the requests of one [`execute`] are read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct How {
    /// The destinations are new memory not yet touched (see [`JobShape::fresh`]).
    pub fresh: bool,
    /// Host requests longer than [`READ_WINDOW`] are cut into windows of that many bytes,
    /// and every host request read alone is faulted in by the worker that reads it, so
    /// that the page faults of fresh memory overlap other reads.
    pub windows: bool,
}

/// One read of the plan: a lone request (or a window of one), or small host requests of
/// one file read together.
enum ReadJob<'a> {
    Single(Request<'a>),
    Staged(usize, Staged<'a>),
}

/// Reads every request into its destination. Files are those of the source (`files`);
/// where a file carries checksums, every whole tensor read is checked against its stored
/// checksum (on the I/O thread right after its read, or, for a request cut into windows,
/// after all reads): a mismatch is [`ErrorKind::Corrupt`] naming the file and the tensor.
/// A read that ends early (the file is shorter than the range) is [`ErrorKind::Corrupt`]
/// naming the file and the offset reached. `reqs` are sorted by file and offset. The reads
/// go out on [`IO_THREADS`] threads, or on as many as a file asks to have in flight
/// ([`BackendFile::reads_in_flight`]: an object's).
pub(crate) fn execute(files: &[SourceFile], reqs: &mut [Request<'_>], how: How) -> Result<()> {
    reqs.sort_by_key(|r| (r.file, r.range.start));
    // One job per file: its backend chosen once for all its reads.
    let mut job_files: Vec<Option<Box<dyn BackendFile + '_>>> =
        (0..files.len()).map(|_| None).collect();
    for mine in reqs.chunk_by(|a, b| a.file == b.file) {
        let f = mine[0].file;
        job_files[f] = job_of(mine, how.fresh).and_then(|j| files[f].file.begin_read_job(&j));
    }
    let through: Vec<&dyn BackendFile> = files
        .iter()
        .zip(&job_files)
        .map(|(f, job)| job.as_deref().unwrap_or(&*f.file))
        .collect();
    let jobs = plan(reqs, files.len(), how.windows);
    // As many reads in flight as the file that wants most asks for (an object store's).
    let threads = through
        .iter()
        .filter_map(|f| f.reads_in_flight())
        .fold(IO_THREADS, usize::max);
    parallel::for_each(jobs, threads, |job| match job {
        ReadJob::Single(Request {
            file,
            range,
            mut dst,
        }) => {
            let src = &files[file];
            if let (true, MemMut::Host(d)) = (how.windows, &mut dst) {
                super::arena::fault_in(d);
            }
            let got = through[file].read_at(range.start, dst.reborrow())?;
            if (got as u64) < range.end - range.start {
                return Err(truncated(&src.path, range.start + got as u64));
            }
            match &src.checksums {
                Some(sums) => sums.check_dst(&src.path, &range, &dst),
                None => Ok(()),
            }
        }
        ReadJob::Staged(file, group) => {
            let src = &files[file];
            group.read(through[file], &src.path, |r, bytes| match &src.checksums {
                Some(sums) => sums.check(&src.path, r, bytes),
                None => Ok(()),
            })
        }
    })?;
    drop(job_files);
    // Requests cut into windows: their whole tensors are checked now.
    let cut: Vec<&Request<'_>> = reqs
        .iter()
        .filter(|r| how.windows && is_cut(r) && files[r.file].checksums.is_some())
        .collect();
    parallel::for_each(cut, IO_THREADS, |r| {
        let src = &files[r.file];
        let sums = src.checksums.as_ref().expect("filtered");
        sums.check_dst(&src.path, &r.range, &r.dst)
    })
}

/// Whether a request is cut into windows when [`How::windows`] is set.
fn is_cut(r: &Request<'_>) -> bool {
    matches!(r.dst, MemMut::Host(_)) && r.range.end - r.range.start > READ_WINDOW as u64
}

/// The error of a read that ended at `offset` before its range did.
pub(crate) fn truncated(path: &Path, offset: u64) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        "the file ended before the range read did (truncated)",
    )
    .with_path(path)
    .with_offset(offset)
}

/// The reads of `reqs` (sorted by file and offset) over `files` files: per file, small host
/// requests close together joined into staged reads (a group of one read alone), long host
/// requests cut into windows where `windows` is set, the rest one by one; then the files'
/// reads interleaved, one of each in turn.
fn plan<'b>(reqs: &'b mut [Request<'_>], files: usize, windows: bool) -> Vec<ReadJob<'b>> {
    let mut per_file: Vec<Vec<ReadJob<'b>>> = (0..files).map(|_| Vec::new()).collect();
    for req in reqs.iter_mut() {
        let (f, r) = (req.file, req.range.clone());
        let jobs = &mut per_file[f];
        match req.dst.reborrow() {
            MemMut::Host(d) if r.end - r.start < SMALL => match jobs.last_mut() {
                Some(ReadJob::Staged(_, g)) if g.admits(&r) => g.push(r, d),
                _ => jobs.push(ReadJob::Staged(f, Staged::new(r, d))),
            },
            MemMut::Host(d) if windows => {
                let mut at = r.start;
                for w in d.chunks_mut(READ_WINDOW) {
                    let len = w.len() as u64;
                    jobs.push(ReadJob::Single(Request::at(f, at, MemMut::Host(w))));
                    at += len;
                }
            }
            dst => jobs.push(ReadJob::Single(Request {
                file: f,
                range: r,
                dst,
            })),
        }
    }
    let mut queues: Vec<_> = per_file
        .into_iter()
        .map(|jobs| jobs.into_iter().map(alone_if_single))
        .collect();
    let mut out = Vec::new();
    loop {
        let before = out.len();
        out.extend(queues.iter_mut().filter_map(Iterator::next));
        if out.len() == before {
            return out;
        }
    }
}

/// A staged group of one request, read straight into its destination instead.
fn alone_if_single(job: ReadJob<'_>) -> ReadJob<'_> {
    match job {
        ReadJob::Staged(f, g) if g.parts.len() == 1 => {
            let (r, d) = g.parts.into_iter().next().expect("one request");
            ReadJob::Single(Request {
                file: f,
                range: r,
                dst: MemMut::Host(d),
            })
        }
        job => job,
    }
}

/// Small host requests of one file read together: one read of the span from the first
/// range's aligned-down start to the furthest end into a staging buffer, then a copy to each
/// destination. Ranges join in order of their start.
struct Staged<'a> {
    /// The ranges, sorted by start, and their destinations.
    parts: Vec<(Range<u64>, &'a mut [u8])>,
    /// The furthest end of the ranges.
    end: u64,
}

impl<'a> Staged<'a> {
    /// A staged read of one range.
    fn new(r: Range<u64>, dst: &'a mut [u8]) -> Staged<'a> {
        Staged {
            end: r.end,
            parts: vec![(r, dst)],
        }
    }

    /// Whether `r` (starting at or after every range held) joins this read: it starts within
    /// [`JOIN_GAP`] of the furthest end, and the read stays within [`STAGE_MAX`].
    fn admits(&self, r: &Range<u64>) -> bool {
        r.start <= self.end.saturating_add(JOIN_GAP) && r.end - self.parts[0].0.start <= STAGE_MAX
    }

    /// Adds `r` (see [`admits`](Self::admits)) and its destination.
    fn push(&mut self, r: Range<u64>, dst: &'a mut [u8]) {
        self.end = self.end.max(r.end);
        self.parts.push((r, dst));
    }

    /// Reads the span of `file` (at `path`) and fills every destination, each then passed
    /// to `check` with its range; a short read is [`truncated`].
    fn read(
        self,
        file: &dyn BackendFile,
        path: &Path,
        check: impl Fn(&Range<u64>, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let from = align_down(self.parts[0].0.start, ALIGN);
        let mut stage = HostBuffer::new((self.end - from) as usize)?;
        let got = file.read_at(from, stage.as_mem_mut())?;
        if (got as u64) < self.end - from {
            return Err(truncated(path, from + got as u64));
        }
        for (r, d) in self.parts {
            d.copy_from_slice(&stage[(r.start - from) as usize..(r.end - from) as usize]);
            check(&r, d)?;
        }
        Ok(())
    }
}

/// The job of `reqs` (one file's, sorted by offset; see [`BackendFile::begin_read_job`]),
/// `None` when they go to more than one kind of memory or there are none.
fn job_of(reqs: &[Request<'_>], fresh: bool) -> Option<JobShape> {
    let first = reqs.first()?;
    let memory = first.dst.kind();
    if reqs.iter().any(|r| r.dst.kind() != memory) {
        return None;
    }
    let len = |r: &Request<'_>| r.range.end - r.range.start;
    Some(JobShape {
        bytes: reqs.iter().map(len).sum(),
        requests: reqs.len(),
        largest: reqs.iter().map(len).max().unwrap_or(0),
        in_flight: IO_THREADS as u32,
        memory,
        fresh,
        first_offset: first.range.start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A planned read: whether it is read alone, its file, and its `(start, end)` ranges.
    type Planned = (bool, usize, Vec<(u64, u64)>);

    /// The jobs of host requests `(file, start, len)`.
    fn plan_of(reqs: &[(usize, u64, u64)], windows: bool) -> Vec<Planned> {
        let mut bufs: Vec<Vec<u8>> = reqs.iter().map(|&(_, _, n)| vec![0; n as usize]).collect();
        let mut reqs: Vec<Request<'_>> = reqs
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(f, start, _), b)| Request::at(f, start, MemMut::Host(b)))
            .collect();
        let files = reqs.iter().map(|r| r.file + 1).max().unwrap_or(0);
        plan(&mut reqs, files, windows)
            .into_iter()
            .map(|job| match job {
                ReadJob::Single(r) => (true, r.file, vec![(r.range.start, r.range.end)]),
                ReadJob::Staged(f, g) => {
                    let ranges = g.parts.iter().map(|(r, _)| (r.start, r.end)).collect();
                    (false, f, ranges)
                }
            })
            .collect()
    }

    #[test]
    fn small_neighbours_are_staged_together_and_the_rest_read_alone() {
        let big = SMALL;
        let far = 100_000 + big + JOIN_GAP + 1;
        let jobs = plan_of(
            &[
                (0, 0, 10),
                (0, 10, 5),
                // Within JOIN_GAP of the end of the group.
                (0, 15 + JOIN_GAP, 1),
                // A large tensor goes alone.
                (0, 100_000, big),
                // Past JOIN_GAP: a new group, of one request, read directly.
                (0, far, 8),
            ],
            false,
        );
        let staged = vec![(0, 10), (10, 15), (15 + JOIN_GAP, 16 + JOIN_GAP)];
        assert_eq!(
            jobs,
            vec![
                (false, 0, staged),
                (true, 0, vec![(100_000, 100_000 + big)]),
                (true, 0, vec![(far, far + 8)]),
            ]
        );
    }

    #[test]
    fn a_staged_read_stays_within_stage_max() {
        // Back to back, each just under SMALL: a group ends before it passes STAGE_MAX.
        let len = SMALL - 1;
        let n = (STAGE_MAX / len + 1) as usize;
        let reqs: Vec<(usize, u64, u64)> = (0..n as u64).map(|i| (0, i * len, len)).collect();
        let jobs = plan_of(&reqs, false);
        assert_eq!(jobs.len(), 2);
        for (_, _, ranges) in &jobs {
            let span = ranges.last().unwrap().1 - ranges[0].0;
            assert!(span <= STAGE_MAX, "{span}");
        }
        assert_eq!(jobs.iter().map(|(_, _, r)| r.len()).sum::<usize>(), n);
    }

    #[test]
    fn long_host_reads_are_cut_into_windows_and_files_interleaved() {
        let w = READ_WINDOW as u64;
        let jobs = plan_of(&[(1, 0, 2 * w + 5), (0, 0, 3 * w)], true);
        let got: Vec<(usize, (u64, u64))> = jobs.iter().map(|(_, f, r)| (*f, r[0])).collect();
        assert_eq!(
            got,
            vec![
                (0, (0, w)),
                (1, (0, w)),
                (0, (w, 2 * w)),
                (1, (w, 2 * w)),
                (0, (2 * w, 3 * w)),
                (1, (2 * w, 2 * w + 5)),
            ]
        );
        // Without windows, each is one read.
        assert_eq!(plan_of(&[(0, 0, 3 * w)], false).len(), 1);
    }
}
