//! Batches through an engine file: one backend for the batch's context, through its own
//! `read_batch` / `write_batch` (io_uring keeps its queue full), not one transfer at a time.

use super::{refusal, EngineFile};
use crate::engine::InFlight;
use fastensor_core::{
    BackendFile, CacheState, Direction, Error, ErrorKind, MemoryKind, Purpose, ReadRequest, Result,
    TransferContext, WriteRequest,
};
use std::ops::Range;

/// While the batch's context is explored, the batch runs in pieces of this many requests,
/// each one measurement (one ring of io_uring's default queue depth, so that a path's batch
/// is measured as a batch): exploring costs a few pieces of the batch, and the rest runs
/// through the choice in one call. Pieces of one request were tried: one slow request then
/// dropped the best path.
const EXPLORE_PIECE: usize = 16;

impl EngineFile {
    /// The purpose recorded in this file's contexts.
    fn purpose_now(&self) -> Purpose {
        *self.purpose.read()
    }

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
        let cache = self.cache_state(offset, len);
        let count = requests.len();
        self.batch(
            Direction::Read,
            largest,
            memory,
            cache,
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
        let memory = first.src.kind();
        if requests.iter().any(|r| r.src.kind() != memory) {
            for r in requests {
                BackendFile::write_at(self, r.offset, r.src)?;
            }
            return Ok(());
        }
        let durable = self.purpose_now().durable_writes();
        let largest = requests.iter().map(|r| r.src.len()).max().unwrap_or(0);
        let count = requests.len();
        let unknown = CacheState::Unknown;
        self.batch(
            Direction::Write,
            largest,
            memory,
            unknown,
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
    /// wanted): chooses for the batch's context, explores in pieces of `EXPLORE_PIECE`
    /// requests, runs the rest through the choice at once; on a refusal, tries another
    /// backend.
    fn batch(
        &self,
        direction: Direction,
        largest: usize,
        memory: MemoryKind,
        cache: CacheState,
        count: usize,
        mut op: impl FnMut(&dyn BackendFile, Range<usize>) -> Result<(usize, usize)>,
    ) -> Result<()> {
        if direction == Direction::Write && !self.writable {
            return Err(
                Error::new(ErrorKind::PermissionDenied, "the file was opened read-only")
                    .with_path(&self.path),
            );
        }
        let (_guard, in_flight) = InFlight::enter(&self.engine.in_flight);
        let ctx = TransferContext {
            direction,
            bytes: largest as u64,
            memory,
            location: self.location.clone(),
            in_flight: in_flight.max(u32::try_from(count).unwrap_or(u32::MAX)),
            purpose: self.purpose_now(),
            cache,
        };
        let pinned = self.pinned_index()?;
        let mut last_err: Option<Error> = None;
        let mut done = 0;
        while done < count {
            let (path, exploring, handle) = self.pick(&ctx, None, pinned, &mut last_err)?;
            let chosen = &self.engine.candidates[path];
            let end = if exploring {
                (done + EXPLORE_PIECE).min(count)
            } else {
                count
            };
            let clock = &*self.engine.clock;
            let start = clock.now();
            let result = op(handle.as_ref(), done..end);
            let (wall, cpu) = clock.now().since(start);
            match result {
                Ok((moved, wanted)) => {
                    let (name, bytes) = (chosen.name(), moved as u64);
                    self.engine.add_usage(path, bytes, wall, Some(cpu));
                    // As a transfer: a short read measures nothing, and the first use of a
                    // handle (its set-up) counts only when it shows the path far behind.
                    if self.first_use(path) {
                        self.engine
                            .record_if_far(&ctx, name, bytes, wall, Some(cpu));
                    } else if moved == wanted {
                        self.engine.record(&ctx, name, bytes, wall, Some(cpu));
                    }
                    done = end;
                }
                Err(e) if refusal(e.kind()) => {
                    self.refuse(chosen.name());
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
