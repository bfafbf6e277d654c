//! What the selector knows of one context: a [`Phase`] and a [`Status`] per candidate.

use super::config::{SelectorConfig, CPU_TIE, SWITCH_MARGIN, WINDOW};
use crate::{Estimate, Objective, Samples};
use std::collections::BTreeMap;

/// Where a candidate stands in its context.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Status {
    /// In the running, measured like any other.
    #[default]
    Alive,
    /// In the running, not measured here yet; `prior` (cost per byte) orders the
    /// exploration. `seeded`: predicted by the other size classes, and revised as they learn
    /// until it is measured; otherwise its old median here (after drift or a re-look).
    Unmeasured {
        /// The expected cost.
        prior: f64,
        /// Whether it comes from the other size classes.
        seeded: bool,
    },
    /// Ruled out without a sample by the other size classes' prediction `prior` (revised as
    /// they learn).
    RuledOut {
        /// The predicted cost.
        prior: f64,
    },
    /// Dropped: clearly worse than the leader on its samples here, or on its old median
    /// `prior` after drift (then without samples).
    Dropped {
        /// The old median, when it has no samples.
        prior: Option<f64>,
    },
    /// Dropped on warm-up measurements only (see `Selector::record_if_far`): they rule it out
    /// here, but the other size classes do not take them as its cost.
    DroppedFar,
}

impl Status {
    /// Out of the running.
    pub fn is_dropped(self) -> bool {
        matches!(
            self,
            Status::RuledOut { .. } | Status::Dropped { .. } | Status::DroppedFar
        )
    }

    /// The cost that stands for it without samples.
    pub fn prior(self) -> Option<f64> {
        match self {
            Status::Unmeasured { prior, .. } | Status::RuledOut { prior } => Some(prior),
            Status::Dropped { prior } => prior,
            Status::Alive | Status::DroppedFar => None,
        }
    }

    /// The status of a candidate to be measured again from scratch, its old cost `prior`
    /// (when known) ordering the exploration.
    pub(crate) fn measured_anew(prior: Option<f64>) -> Status {
        prior.map_or(Status::Alive, |prior| Status::Unmeasured {
            prior,
            seeded: false,
        })
    }

    /// Whether its standing comes from the other size classes (and may be revised).
    pub fn seeded(self) -> bool {
        matches!(
            self,
            Status::Unmeasured { seeded: true, .. } | Status::RuledOut { .. }
        )
    }
}

/// One candidate's record in one context.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CandidateState {
    /// Recent samples.
    pub samples: Samples,
    /// Where it stands.
    pub status: Status,
}

impl CandidateState {
    /// Out of the running.
    pub fn is_dropped(&self) -> bool {
        self.status.is_dropped()
    }

    /// Its median, or its prior without samples.
    pub(crate) fn rank(&self, objective: Objective) -> f64 {
        self.samples
            .estimate(objective)
            .map(|e| e.median)
            .or(self.status.prior())
            .unwrap_or(f64::INFINITY)
    }
}

/// Exploring a context, or using its choice.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Phase {
    /// Measuring the candidates.
    #[default]
    Exploring,
    /// Using `choice`, watching it for drift.
    Exploiting {
        /// The chosen backend.
        choice: String,
        /// Transfers of the choice recorded since it was made.
        since: u32,
        /// Slow observations of the choice in a row, held aside while the run lasts.
        slow: Samples,
    },
}

/// Everything known about one context.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyState {
    /// Candidates by backend name.
    pub candidates: BTreeMap<String, CandidateState>,
    /// Exploring or exploiting.
    pub phase: Phase,
    /// How many times the context was explored again after its choice was made.
    pub reexplorations: u32,
    /// Re-looks taken (see `RELOOK_AFTER`); not persisted.
    pub(crate) looks: u32,
    /// `(scale, shift)` per candidate (in name order) applied to its costs when candidates
    /// are compared (the next read included, see [`Reuse`](crate::Reuse)); empty: as
    /// measured. Refreshed before every decision; not persisted.
    pub(crate) adjust: Vec<(f64, f64)>,
    /// The observation count when the candidates were last seeded: nothing to revise before
    /// another observation (not persisted).
    pub(crate) seeded_at: Option<u64>,
}

impl KeyState {
    /// The chosen backend, once explored.
    pub fn choice(&self) -> Option<&str> {
        match &self.phase {
            Phase::Exploiting { choice, .. } => Some(choice),
            Phase::Exploring => None,
        }
    }

    /// Makes `choice` the choice, starting its exploitation afresh.
    pub(crate) fn exploit(&mut self, choice: String) {
        self.phase = Phase::Exploiting {
            choice,
            since: 0,
            slow: Samples::default(),
        };
    }

    /// Makes the leader under `objective` the choice, unless it already is (nothing without
    /// a leader).
    pub(crate) fn exploit_leader(&mut self, objective: Objective) {
        if let Some((leader, _)) = self.leader(objective) {
            if self.choice() != Some(leader) {
                let leader = leader.to_owned();
                self.exploit(leader);
            }
        }
    }

