//! Seeding an exploring context from the other size classes of the same context.
//!
//! A candidate measured in two or more of them gets a prediction from the cost model (see
//! `model`): its centre orders the exploration, and the candidate is ruled out when even its
//! most favourable value is beyond `elimination_factor` times the least favourable one of
//! the best candidate (within `MODEL_REACH` classes of a measurement). A candidate measured
//! only in the nearest explored class is ruled out when it cost there more than
//! `elimination_factor * 2^distance` times that class's leader (per-byte costs of
//! `latency + bytes * per_byte` change by at most 2x per doubling). Seeds are revised as the
//! other classes learn, until the candidate is measured here; a candidate never measured
//! anywhere is always explored, and never is every candidate ruled out.

use super::config::MODEL_REACH;
use super::model::{ClassCost, Prediction};
use super::state::{CandidateState, KeyState, Status};
use super::Selector;
use crate::ContextKey;
use std::collections::BTreeMap;

/// Whether a candidate's seed is open: no samples here, and never seeded or seeded from the
/// other classes (which may have learned more since).
fn open(c: &CandidateState) -> bool {
    c.samples.is_empty() && (c.status.seeded() || c.status == Status::Alive)
}

/// What the other size classes say of each candidate of a context: a prediction from the
/// cost model, and the median in the nearest explored class (with that class).
struct Evidence<'a> {
    predictions: BTreeMap<&'a str, Prediction>,
    nearest: BTreeMap<&'a str, f64>,
    nearest_explored: Option<(&'a ContextKey, &'a KeyState)>,
}

/// A seed: the candidate, its prior, and whether it is ruled out.
type Seed = (String, f64, bool);

impl Selector {
    /// Seeds (or revises the seeds of) the open candidates of the exploring context `key`.
    pub(super) fn seed(&mut self, key: &ContextKey) {
        if !self.config.inherit || !self.begin_seeding(key) {
            return;
        }
        let seeds = self.seeds(key);
        if !seeds.is_empty() {
            self.apply_seeds(key, seeds);
        }
    }

    /// Whether the seeds of `key` are to be (re)computed now: it is exploring, has an open
    /// candidate, and was not seeded since the last observation. Notes it as seeded now.
    fn begin_seeding(&mut self, key: &ContextKey) -> bool {
        // Seeds change only with what is recorded: once per observation is enough.
        let observations = self.stats.observations;
        let Some(state) = self.keys.get_mut(key) else {
            return false;
        };
        if state.choice().is_some()
            || state.seeded_at == Some(observations)
            || !state.candidates.values().any(open)
        {
            return false;
        }
        state.seeded_at = Some(observations);
        true
    }

    /// What the other size classes of `key` say of its candidates.
    fn evidence<'a>(&'a self, key: &ContextKey, state: &'a KeyState) -> Evidence<'a> {
        let objective = self.config.objective;
        // The other size classes, explored or not: classes explored side by side inform each
        // other from their first samples.
        let mut classes: Vec<(&ContextKey, &KeyState)> = self
            .keys
            .iter()
            .filter(|(k, _)| k.same_but_size(key) && *k != key)
            .collect();
        classes.sort_by_key(|(k, _)| k.size_class);
        let nearest_explored = classes
            .iter()
            .filter(|(_, s)| s.choice().is_some())
            .min_by_key(|(k, _)| (k.size_class.abs_diff(key.size_class), k.size_class))
            .copied();
        let target = key.size_class_start() as f64;
        let fair = |c: &&CandidateState| c.status != Status::DroppedFar;
        let mut evidence = Evidence {
            predictions: BTreeMap::new(),
            nearest: BTreeMap::new(),
            nearest_explored,
        };
        for name in state.candidates.keys() {
            let points: Vec<ClassCost> = classes
                .iter()
                .filter_map(|(k, s)| {
                    let c = s.candidates.get(name).filter(fair)?;
                    Some(ClassCost::new(k, &c.samples.estimate(objective)?))
                })
                .collect();
            if let Some(p) = Prediction::of(&points, key.size_class, target) {
                evidence.predictions.insert(name, p);
            }
            if let Some(est) = nearest_explored.and_then(|(_, s)| {
                s.candidates
                    .get(name)
                    .filter(fair)
                    .and_then(|c| c.samples.estimate(objective))
            }) {
                evidence.nearest.insert(name, est.median);
            }
        }
        evidence
    }

