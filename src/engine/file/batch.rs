//! Batches through an engine file: one backend for the batch's context, through its own
//! `read_batch` / `write_batch` (io_uring keeps its queue full), not one transfer at a time.

use super::EngineFile;
use crate::engine::measure::{Shape, What};
use fastensor_core::{BackendFile, Direction, MemoryKind, ReadRequest, Result, WriteRequest};
use std::ops::Range;

/// While the batch's context is explored, the batch runs in pieces of this many requests,
/// each one measurement (one ring of io_uring's default queue depth, so that a path's batch
/// is measured as a batch): exploring costs a few pieces of the batch, and the rest runs
/// through the choice in one call.
const EXPLORE_PIECE: usize = 16;

impl EngineFile {
    /// Reads every request (each request's `done` receives its byte count, short only at the
    /// end of the file). The backend is chosen for the batch's context (the largest request's
    /// size class, the batch's length as requests in flight) and moves the batch through its
    /// own batch path; while that context is explored, pieces of the batch are its
    /// measurements. Requests of mixed memory kinds run one at a time.
    pub fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        let Some(first) = requests.first() else {
            return Ok(());
        };
        let (memory, offset, len) = (first.dst.kind(), first.offset, first.dst.len());
        if requests.iter().any(|r| r.dst.kind() != memory) {
            for r in requests.iter_mut() {
                r.done = BackendFile::read_at(self, r.offset, r.dst.reborrow())?;
            }
            return Ok(());
        }
        let largest = requests.iter().map(|r| r.dst.len()).max().unwrap_or(0);
        let count = requests.len();
        let first = offset..offset + len as u64;
        self.batch(
            Direction::Read,
            largest,
            memory,
            first,
            count,
            |h, range| {
                let piece = &mut requests[range];
                h.read_batch(piece)?;
                let moved = piece.iter().map(|r| r.done).sum();
                let wanted = piece.iter().map(|r| r.dst.len()).sum();
                Ok((moved, wanted))
            },
        )
    }

    /// Writes every request, as [`EngineFile::read_batch`] reads (a durable purpose's
    /// writes are measured until they reached the device).
    pub fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        let Some(first) = requests.first() else {
            return Ok(());
        };
        let (memory, offset) = (first.src.kind(), first.offset);
        if requests.iter().any(|r| r.src.kind() != memory) {
            for r in requests {
                BackendFile::write_at(self, r.offset, r.src)?;
            }
            return Ok(());
        }
        let durable = self.settings.read().purpose.durable_writes();
        let largest = requests.iter().map(|r| r.src.len()).max().unwrap_or(0);
        let count = requests.len();
        let first = offset..offset + first.src.len() as u64;
        self.batch(
            Direction::Write,
            largest,
            memory,
            first,
            count,
            |h, range| {
                let piece = &requests[range];
                h.write_batch(piece)?;
                if durable {
                    for r in piece {
                        self.write_back(r.offset, r.src.len())?;
                    }
                }
                let moved = piece.iter().map(|r| r.src.len()).sum();
                Ok((moved, moved))
            },
        )
    }

    /// Runs `count` requests through `op` (a range of them on a handle: bytes moved and
    /// wanted), `first` the bytes of the first one: chooses for the batch's context,
    /// explores in pieces of `EXPLORE_PIECE` requests, runs the rest through the choice at
    /// once; on a refusal, tries another backend.
    fn batch(
        &self,
        direction: Direction,
        largest: usize,
        memory: MemoryKind,
        first: Range<u64>,
        count: usize,
        mut op: impl FnMut(&dyn BackendFile, Range<usize>) -> Result<(usize, usize)>,
    ) -> Result<()> {
        self.check_writable(direction, None)?;
        let what = What {
            direction,
            bytes: largest as u64,
            memory,
            shape: Shape::Batch {
                requests: count,
                first,
            },
        };
        let mut ticket = self.engine.measurer.before(self, what);
        let pinned = self.pinned_index()?;
        let mut last_err = None;
        let mut done = 0;
        while done < count {
            let piece = |exploring: bool| {
                let end = if exploring {
                    (done + EXPLORE_PIECE).min(count)
                } else {
                    count
                };
                done..end
            };
            done = self
                .run(
                    &mut ticket,
                    pinned,
                    &mut last_err,
                    |h, exploring| {
                        let range = piece(exploring);
                        let end = range.end;
                        op(h, range).map(|(moved, wanted)| (moved, wanted, end))
                    },
                    |&(moved, wanted, _)| (moved, wanted),
                )?
                .2;
        }
        Ok(())
    }
}
