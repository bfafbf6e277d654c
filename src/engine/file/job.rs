//! Jobs: the reads of one checkpoint load through an engine file, sent through one backend
//! chosen once for the whole job and measured whole (see `BackendFile::begin_read_job`).
//!
//! The choice, in order: the pinned backend; the backend the selector has found best for
//! the job's context (one of its reads, with its reads in flight); an exploration the
//! selector asks for, when the job is small (at most
//! [`EXPLORE_JOB_MAX`]) and does not send a cold read through the page cache into fresh
//! memory ([`may_explore`]); else a default that suits the context ([`default_reader`]: a
//! direct path for cold reads, the page cache for cached ones). A large job never pays for
//! an exploration: those contexts are learned from small jobs and from `fastensor tune`.

use super::{refusal, EngineFile, Handle};
use crate::engine::measure::{Shape, Ticket, What};
use fastensor_core::debug_fields;
use fastensor_core::policy::{default_reader, may_explore};
use fastensor_core::{BackendFile, Direction, MemMut, MemRef, ReadJob, Result, TransferContext};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The largest job that may be an exploration's measurement.
pub(crate) const EXPLORE_JOB_MAX: u64 = 64 << 20;

impl EngineFile {
    /// The file a job's reads go through: one backend for all of them (see the module).
    /// `None` when no backend fits (the per-transfer path then reports why).
    pub(crate) fn begin_job(&self, job: &ReadJob) -> Option<JobFile<'_>> {
        let probe_len = job.largest.min(EXPLORE_JOB_MAX);
        // Keyed as one of the job's reads with the job's reads in flight: what `fastensor
        // tune` and single transfers teach the selector applies to the job, and the job's
        // measurement (all its bytes over its wall time) to them.
        let shape = Shape::Job {
            in_flight: job.in_flight,
            at_once: job
                .in_flight
                .min(u32::try_from(job.requests).unwrap_or(u32::MAX)),
            probe: job.first_offset..job.first_offset.saturating_add(probe_len),
        };
        let what = What {
            direction: Direction::Read,
            bytes: job.largest.max(1),
            memory: job.memory,
            shape,
        };
        let measurer = &self.engine.measurer;
        let mut ticket = measurer.before(self, what);
        let index = self.job_path(ticket.ctx(), job)?;
        let handle = self.handle(index).ok()?;
        measurer.start(&mut ticket, index, false);
        Some(JobFile {
            file: self,
            index,
            handle,
            ticket,
            bytes: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        })
    }

    /// The candidate (index among the engine's) for a job in `ctx`.
    fn job_path(&self, ctx: &TransferContext, job: &ReadJob) -> Option<usize> {
        if let Ok(pinned) = self.pinned_index() {
            if pinned.is_some() {
                return pinned;
            }
        }
        let candidates = &self.engine.candidates;
        let offered: Vec<usize> = {
            let handles = self.handles();
            (0..candidates.len())
                .filter(|&i| candidates[i].offered(ctx, &handles.refused))
                .collect()
        };
        let named = |name: &str| {
            offered
                .iter()
                .copied()
                .find(|&i| candidates[i].name() == name)
        };
        let measurer = &self.engine.measurer;
        if let Some(best) = measurer.best_for(ctx).and_then(|n| named(&n)) {
            return Some(best);
        }
        if job.bytes <= EXPLORE_JOB_MAX {
            let names: Vec<&str> = offered.iter().map(|&i| candidates[i].name()).collect();
            if let (Some(choice), _) = measurer.choose(ctx, &names, None) {
                let index = named(&choice.backend)?;
                if !choice.exploring || may_explore(ctx.cache, job.fresh, &candidates[index].caps) {
                    return Some(index);
                }
            }
        }
        let caps: Vec<_> = offered
            .iter()
            .map(|&i| candidates[i].caps.clone())
            .collect();
        default_reader(ctx.cache, &caps).map(|i| offered[i])
    }
}

/// The reads of one job through the backend chosen for it; dropped, it gives the measurer
/// the job's bytes (one measurement over the job's wall time) unless a read failed.
pub(crate) struct JobFile<'f> {
    file: &'f EngineFile,
    index: usize,
    handle: Handle,
    ticket: Ticket<'f>,
    bytes: AtomicU64,
    failed: AtomicBool,
}

debug_fields!(JobFile<'_>, "JobFile", |s| {
    path: s.file.path,
    backend: s.file.engine.candidates[s.index].name(),
});

impl Drop for JobFile<'_> {
    fn drop(&mut self) {
        let bytes = *self.bytes.get_mut() as usize;
        let done = (!*self.failed.get_mut()).then_some((bytes, bytes));
        let file = self.file;
        file.engine.measurer.after(file, &mut self.ticket, done);
    }
}

impl BackendFile for JobFile<'_> {
    fn path(&self) -> &Path {
        &self.file.path
    }

    /// Reads through the job's backend; a read it refuses (e.g. an alignment it cannot
    /// take) goes through the engine file's own choice instead.
    fn read_at(&self, offset: u64, mut dst: MemMut<'_>) -> Result<usize> {
        match self.handle.read_at(offset, dst.reborrow()) {
            Ok(n) => {
                self.bytes.fetch_add(n as u64, Ordering::Relaxed);
                Ok(n)
            }
            Err(e) if refusal(e.kind()) => self.file.read_at(offset, dst),
            Err(e) => {
                self.failed.store(true, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        self.file.write_at(offset, src)
    }

    fn sync(&self) -> Result<()> {
        self.file.sync()
    }

    fn len(&self) -> Result<u64> {
        self.file.len()
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.file.set_len(len)
    }
}
