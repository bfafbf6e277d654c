//! Accounting for a transfer that succeeded: its use, its bytes read, its measurement.

use super::EngineFile;
use super::Measured;
use fastensor_core::{CacheState, Direction, TransferContext};
use std::time::Duration;

/// A transfer that succeeded, to be accounted for (see [`EngineFile::account`]).
pub(super) struct Done {
    pub(super) ctx: TransferContext,
    /// The backend of the stream's last read, for a read that continues a stream.
    pub(super) stay: Option<usize>,
    pub(super) path: usize,
    pub(super) exploring: bool,
    pub(super) offset: u64,
    pub(super) wanted: usize,
    pub(super) moved: usize,
    pub(super) wall: Duration,
    pub(super) cpu: Option<Duration>,
}

impl EngineFile {
    /// Accounts for a transfer that succeeded: its use, its bytes read (re-reads), and its
    /// measurement, gathered into a stream's or writes' run or recorded (a first transfer
    /// through a backend on this file pays set-up costs once: recorded only when large and
    /// far behind, see `FIRST_FAR_FROM`; a short read measures nothing useful).
    pub(super) fn account(&self, done: Done) {
        let Done {
            ctx,
            stay,
            path,
            exploring,
            offset,
            wanted,
            moved: n,
            wall,
            cpu,
        } = done;
        let chosen = &self.engine.candidates[path];
        let direction = ctx.direction;
        self.engine.add_usage(path, n as u64, wall, cpu);
        let first = self.first_use(path);
        let useful = n == wanted && !first;
        // A first transfer that may tell a path far behind: its context, recorded below only
        // if so.
        let first_far = (first
            && exploring
            && n == wanted
            && wanted as u64 >= crate::engine::LARGE
            && !(direction == Direction::Read && ctx.cache == CacheState::Cached))
            .then(|| ctx.clone());
        if direction == Direction::Read {
            let (first, again) =
                self.read_ranges
                    .lock()
                    .add(offset, offset + n as u64, chosen.keeps_cache());
            self.engine.reads.add(first, again);
            // Stream reads are measured in runs, and an exploring path that takes over a
            // stream only once it has warmed up in it (see `ReadStream`); exploration stays
            // on it meanwhile (`Selector::choose_staying`).
            let measured = useful.then_some(Measured {
                ctx,
                bytes: n as u64,
                wall,
                cpu,
            });
            let ended = self.stream().finish(
                stay.is_some(),
                offset..offset + n as u64,
                path,
                chosen.keeps_cache(),
                exploring,
                measured,
            );
            for run in ended.into_iter().flatten() {
                self.record_run(run);
            }
        } else if first_far.is_some() {
            // After the writes gathered so far, so that the selector learns in order.
            let pending = self.write_run.lock().take();
            if let Some(run) = pending {
                self.record_run(run);
            }
        } else if useful {
            let measured = Measured {
                ctx,
                bytes: n as u64,
                wall,
                cpu,
            };
            self.record_write(measured, path, exploring);
        }
        if let Some(ctx) = first_far {
            let name = chosen.name();
            self.engine.record_if_far(&ctx, name, n as u64, wall, cpu);
        }
    }
}
