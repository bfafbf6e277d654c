//! One transfer through an engine file, top to bottom: the measurer's ticket (the context),
//! the backend picked for it (pinned, kept, or the selector's answer), its handle, the
//! backend's call, the measurer's accounting; on a refusal, another backend.

use super::{refusal, EngineFile, Handle};
use crate::engine::decisions::Question;
use crate::engine::measure::{Shape, Ticket, What};
use crate::engine::Candidate;
use fastensor_core::{
    BackendFile, Direction, Error, ErrorKind, MemoryKind, Result, TransferContext,
};

impl EngineFile {
    /// Runs one transfer of `bytes` at `offset` through `op` (`moved`: the bytes it moved):
    /// the measurer gives its context, a backend is picked and its handle opened, `op` runs
    /// on it (a durable write until its bytes reached the device), and the measurer
    /// accounts for it; on a refusal, another backend is tried.
    pub(super) fn transfer<T>(
        &self,
        direction: Direction,
        bytes: usize,
        memory: MemoryKind,
        offset: u64,
        mut op: impl FnMut(&dyn BackendFile) -> Result<T>,
        moved: impl Fn(&T) -> usize,
    ) -> Result<T> {
        self.check_writable(direction, Some(offset))?;
        let shape = Shape::Single { offset };
        let what = What {
            direction,
            bytes: bytes as u64,
            memory,
            shape,
        };
        let mut ticket = self.engine.measurer.before(self, what);
        let durable = direction == Direction::Write && ticket.ctx().purpose.durable_writes();
        let pinned = self.pinned_index()?;
        let mut last_err = None;
        self.run(
            &mut ticket,
            pinned,
            &mut last_err,
            |h, _| match op(h) {
                // A durable write costs what it takes to reach the device.
                Ok(v) if durable => self.write_back(offset, bytes).map(|()| v),
                other => other,
            },
            |v| (moved(v), bytes),
        )
    }

    /// Runs `op` (given whether the pick is an exploration's measurement) on the backend
    /// picked for `ticket`, between the measurer's clock start and its accounting (`done`:
    /// the bytes moved and wanted); a backend that refuses is set aside and another picked
    /// (`last_err`: why the last one failed).
    pub(super) fn run<T>(
        &self,
        ticket: &mut Ticket<'_>,
        pinned: Option<usize>,
        last_err: &mut Option<Error>,
        mut op: impl FnMut(&dyn BackendFile, bool) -> Result<T>,
        done: impl Fn(&T) -> (usize, usize),
    ) -> Result<T> {
        let measurer = &self.engine.measurer;
        loop {
            let (path, exploring, handle) =
                self.pick(ticket.ctx(), ticket.stay(), pinned, last_err)?;
            measurer.start(ticket, path, exploring);
            let result = op(handle.as_ref(), exploring);
            measurer.after(self, ticket, result.as_ref().ok().map(&done));
            match result {
                Ok(v) => return Ok(v),
                Err(e) if refusal(e.kind()) => {
                    self.refuse(self.engine.candidates[path].name());
                    *last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Fails for a write to a file opened read-only.
    pub(super) fn check_writable(&self, direction: Direction, offset: Option<u64>) -> Result<()> {
        if direction == Direction::Write && !self.writable {
            let e = Error::new(ErrorKind::PermissionDenied, "the file was opened read-only")
                .with_path(&self.path);
            return Err(match offset {
                Some(offset) => e.with_offset(offset),
                None => e,
            });
        }
        Ok(())
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
        let measurer = &self.engine.measurer;
        let kept = self.decisions.lock().get(&question, measurer.epochs());
        if let Some((path, exploring)) = kept {
            measurer.count_reused(exploring);
            return Some((path, exploring));
        }
        let candidates = &self.engine.candidates;
        let (names, indices): (Vec<&str>, Vec<usize>) = {
            let handles = self.handles();
            candidates
                .iter()
                .enumerate()
                .filter(|(_, c)| c.offered(ctx, &handles.refused))
                .map(|(i, c)| (c.name(), i))
                .unzip()
        };
        // A read continuing a stream stays on the stream's path while that path is being
        // explored.
        let stay_name = stay.and_then(|i| candidates.get(i)).map(Candidate::name);
        let (choice, epochs) = measurer.choose(ctx, &names, stay_name);
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
        if let Some(name) = self.settings.read().pin.as_deref() {
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
        if self.handles().refused.contains(name) {
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
}