    /// The seeds of the open candidates of `key`, judged from the other classes' evidence
    /// (none when there is none).
    fn seeds(&self, key: &ContextKey) -> Vec<Seed> {
        let objective = self.config.objective;
        let state = &self.keys[key];
        let Evidence {
            mut predictions,
            nearest,
            nearest_explored,
        } = self.evidence(key, state);
        if predictions.is_empty() && nearest.is_empty() {
            return Vec::new();
        }
        // In a cold-read context of a re-reading workload, predictions are judged with the
        // next read included, as measured costs are (see `Reuse`).
        let rereading = self.reuse.applies_to(key);
        let cached = self.cached_cost(key);
        if let Some(cached) = cached {
            for (name, p) in predictions.iter_mut() {
                let (scale, shift) = self.reuse.adjustment(name, cached);
                let judge = |x: f64| x * scale + shift;
                (p.centre, p.low, p.high) = (judge(p.centre), judge(p.low), judge(p.high));
            }
        }
        let best_high = predictions.values().map(|p| p.high).min_by(f64::total_cmp);
        let margin = self.config.elimination_factor.max(1.0);
        let lead = nearest_explored.and_then(|(_, s)| s.leader(objective).map(|(_, e)| e.median));
        let distance = nearest_explored.map_or(60, |(k, _)| {
            i32::from(k.size_class.abs_diff(key.size_class)).min(60)
        });
        let limit = self.config.elimination_factor * 2f64.powi(distance);
        state
            .candidates
            .iter()
            .filter(|(_, c)| open(c))
            .filter_map(|(name, _)| {
                // Without a judged prediction, a path that keeps the page cache may still win
                // a re-reading cold read on its judged cost: it is explored.
                let spared = rereading && self.reuse.keeps(name);
                if let Some(p) = predictions.get(name.as_str()) {
                    let worse = p.reach <= MODEL_REACH
                        && best_high.is_some_and(|b| b > 0.0 && p.low > margin * b);
                    Some((
                        name.clone(),
                        p.centre,
                        worse && !(spared && cached.is_none()),
                    ))
                } else {
                    let median = *nearest.get(name.as_str())?;
                    let worse = lead.is_some_and(|l| l > 0.0 && median > limit * l);
                    Some((name.clone(), median, worse && !spared))
                }
            })
            .collect()
    }

    /// Sets the seeds of `key`'s candidates; never rules out every candidate.
    fn apply_seeds(&mut self, key: &ContextKey, seeds: Vec<Seed>) {
        let state = self.keys.get_mut(key).expect("present");
        let first = !state.candidates.values().any(|c| c.status.seeded());
        for (name, prior, worse) in seeds {
            if let Some(c) = state.candidates.get_mut(&name) {
                c.status = if worse {
                    Status::RuledOut { prior }
                } else {
                    Status::Unmeasured {
                        prior,
                        seeded: true,
                    }
                };
            }
        }
        // Never rule out every candidate: the one with the best prior stays.
        if state.candidates.values().all(CandidateState::is_dropped) {
            let priced = state.candidates.values_mut();
            let priced = priced.filter_map(|c| Some((c.status.prior()?, c)));
            if let Some((prior, c)) = priced.min_by(|a, b| a.0.total_cmp(&b.0)) {
                let seeded = c.status.seeded();
                c.status = Status::Unmeasured { prior, seeded };
            }
        }
        if first {
            self.stats.inherited_keys += 1;
        }
    }
}
