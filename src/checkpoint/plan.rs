//! Planning the reads of one checkpoint file: small host requests close together are read
//! as one staged span, the rest one by one. Linear in the number of requests.

use super::load::{Request, ALIGN};
use super::IO_THREADS;
use crate::core::align::align_down;
use crate::core::ReadJob as JobShape;
use crate::{BackendFile, Error, HostBuffer, MemMut, Result};
use std::ops::Range;

/// Requested tensors smaller than this are read through a staging buffer, with neighbours.
pub(crate) const SMALL: u64 = 1 << 20;

/// Small requested tensors closer than this are read in one staged request.
const JOIN_GAP: u64 = 64 << 10;

/// Largest staging read of [`load_into`].
const STAGE_MAX: u64 = 16 << 20;

/// One read of [`CheckpointFile::read_into`]: a lone request, or small host requests read
/// together.
pub(crate) enum ReadJob<'a> {
    Single(Request<'a>),
    Staged(Staged<'a>),
}

/// The reads of `reqs` (sorted by file offset): small host requests close together are
/// joined into staged reads, the rest go one by one. Linear in the number of requests.
pub(crate) fn plan_reads(reqs: Vec<Request<'_>>) -> Vec<ReadJob<'_>> {
    let mut jobs: Vec<ReadJob<'_>> = Vec::new();
    for (r, dst) in reqs {
        let dst = match dst {
            MemMut::Host(d) if r.end - r.start < SMALL => d,
            dst => {
                jobs.push(ReadJob::Single((r, dst)));
                continue;
            }
        };
        match jobs.last_mut() {
            Some(ReadJob::Staged(g)) if g.admits(&r) => g.push(r, dst),
            _ => jobs.push(ReadJob::Staged(Staged::new(r, dst))),
        }
    }
    jobs.into_iter()
        .map(|job| match job {
            ReadJob::Staged(g) if g.parts.len() == 1 => {
                let (r, d) = g.parts.into_iter().next().expect("one request");
                ReadJob::Single((r, MemMut::Host(d)))
            }
            job => job,
        })
        .collect()
}

/// Small host requests of one file read together: one read of the span from the first
/// range's aligned-down start to the furthest end into a staging buffer, then a copy to each
/// destination. Ranges join in order of their start.
pub(crate) struct Staged<'a> {
    /// The ranges, sorted by start, and their destinations.
    parts: Vec<(Range<u64>, &'a mut [u8])>,
    /// The furthest end of the ranges.
    end: u64,
}

impl<'a> Staged<'a> {
    /// A staged read of one range.
    pub(crate) fn new(r: Range<u64>, dst: &'a mut [u8]) -> Staged<'a> {
        Staged {
            end: r.end,
            parts: vec![(r, dst)],
        }
    }

    /// Whether `r` (starting at or after every range held) joins this read: it starts within
    /// [`JOIN_GAP`] of the furthest end, and the read stays within [`STAGE_MAX`].
    pub(crate) fn admits(&self, r: &Range<u64>) -> bool {
        r.start <= self.end.saturating_add(JOIN_GAP) && r.end - self.parts[0].0.start <= STAGE_MAX
    }

    /// Adds `r` (see [`admits`](Self::admits)) and its destination.
    pub(crate) fn push(&mut self, r: Range<u64>, dst: &'a mut [u8]) {
        self.end = self.end.max(r.end);
        self.parts.push((r, dst));
    }

    /// Reads the span and fills every destination, each then passed to `check` with its
    /// range; a short read is the error `truncated(offset reached)`.
    pub(crate) fn read(
        self,
        file: &dyn BackendFile,
        truncated: impl Fn(u64) -> Error,
        check: impl Fn(&Range<u64>, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let from = align_down(self.parts[0].0.start, ALIGN);
        let mut stage = HostBuffer::new((self.end - from) as usize)?;
        let got = file.read_at(from, stage.as_mem_mut())?;
        if (got as u64) < self.end - from {
            return Err(truncated(from + got as u64));
        }
        for (r, d) in self.parts {
            d.copy_from_slice(&stage[(r.start - from) as usize..(r.end - from) as usize]);
            check(&r, d)?;
        }
        Ok(())
    }
}

/// The job of `reqs` (sorted by offset; see [`BackendFile::begin_read_job`]), `None` when
/// they go to more than one kind of memory or there are none.
pub(crate) fn job_of(reqs: &[Request<'_>], fresh: bool) -> Option<JobShape> {
    let (first, _) = reqs.first()?;
    let memory = reqs[0].1.kind();
    if reqs.iter().any(|(_, d)| d.kind() != memory) {
        return None;
    }
    Some(JobShape {
        bytes: reqs.iter().map(|(r, _)| r.end - r.start).sum(),
        requests: reqs.len(),
        largest: reqs.iter().map(|(r, _)| r.end - r.start).max().unwrap_or(0),
        in_flight: IO_THREADS as u32,
        memory,
        fresh,
        first_offset: first.start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The jobs of host requests `(start, len)` as `(read alone, [(start, end)])`.
    fn plan(reqs: &[(u64, u64)]) -> Vec<(bool, Vec<(u64, u64)>)> {
        let mut bufs: Vec<Vec<u8>> = reqs.iter().map(|&(_, n)| vec![0; n as usize]).collect();
        let reqs: Vec<Request<'_>> = reqs
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(start, n), b)| (start..start + n, MemMut::Host(b)))
            .collect();
        plan_reads(reqs)
            .into_iter()
            .map(|job| match job {
                ReadJob::Single((r, _)) => (true, vec![(r.start, r.end)]),
                ReadJob::Staged(g) => {
                    let ranges = g.parts.iter().map(|(r, _)| (r.start, r.end)).collect();
                    (false, ranges)
                }
            })
            .collect()
    }

    #[test]
    fn small_neighbours_are_staged_together_and_the_rest_read_alone() {
        let big = SMALL;
        let jobs = plan(&[
            (0, 10),
            (10, 5),
            // Within JOIN_GAP of the end of the group.
            (15 + JOIN_GAP, 1),
            // A large tensor goes alone.
            (100_000, big),
            // Past JOIN_GAP: a new group, of one request, read directly.
            (100_000 + big + JOIN_GAP + 1, 8),
        ]);
        let far = 100_000 + big + JOIN_GAP + 1;
        assert_eq!(
            jobs,
            vec![
                (
                    false,
                    vec![(0, 10), (10, 15), (15 + JOIN_GAP, 16 + JOIN_GAP)]
                ),
                (true, vec![(100_000, 100_000 + big)]),
                (true, vec![(far, far + 8)]),
            ]
        );
    }

    #[test]
    fn a_staged_read_stays_within_stage_max() {
        // Back to back, each just under SMALL: a group ends before it passes STAGE_MAX.
        let len = SMALL - 1;
        let n = (STAGE_MAX / len + 1) as usize;
        let reqs: Vec<(u64, u64)> = (0..n as u64).map(|i| (i * len, len)).collect();
        let jobs = plan(&reqs);
        assert_eq!(jobs.len(), 2);
        for (_, ranges) in &jobs {
            let span = ranges.last().unwrap().1 - ranges[0].0;
            assert!(span <= STAGE_MAX, "{span}");
        }
        assert_eq!(jobs.iter().map(|(_, r)| r.len()).sum::<usize>(), n);
    }
}
