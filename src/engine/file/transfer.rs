//! One transfer through an engine file: its context, the backend chosen for it (pinned,
//! kept, or the selector's answer), the handle, the timing, and what the selector is told.

use super::account::Done;
use super::{refusal, EngineFile, Handle};
use crate::engine::decisions::Question;
use crate::engine::{Candidate, InFlight};
use fastensor_core::{
    BackendFile, CacheState, Direction, Error, ErrorKind, MemoryKind, Result, TransferContext,
};

impl EngineFile {
    /// The context of a transfer, and for a read that continues a stream the backend of
    /// the stream's last read.
    pub(super) fn context(
        &self,
        direction: Direction,
        bytes: u64,
        memory: MemoryKind,
        in_flight: u32,
        offset: u64,
    ) -> (TransferContext, Option<usize>) {
        let (cache, previous) = match direction {
            Direction::Read => self.read_cache_state(offset, bytes as usize),
            Direction::Write => (CacheState::Unknown, None),
        };
        let ctx = TransferContext {
            direction,
            bytes,
            memory,
            location: self.location.clone(),
            in_flight,
            purpose: *self.purpose.read(),
            cache,
        };
        (ctx, previous)
    }

    /// The selector's answer for a transfer in `ctx` continuing a stream last read through
    /// the candidate `stay`: the candidate (index among the engine's) and whether the
    /// transfer is an exploration's measurement; `None` when no candidate is offered. A
    /// kept answer is reused while the selector's epochs let it stand (see
    /// `decisions.rs`).
    pub(super) fn choose(
        &self,
        ctx: &TransferContext,
        stay: Option<usize>,
    ) -> Option<(usize, bool)> {
        let question = Question::of(ctx, stay);
        let kept = self.decisions.lock().get(&question, self.engine.epochs());
        if let Some((path, exploring)) = kept {
            self.engine.count_reused(exploring);
            return Some((path, exploring));
        }
        let candidates = &self.engine.candidates;
        let (names, indices): (Vec<&str>, Vec<usize>) = {
            let refused = self.refused();
            candidates
                .iter()
                .enumerate()
                .filter(|(_, c)| c.fits(ctx.direction, ctx.memory) && !refused.contains(c.name()))
                .map(|(i, c)| (c.name(), i))
                .unzip()
        };
        // A read continuing a stream stays on the stream's path while that path is being
        // explored.
        let stay_name = stay.and_then(|i| candidates.get(i)).map(Candidate::name);
        let (choice, epochs) = self.engine.choose(ctx, &names, stay_name);
        let choice = choice?;
        let path = names
            .iter()
            .position(|n| *n == choice.backend)
            .map(|i| indices[i])
            .expect("the selector chooses among the names given");
        self.decisions
            .lock()
            .put(question, path, choice.exploring, epochs);
        Some((path, choice.exploring))
    }

    /// The pinned backend (this file's, else the engine's) as an index among the engine's
    /// candidates.
    pub(super) fn pinned_index(&self) -> Result<Option<usize>> {
        let index = |name: &str| self.engine.candidate_index(name).map(Some);
        if let Some(name) = self.pinned.read().as_deref() {
            return index(name);
        }
        let engine = self.engine.pinned();
        engine.as_deref().map_or(Ok(None), index)
    }

