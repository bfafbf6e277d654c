//! The selector the measurer teaches: asked for choices, told measurements, its epochs
//! published without its lock.

use super::stream::Run;
use super::{keeping, Count, Measurer};
use fastensor_core::TransferContext;
use fastensor_select::{Choice, ContextKey, Epochs, Observation, Selector, SelectorStats};
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Duration;

/// How the selector takes a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Take {
    /// As an observation of its path.
    Observe,
    /// Only if it shows its path far behind the leader (see [`Selector::record_if_far`]):
    /// a warm-up, or a handle's first transfer, which pays one-off costs.
    IfFar,
}

impl Measurer {
    /// The selector, locked (one as built after a fork that caught it locked).
    pub(crate) fn selector(&self) -> MutexGuard<'_, Selector> {
        self.selector.lock_or(|| self.built_selector())
    }

    /// A selector as the engine was built with.
    fn built_selector(&self) -> Selector {
        let (config, dictionary) = &self.built;
        let mut selector =
            Selector::from_dictionary(dictionary, config.clone()).unwrap_or_else(|_| {
                let mut s = Selector::new(config.clone());
                s.set_fingerprint(dictionary.fingerprint.clone());
                s
            });
        selector.reuse_mut().set_keeping(keeping(&self.paths));
        selector
    }

    /// Chooses among `names` for `ctx`, staying on `stay` while exploring it (see
    /// [`Selector::choose_staying`]); with the selector's epochs after choosing.
    pub(crate) fn choose(
        &self,
        ctx: &TransferContext,
        names: &[&str],
        stay: Option<&str>,
    ) -> (Option<Choice>, Epochs) {
        let mut sel = self.selector();
        let choice = sel.choose_staying(ctx, names, stay);
        (choice, self.publish(&sel))
    }

    /// Makes the selector's epochs readable without its lock, and returns them.
    fn publish(&self, sel: &Selector) -> Epochs {
        let e = sel.epochs();
        self.epochs[0].store(e.state, Ordering::Release);
        self.epochs[1].store(e.choices, Ordering::Release);
        e
    }

    /// The selector's epochs as last published (a transfer reading them while another
    /// thread records may see the older ones: its answer is then one observation late).
    pub(crate) fn epochs(&self) -> Epochs {
        Epochs {
            state: self.epochs[0].load(Ordering::Acquire),
            choices: self.epochs[1].load(Ordering::Acquire),
        }
    }

    /// Counts a choice answered from a file's kept answers.
    pub(crate) fn count_reused(&self, exploring: bool) {
        self.count(Count::Reused);
        if exploring {
            self.count(Count::ReusedExploring);
        }
    }

    /// The selector's counters, the choices answered from kept answers included.
    pub(crate) fn stats(&self, sel: &Selector) -> SelectorStats {
        let mut stats = sel.stats();
        stats.choices += self.counted(Count::Reused);
        stats.explorations += self.counted(Count::ReusedExploring);
        stats
    }

    /// The backend the selector has found best for `ctx`, once that context is explored.
    pub(crate) fn best_for(&self, ctx: &TransferContext) -> Option<String> {
        self.selector()
            .choice_for(&ContextKey::of(ctx))
            .map(String::from)
    }

    /// Teaches the selector a measurement of `bytes` (none when `bytes` is 0): told the
    /// workload's current re-read rate first (see [`Reuse`](fastensor_select::Reuse)), its
    /// epochs published after.
    fn learn(&self, bytes: u64, teach: impl FnOnce(&mut Selector)) {
        if bytes == 0 {
            return;
        }
        let mut sel = self.selector();
        sel.reuse_mut().set_rate(self.counters.reread_rate());
        teach(&mut sel);
        self.publish(&sel);
    }

    /// Tells the selector a transfer of `bytes` through the candidate `path`, taken as
    /// `take` says: its wall time, and its CPU time when it was read.
    pub(super) fn record(
        &self,
        take: Take,
        ctx: &TransferContext,
        path: usize,
        bytes: u64,
        wall: Duration,
        cpu: Option<Duration>,
    ) {
        let backend = &self.paths[path].0;
        self.learn(bytes, |sel| match take {
            Take::IfFar => {
                // Unread: the candidate's last measured CPU cost per byte (as for a
                // transfer).
                let cpu = cpu.unwrap_or_else(|| {
                    Duration::from_nanos((sel.cpu_per_byte(ctx, backend) * bytes as f64) as u64)
                });
                sel.record_if_far(ctx, backend, Observation { bytes, wall, cpu });
            }
            Take::Observe => {
                // The fingerprint is cloned only when it gains a device (`add_location`
                // skips unknown and known ones), not on every transfer.
                let device = &ctx.location.device;
                if !device.is_empty()
                    && !sel
                        .fingerprint()
                        .devices
                        .iter()
                        .any(|d| &d.device == device)
                {
                    let mut fp = sel.fingerprint().clone();
                    fp.add_location(&ctx.location, &crate::profile::ThisMachine);
                    sel.set_fingerprint(fp);
                }
                match cpu {
                    Some(cpu) => sel.record(ctx, backend, Observation { bytes, wall, cpu }),
                    None => {
                        sel.record_wall_only(ctx, backend, bytes, wall);
                    }
                }
            }
        });
    }

    /// Records a run of reads or writes as one observation (a warm-up run only when it shows
    /// its path far behind the leader, see [`Run::warm_up`]).
    pub(super) fn record_run(&self, run: Run) {
        let Some(&(_, keeps_cache)) = self.paths.get(run.path) else {
            return;
        };
        let (take, wall) = if run.warm_up {
            match run.far_test_wall(keeps_cache) {
                Some(wall) => (Take::IfFar, wall),
                None => return,
            }
        } else {
            (Take::Observe, run.wall)
        };
        self.record(take, &run.ctx, run.path, run.bytes, wall, run.cpu());
    }
}
