//! Accounting for a transfer that succeeded: its use, its bytes read, its measurement
//! (gathered into a stream's or writes' run, recorded, or offered only to rule a path far
//! behind out).

use super::learn::Take;
use super::stream::{Measured, Run};
use super::{MeasuredFile, Measurer, Ticket, LARGE};
use fastensor_core::{CacheState, Direction};
use std::time::Duration;

/// A transfer that succeeded, as timed: through the candidate `path`, `moved` of `wanted`
/// bytes.
pub(super) struct Timed {
    pub(super) path: usize,
    pub(super) exploring: bool,
    pub(super) moved: usize,
    pub(super) wanted: usize,
    pub(super) wall: Duration,
    pub(super) cpu: Option<Duration>,
}

impl Measurer {
    /// Accounts for a single read or write at `offset`: its use, its bytes read (re-reads),
    /// and its measurement, gathered into a stream's or writes' run or recorded. A first
    /// transfer through a backend on this file pays set-up costs once: it is offered only to
    /// rule its path far behind out, and only when large, exploring and not from the page
    /// cache; a short read measures nothing useful.
    pub(super) fn account_single(
        &self,
        file: &impl MeasuredFile,
        ticket: &Ticket<'_>,
        offset: u64,
        t: Timed,
    ) {
        let ctx = &ticket.ctx;
        let (n, keeps_cache) = (t.moved as u64, self.paths[t.path].1);
        self.add_usage(t.path, n, t.wall, t.cpu);
        let measured = || Measured {
            ctx: ctx.clone(),
            bytes: n,
            wall: t.wall,
            cpu: t.cpu,
        };
        let (first_far, ended, (first_read, again)) = {
            let mut state = self.state(file);
            let first = state.first_use(t.path);
            let useful = t.moved == t.wanted && !first;
            // A first transfer that may tell a path far behind: recorded below only if so.
            let first_far = first
                && t.exploring
                && t.moved == t.wanted
                && t.wanted as u64 >= LARGE
                && !(ctx.direction == Direction::Read && ctx.cache == CacheState::Cached);
            let mut reads = (0, 0);
            let ended: [Option<Run>; 5] = if ctx.direction == Direction::Read {
                reads = state.reads.add(offset, offset + n, keeps_cache);
                // Stream reads are measured in runs, and an exploring path that takes over a
                // stream only once it has warmed up in it (see `ReadStream`); exploration
                // stays on it meanwhile (`Selector::choose_staying`).
                state.stream.finish(
                    ticket.stay.is_some(),
                    offset..offset + n,
                    t.path,
                    keeps_cache,
                    t.exploring,
                    useful.then(measured),
                )
            } else if first_far {
                // After the writes gathered so far, so that the selector learns in order.
                [state.writes.take(), None, None, None, None]
            } else if useful {
                // A chosen write, or an exploration's through a path that keeps the page
                // cache, joins a run; an exploration's through a path that bypasses it is
                // recorded alone, after the run in progress (see `write_run.rs`).
                let [a, b] = if t.exploring && !keeps_cache {
                    [
                        state.writes.take(),
                        Some(Run::start(measured(), t.path, None)),
                    ]
                } else {
                    state.writes.add(measured(), t.path)
                };
                [a, b, None, None, None]
            } else {
                Default::default()
            };
            (first_far, ended, reads)
        };
        self.counters.add_reads(first_read, again);
        for run in ended.into_iter().flatten() {
            self.record_run(run);
        }
        if first_far {
            self.record(Take::IfFar, ctx, t.path, n, t.wall, t.cpu);
        }
    }

    /// Accounts for a piece of a batch: as a single transfer, a short one measures nothing,
    /// and the first use of a handle (its set-up) counts only when it shows the path far
    /// behind.
    pub(super) fn account_batch(&self, file: &impl MeasuredFile, ticket: &Ticket<'_>, t: Timed) {
        let bytes = t.moved as u64;
        self.add_usage(t.path, bytes, t.wall, t.cpu);
        let take = if self.state(file).first_use(t.path) {
            Take::IfFar
        } else if t.moved == t.wanted {
            Take::Observe
        } else {
            return;
        };
        self.record(take, &ticket.ctx, t.path, bytes, t.wall, t.cpu);
    }

    /// Accounts for a job, recorded as its `at_once` reads in flight saw it (each one's bytes
    /// over its own time), as single transfers in the same context are.
    pub(super) fn account_job(&self, ticket: &Ticket<'_>, at_once: u32, t: Timed) {
        let bytes = t.moved as u64;
        let per_read = t.wall.saturating_mul(at_once.max(1));
        self.record(Take::Observe, &ticket.ctx, t.path, bytes, per_read, None);
        self.add_usage(t.path, bytes, t.wall, None);
    }
}