    /// Picks a backend for `ctx` (see `pick_path`) and opens its handle; a backend that
    /// refuses the file is set aside and another picked.
    pub(super) fn pick(
        &self,
        ctx: &TransferContext,
        stay: Option<usize>,
        pinned: Option<usize>,
        last_err: &mut Option<Error>,
    ) -> Result<(usize, bool, Handle)> {
        loop {
            let (path, exploring) = self.pick_path(ctx, stay, pinned, last_err)?;
            match self.handle(path) {
                Ok(h) => return Ok((path, exploring, h)),
                Err(e) if refusal(e.kind()) => {
                    self.refuse(self.engine.candidates[path].name());
                    *last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The backend of a transfer in `ctx` (index among the engine's candidates) and whether
    /// the transfer is an exploration's measurement: `pinned` when set, else the selector's
    /// answer (continuing a stream last read through `stay`). An error when none can do it
    /// (`last_err`: why the previous backend failed).
    pub(super) fn pick_path(
        &self,
        ctx: &TransferContext,
        stay: Option<usize>,
        pinned: Option<usize>,
        last_err: &mut Option<Error>,
    ) -> Result<(usize, bool)> {
        let (direction, memory) = (ctx.direction, ctx.memory);
        let Some(index) = pinned else {
            return self.choose(ctx, stay).ok_or_else(|| {
                last_err.take().unwrap_or_else(|| {
                    Error::new(
                        ErrorKind::Unsupported,
                        format!("no available backend can {direction} {memory} memory"),
                    )
                    .with_path(&self.path)
                })
            });
        };
        let c = &self.engine.candidates[index];
        let name = c.name();
        if !c.fits(direction, memory) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("the pinned backend `{name}` cannot {direction} {memory} memory"),
            )
            .with_backend(name)
            .with_path(&self.path));
        }
        if self.refused().contains(name) {
            return Err(last_err.take().unwrap_or_else(|| {
                Error::new(
                    ErrorKind::Unsupported,
                    "the pinned backend refused this file",
                )
                .with_backend(name)
                .with_path(&self.path)
            }));
        }
        Ok((index, false))
    }

    /// Runs one transfer: choose, open, time, record; on a refusal, tries another backend.
    pub(super) fn transfer<T>(
        &self,
        direction: Direction,
        bytes: usize,
        memory: MemoryKind,
        offset: u64,
        mut op: impl FnMut(&dyn BackendFile) -> Result<T>,
        moved: impl Fn(&T) -> usize,
    ) -> Result<T> {
        if direction == Direction::Write && !self.writable {
            return Err(
                Error::new(ErrorKind::PermissionDenied, "the file was opened read-only")
                    .with_path(&self.path)
                    .with_offset(offset),
            );
        }
        let (_guard, in_flight) = InFlight::enter(&self.engine.in_flight);
        let (ctx, stream_previous) =
            self.context(direction, bytes as u64, memory, in_flight, offset);
        let durable = direction == Direction::Write && ctx.purpose.durable_writes();
        let pinned = self.pinned_index()?;
        let mut last_err: Option<Error> = None;
        loop {
            let (path, exploring, handle) =
                self.pick(&ctx, stream_previous, pinned, &mut last_err)?;
            let chosen = &self.engine.candidates[path];
            let clock = &*self.engine.clock;
            // A stream's reads are measured in runs, whose CPU time a share of their small
            // reads gives (see `Run::cpu`).
            let sampled =
                exploring && (stream_previous.is_none() || bytes as u64 >= crate::engine::LARGE);
            let start = if self.engine.reads_cpu(sampled) {
                Some(clock.now())
            } else {
                None
            };
            let start_wall = start.map_or_else(|| clock.wall(), |s| s.wall);
            let result = match op(handle.as_ref()) {
                // A durable write costs what it takes to reach the device.
                Ok(v) if durable => self.write_back(offset, bytes).map(|()| v),
                other => other,
            };
            let (wall, cpu) = match start {
                Some(start) => {
                    let (wall, cpu) = clock.now().since(start);
                    (wall, Some(cpu))
                }
                None => (clock.wall().saturating_sub(start_wall), None),
            };
            match result {
                Ok(v) => {
                    let done = Done {
                        ctx,
                        stay: stream_previous,
                        path,
                        exploring,
                        offset,
                        wanted: bytes,
                        moved: moved(&v),
                        wall,
                        cpu,
                    };
                    self.account(done);
                    return Ok(v);
                }
                Err(e) if refusal(e.kind()) => {
                    self.refuse(chosen.name());
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
    }
}