    /// The estimate of the candidate at `index` (name order) as candidates are compared:
    /// its samples' estimate, adjusted by `adjust`.
    pub(crate) fn judged(
        &self,
        index: usize,
        c: &CandidateState,
        objective: Objective,
    ) -> Option<Estimate> {
        let e = c.samples.estimate(objective)?;
        Some(match self.adjust.get(index) {
            Some(&(scale, shift)) => e.scaled(scale, shift),
            None => e,
        })
    }

    /// `cost` of the candidate called `name` as candidates are compared.
    pub(crate) fn judged_cost(&self, name: &str, cost: f64) -> f64 {
        let index = self.candidates.keys().position(|n| n == name);
        match index.and_then(|i| self.adjust.get(i)) {
            Some(&(scale, shift)) => cost * scale + shift,
            None => cost,
        }
    }

    /// The judged median of the candidate called `name`.
    pub(crate) fn judged_median(&self, name: &str, objective: Objective) -> Option<f64> {
        let (i, (_, c)) = self
            .candidates
            .iter()
            .enumerate()
            .find(|(_, (n, _))| n.as_str() == name)?;
        self.judged(i, c, objective).map(|e| e.median)
    }

    /// The surviving candidate with the lowest judged median (ties: name order). Under the
    /// time objective, candidates whose medians are within [`CPU_TIE`] of the lowest are
    /// tied, and the tie goes to the one with the lowest median CPU cost per byte: the
    /// samples cannot tell those paths apart on time, and the one that takes less CPU leaves
    /// more of it to the transfers running beside it and to the application (a path's
    /// samples are taken among transfers through other paths, so they do not show how it
    /// does when every transfer takes it; `docs/lab/selection.md`).
    pub(crate) fn leader(&self, objective: Objective) -> Option<(&str, Estimate)> {
        let survivors = || {
            self.candidates
                .iter()
                .enumerate()
                .filter(|(_, (_, c))| !c.is_dropped())
                .filter_map(|(i, (n, c))| self.judged(i, c, objective).map(|e| (n.as_str(), c, e)))
        };
        // One pass for the lowest median and the next lowest: a second pass only on a tie.
        let mut best: Option<(&str, Estimate)> = None;
        let mut next = f64::INFINITY;
        for (n, _, e) in survivors() {
            match &best {
                Some((_, b)) if e.median >= b.median => next = next.min(e.median),
                _ => {
                    if let Some((_, b)) = &best {
                        next = next.min(b.median);
                    }
                    best = Some((n, e));
                }
            }
        }
        let (name, lead) = best?;
        let bound = CPU_TIE * lead.median;
        if objective != Objective::Time || next > bound {
            return Some((name, lead));
        }
        survivors()
            .filter(|s| s.2.median <= bound)
            .map(|(n, c, e)| (n, e, cpu_median(&c.samples)))
            .min_by(|a, b| a.2.total_cmp(&b.2).then(a.1.median.total_cmp(&b.1.median)))
            .map(|(n, e, _)| (n, e))
    }

    /// Samples the surviving candidate called `name` needs before the exploration ends:
    /// `min_samples`, or `confirm_samples` for a contender within `separation_factor` of the
    /// leader.
    pub(crate) fn required(
        &self,
        name: &str,
        c: &CandidateState,
        lead: Option<&Estimate>,
        cfg: &SelectorConfig,
    ) -> usize {
        let min = cfg.min_samples.max(1);
        if c.samples.len() < min {
            return min;
        }
        let index = self.candidates.keys().position(|n| n == name);
        let est = index.and_then(|i| self.judged(i, c, cfg.objective));
        match (lead, est) {
            (Some(lead), Some(est)) if est.median <= cfg.separation_factor * lead.median => {
                cfg.confirm_samples.max(min)
            }
            _ => min,
        }
    }

    /// True when every surviving candidate has the samples it needs.
    pub(crate) fn settled(&self, cfg: &SelectorConfig) -> bool {
        let lead = self.leader(cfg.objective).map(|(_, e)| e);
        self.candidates.iter().all(|(n, c)| {
            c.is_dropped() || c.samples.len() >= self.required(n, c, lead.as_ref(), cfg)
        })
    }

    /// Whether the leader is clearly better than the choice: lower by more than
    /// `SWITCH_MARGIN`, or the choice out of the running (false without a leader).
    pub(crate) fn choice_clearly_behind(&self, objective: Objective) -> bool {
        let Some((leader, lead)) = self.leader(objective) else {
            return false;
        };
        let Some(choice) = self.choice() else {
            return true;
        };
        if choice == leader {
            return false;
        }
        let alive = self.candidates.get(choice).is_some_and(|c| !c.is_dropped());
        let current = self.judged_median(choice, objective).filter(|_| alive);
        current.is_none_or(|current| current > SWITCH_MARGIN * lead.median)
    }
}

/// The median CPU cost per byte of the newest [`WINDOW`] of `samples` (0 without any),
/// sorted on the stack: no allocation.
fn cpu_median(samples: &Samples) -> f64 {
    let mut costs = [0.0f64; WINDOW];
    let mut n = 0;
    for s in samples.as_slice().iter().rev().take(WINDOW) {
        costs[n] = s.cpu_ns_per_byte;
        n += 1;
    }
    let costs = &mut costs[..n];
    costs.sort_unstable_by(f64::total_cmp);
    if costs.is_empty() {
        0.0
    } else {
        crate::estimate::median_sorted(costs)
    }
}
