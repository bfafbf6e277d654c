//! Runs of writes: consecutive writes through one path in one context, recorded as one
//! observation.
//!
//! Recording a measurement takes the selector's lock and updates its estimates, a cost of
//! the order of a small write to the page cache. The writes the selector chose are
//! therefore gathered into runs of up to [`Run::MAX_TRANSFERS`] writes and
//! [`Run::MAX_WRITE_BYTES`] bytes; a run's observation is its writes' mean cost, and larger
//! writes are each a run of their own.
//!
//! An exploration's writes through a path that keeps the page cache are gathered into runs
//! too (the selector, learning nothing until the run ends, keeps choosing that path): such a
//! write costs either a memory copy or a wait for memory, and a single sample does not tell
//! which. An exploration's writes through a path that bypasses the page cache, whose cost is
//! steady, are recorded one by one, so that one far behind is dropped after a single write.
//! The measurements behind these rules: `docs/lab/measurement.md`.

use super::stream::{Measured, Run};

/// The run of writes in progress on a file.
#[derive(Debug, Default)]
pub(crate) struct WriteRun {
    run: Option<Run>,
}

impl WriteRun {
    /// Adds a write the selector chose, through the candidate `path`, measured as
    /// `measured`. Returns the runs that ended, to be recorded: the one in progress when
    /// this write does not belong to it, and this write's own once full.
    pub(crate) fn add(&mut self, measured: Measured, path: usize) -> [Option<Run>; 2] {
        if let Some(run) = self.run.as_mut() {
            if run.takes(&measured.ctx, path) {
                run.add(&measured);
                return [self.run.take_if(|r| r.full()), None];
            }
        }
        let ended = self.run.take();
        let run = Run::start(measured, path, None);
        if run.full() {
            [ended, Some(run)]
        } else {
            self.run = Some(run);
            [ended, None]
        }
    }

    /// The run in progress, taken out (to be recorded before an exploration's write, and
    /// when the file is dropped).
    pub(crate) fn take(&mut self) -> Option<Run> {
        self.run.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::test_write;
    use std::time::Duration;

    fn write(bytes: u64, in_flight: u32) -> Measured {
        Measured {
            ctx: test_write(bytes, in_flight),
            bytes,
            wall: Duration::from_micros(bytes / 1024),
            cpu: None,
        }
    }

    #[test]
    fn small_writes_of_one_path_and_context_make_one_run() {
        let mut w = WriteRun::default();
        for _ in 0..Run::MAX_TRANSFERS - 1 {
            assert!(w.add(write(4096, 1), 0).iter().all(Option::is_none));
        }
        let [ended, own] = w.add(write(4096, 1), 0);
        let run = ended.expect("the eighth write fills the run");
        assert!(own.is_none());
        assert_eq!(run.transfers, Run::MAX_TRANSFERS);
        assert_eq!(run.bytes, 4096 * u64::from(Run::MAX_TRANSFERS));
        assert_eq!(
            run.wall,
            Duration::from_micros(4 * u64::from(Run::MAX_TRANSFERS))
        );
        assert!(w.take().is_none());
    }

    #[test]
    fn a_write_of_another_path_or_context_ends_the_run() {
        let mut w = WriteRun::default();
        w.add(write(4096, 1), 0);
        w.add(write(4096, 1), 0);
        let [ended, _] = w.add(write(4096, 1), 1);
        assert_eq!(ended.map(|r| (r.path, r.transfers)), Some((0, 2)));
        let [ended, _] = w.add(write(8192, 1), 1);
        assert_eq!(ended.map(|r| (r.ctx.bytes, r.transfers)), Some((4096, 1)));
        let [ended, _] = w.add(write(8192, 4), 1);
        assert_eq!(ended.map(|r| (r.ctx.in_flight, r.transfers)), Some((1, 1)));
        assert_eq!(w.take().map(|r| r.ctx.in_flight), Some(4));
    }

    #[test]
    fn a_large_write_is_a_run_of_its_own() {
        let mut w = WriteRun::default();
        w.add(write(4096, 1), 0);
        let [ended, own] = w.add(write(Run::MAX_WRITE_BYTES, 1), 0);
        assert_eq!(ended.map(|r| r.ctx.bytes), Some(4096));
        assert_eq!(own.map(|r| r.transfers), Some(1));
        let [ended, own] = w.add(write(Run::MAX_WRITE_BYTES, 1), 0);
        assert!(ended.is_none());
        assert_eq!(own.map(|r| r.transfers), Some(1));
        assert!(w.take().is_none());
    }
}
