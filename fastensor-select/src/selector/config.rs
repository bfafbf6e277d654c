//! Every number that shapes a decision, in one place: the few public knobs of
//! [`SelectorConfig`] and the private constants, each with its reason. Measurement histories
//! behind them are in `docs/lab/selection.md`.

use crate::Objective;

/// How the selector explores. The defaults are the tested ones; the rest of the rules are
/// fixed (see the constants of this module).
#[derive(Debug, Clone, PartialEq)]
pub struct SelectorConfig {
    /// What to minimise.
    pub objective: Objective,
    /// Samples every surviving candidate gets in a context before the choice is made
    /// (default 3).
    pub min_samples: usize,
    /// Samples the leader and every contender (median within `separation_factor` of the
    /// leader's) get before the choice is made, so that noise does not pick the wrong one of
    /// two close candidates (default 6).
    pub confirm_samples: usize,
    /// A candidate whose best sample costs more than this times the leader's median is
    /// dropped at once; the cost model uses the same margin for a prediction (default 1.3).
    pub elimination_factor: f64,
    /// With `min_samples` each, a candidate all of whose samples are worse than all of the
    /// leader's, and whose median is worse by this factor, is dropped (default 1.1).
    pub separation_factor: f64,
    /// Unseen contexts are seeded from the other size classes of the same context (default
    /// on; see `seed`).
    pub inherit: bool,
}

impl Default for SelectorConfig {
    fn default() -> Self {
        SelectorConfig {
            objective: Objective::Time,
            min_samples: 3,
            confirm_samples: 6,
            elimination_factor: 1.3,
            separation_factor: 1.1,
            inherit: true,
        }
    }
}

/// Samples kept per candidate and context: enough for a robust median, few enough to follow
/// a device that changes.
pub(crate) const WINDOW: usize = 16;

/// An observation of the choice costing more than this times the slowest of its recent
/// samples is a slow one (the slowest, not the median: page-cache writes are bimodal).
pub(crate) const DRIFT_FACTOR: f64 = 1.5;

/// Slow observations in a row that explore the context again.
pub(crate) const DRIFT_COUNT: u32 = 5;

/// One outlier rarely costs more than this times a path's median: slow observations of the
/// choice beyond it are severe (far outside the noise, they need less evidence of drift), and
/// a candidate dropped within it of the choice may owe that to an outlier (it is looked at
/// again; one further behind is not, a look at a slow path costs much).
pub(crate) const OUTLIER: f64 = 3.0;

/// Severe slow observations in a row (beyond `OUTLIER` times the choice's median) that
/// explore the context again before `DRIFT_COUNT`.
pub(crate) const SEVERE_DRIFT_COUNT: usize = 2;

/// A choice gives way to a leader only when its judged median is more than this times the
/// leader's: a switch of path is not free (a page-cache stream re-ramps its readahead).
pub(crate) const SWITCH_MARGIN: f64 = 1.05;

/// Under the time objective, candidates whose medians lie within this factor of the lowest
/// are tied on time (the band within which the choice would not switch, [`SWITCH_MARGIN`]),
/// and the one that costs the least CPU leads (see `KeyState::leader`).
pub(crate) const CPU_TIE: f64 = SWITCH_MARGIN;

/// Transfers of the choice before the first re-look at the dropped candidates; each later
/// one waits twice as long, so looking stays a vanishing share of a long-lived context.
pub(crate) const RELOOK_AFTER: u32 = 64;

/// A measurement of a path warming up (not a fair sample) is recorded only beyond this times
/// the leader's median: a readahead ramp alone costs up to 2-3 times a warm read.
pub(crate) const FAR_WARM_UP: f64 = 4.0;

/// The cost model rules a candidate out only this many size classes (16x) or fewer from a
/// class where it was measured: further, one outlier would be extrapolated over every class.
pub(crate) const MODEL_REACH: u8 = 4;

/// The smallest relative uncertainty of a class's median in the cost model (it is taken as
/// twice the median absolute deviation otherwise): far extrapolations then rule out nothing.
pub(crate) const MIN_UNCERTAINTY: f64 = 0.1;
