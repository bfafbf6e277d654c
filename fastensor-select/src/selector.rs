//! The selector: per transfer context, explores the candidates, then uses the best one and
//! watches it for drift. Its parts by role: `state` (phases and statuses), `explore`,
//! `exploit` (drift, switch, re-looks), `seed` and `model` (unseen contexts from the other
//! size classes) and `config` (every number a decision uses).

mod config;
mod exploit;
mod explore;
mod model;
mod seed;
mod state;
#[cfg(test)]
mod tests;

pub use config::SelectorConfig;
pub use state::{CandidateState, KeyState, Phase, Status};

use crate::{ContextKey, Fingerprint, Objective, Observation, Reuse};
use config::{FAR_WARM_UP, WINDOW};
use exploit::{Drift, Next};
use fastensor_core::{CacheState, Direction, TransferContext};
use std::collections::BTreeMap;

/// What [`Selector::choose`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The backend to use.
    pub backend: String,
    /// True while the context is being explored (this transfer is a measurement).
    pub exploring: bool,
}

/// Counters that tell a caller when an answer of [`Selector::choose_staying`] may be reused
/// (see [`Selector::epochs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Epochs {
    /// Changes with everything that may change any answer: every observation recorded, a
    /// new context or candidate, a new objective. While it stays the same, the same
    /// question (context, candidates, `stay`) gets the same answer.
    pub state: u64,
    /// Changes whenever a context's choice is made, changed or dropped (exploration
    /// resumed). While it stays the same, a context whose answer was not an exploration
    /// gets the same answer for the same candidates, whatever `stay` is.
    pub choices: u64,
}

/// Counters of a selector's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SelectorStats {
    /// Choices made.
    pub choices: u64,
    /// Choices made while exploring.
    pub explorations: u64,
    /// Observations recorded.
    pub observations: u64,
    /// Contexts explored again after drift.
    pub reexplorations: u64,
    /// Contexts created.
    pub keys: u64,
    /// Times an exploring context was seeded from a neighbouring size class.
    pub inherited_keys: u64,
}

/// Chooses a backend per transfer context: explores every candidate a few times with
/// successive elimination, then uses the best one, and explores again when it drifts.
/// It sees only backend names, contexts and observations.
#[derive(Debug, Clone)]
pub struct Selector {
    config: SelectorConfig,
    keys: BTreeMap<ContextKey, KeyState>,
    fingerprint: Fingerprint,
    stats: SelectorStats,
    knobs: BTreeMap<String, BTreeMap<String, String>>,
    /// The key of the last transfer, kept so that the next one's is built in its buffers.
    spare_key: Option<ContextKey>,
    /// What is known of re-reads.
    reuse: Reuse,
    /// See [`Selector::epochs`].
    epochs: Epochs,
}

impl Selector {
    /// A selector that knows nothing yet.
    pub fn new(config: SelectorConfig) -> Self {
        Self::from_parts(config, BTreeMap::new(), Fingerprint::default())
    }

    /// The settings.
    pub fn config(&self) -> &SelectorConfig {
        &self.config
    }

    /// Changes the objective (the stored samples keep wall and CPU time, so nothing is lost).
    pub fn set_objective(&mut self, objective: Objective) {
        self.config.objective = objective;
        self.epochs.state += 1;
        self.epochs.choices += 1;
        for state in self.keys.values_mut() {
            if state.settled(&self.config) {
                state.exploit_leader(objective);
            }
        }
    }

    /// Counters.
    pub fn stats(&self) -> SelectorStats {
        self.stats
    }

    /// Counters that change when an answer of [`Selector::choose_staying`] may change, so
    /// that a caller choosing per transfer can keep an answer and ask again only when they
    /// moved (choosing costs a few hundred nanoseconds, a cached 4 KiB read about one
    /// microsecond). Read them after choosing: choosing may change them itself (a new
    /// context or candidate).
    pub fn epochs(&self) -> Epochs {
        self.epochs
    }

    /// Every known context.
    pub fn keys(&self) -> &BTreeMap<ContextKey, KeyState> {
        &self.keys
    }

    /// The machine the measurements belong to.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// Sets the machine the measurements belong to.
    pub fn set_fingerprint(&mut self, fingerprint: Fingerprint) {
        self.fingerprint = fingerprint;
    }

    pub(crate) fn from_parts(
        config: SelectorConfig,
        keys: BTreeMap<ContextKey, KeyState>,
        fingerprint: Fingerprint,
    ) -> Self {
        Selector {
            config,
            keys,
            fingerprint,
            stats: SelectorStats::default(),
            knobs: BTreeMap::new(),
            spare_key: None,
            reuse: Reuse::default(),
            epochs: Epochs::default(),
        }
    }

    /// Tuned knob settings per backend, kept with the dictionary (see [`Dictionary::knobs`](crate::Dictionary::knobs)).
    pub fn knobs(&self) -> &BTreeMap<String, BTreeMap<String, String>> {
        &self.knobs
    }

    /// Replaces the tuned knob settings.
    pub fn set_knobs(&mut self, knobs: BTreeMap<String, BTreeMap<String, String>>) {
        self.knobs = knobs;
    }

    /// The chosen backend of a context, once explored.
    pub fn choice_for(&self, key: &ContextKey) -> Option<&str> {
        self.keys.get(key)?.choice()
    }

    /// The key of `ctx`, built in the buffers of the last transfer's key (so that a
    /// transfer's key allocates nothing once the strings have grown to size).
    fn key_of(&mut self, ctx: &TransferContext) -> ContextKey {
        match self.spare_key.take() {
            Some(mut key) => {
                key.set_to(ctx);
                key
            }
            None => ContextKey::of(ctx),
        }
    }

    /// Chooses among `candidates` (names of available backends able to do the transfer).
    /// `None` only when `candidates` is empty.
    pub fn choose(&mut self, ctx: &TransferContext, candidates: &[&str]) -> Option<Choice> {
        self.choose_staying(ctx, candidates, None)
    }

    /// [`Selector::choose`], but while exploring, `stay` (the candidate of the transfer
    /// before, when it is among `candidates`) is chosen again as long as it still needs
    /// samples, past its first one only once every other surviving candidate has one: for
    /// transfers whose cost depends on the one before (a stream's readahead, a mapping's
    /// faults), each candidate is measured over a run rather than in alternation.
    pub fn choose_staying(
        &mut self,
        ctx: &TransferContext,
        candidates: &[&str],
        stay: Option<&str>,
    ) -> Option<Choice> {
        if candidates.is_empty() {
            return None;
        }
        self.stats.choices += 1;
        let key = self.key_of(ctx);
        let choice = self.choose_in(&key, candidates, stay);
        self.spare_key = Some(key);
        Some(choice)
    }

    /// [`Selector::choose`] in the context `key`, `candidates` not empty.
    fn choose_in(&mut self, key: &ContextKey, candidates: &[&str], stay: Option<&str>) -> Choice {
        if self.ensure_key(key) {
            self.epochs.state += 1;
        }
        let state = self.keys.get_mut(key).expect("key was just ensured");
        let mut added = false;
        for name in candidates {
            if !state.candidates.contains_key(*name) {
                let fresh = CandidateState::default();
                state.candidates.insert((*name).to_string(), fresh);
                added = true;
            }
        }
        if added {
            // A new candidate is explored: the choice is no longer made.
            if state.choice().is_some() {
                state.phase = Phase::Exploring;
                self.epochs.choices += 1;
            }
            state.seeded_at = None;
            self.epochs.state += 1;
        }
        self.seed(key);
        self.refresh_adjust(key);
        let state = &self.keys[key];
        if let Some(choice) = state.choice() {
            if candidates.contains(&choice) {
                return Choice {
                    backend: choice.to_owned(),
                    exploring: false,
                };
            }
        }
        // A cold read explored from scratch measures a path that bypasses the page cache
        // first: the yardstick against which a page-cache path's first (warm-up) reads can
        // rule it out (see `record_if_far`).
        let from_scratch = state.leader(self.config.objective).is_none()
            && key.direction == Direction::Read
            && key.cache == CacheState::Cold;
        let yardstick = |name: &str| from_scratch && !self.reuse.keeps(name);
        let (backend, exploring) = state.pick(candidates, stay, yardstick, &self.config);
        if exploring {
            self.stats.explorations += 1;
        }
        Choice { backend, exploring }
    }

    /// Records what a transfer through `backend` cost.
    pub fn record(&mut self, ctx: &TransferContext, backend: &str, obs: Observation) {
        self.stats.observations += 1;
        let key = self.key_of(ctx);
        self.record_in(&key, backend, obs);
        self.spare_key = Some(key);
    }

    /// Records `obs` only when it shows `backend` far behind the context's leader (another
    /// candidate): more than 4 times its median, as judged (see `KeyState::adjust`).
    /// Returns whether it was recorded. For measurements that are not fair samples of the
    /// backend but still tell a slow one: the reads of a path warming up in a stream pay
    /// for the switch (a readahead ramp costs up to 2-3 times a warm read), so only a cost
    /// beyond that rules the path out, without measuring it warm.
    pub fn record_if_far(
        &mut self,
        ctx: &TransferContext,
        backend: &str,
        obs: Observation,
    ) -> bool {
        let key = self.key_of(ctx);
        self.ensure_key(&key);
        self.refresh_adjust(&key);
        let objective = self.config.objective;
        let state = &self.keys[&key];
        let far = state.leader(objective).is_some_and(|(leader, lead)| {
            let cost = state.judged_cost(backend, objective.cost(obs.sample()));
            leader != backend && cost > FAR_WARM_UP * lead.median
        });
        if far {
            let fair_before = state
                .candidates
                .get(backend)
                .is_some_and(|c| !c.samples.is_empty() && c.status != Status::DroppedFar);
            self.stats.observations += 1;
            self.record_in(&key, backend, obs);
            if let Some(c) = self
                .keys
                .get_mut(&key)
                .and_then(|s| s.candidates.get_mut(backend))
            {
                if !fair_before && c.is_dropped() {
                    c.status = Status::DroppedFar;
                }
            }
        }
        self.spare_key = Some(key);
        far
    }

    /// Records a transfer through `backend` whose CPU time was not read: its CPU cost per
    /// byte is taken to be the candidate's last measured one in this context (0 when none).
    /// Returns the CPU time so assumed. The engine reads the process CPU clock on exploring
    /// transfers and on a share of the others only (see `Engine`), since reading it costs
    /// as much as a small cached read.
    pub fn record_wall_only(
        &mut self,
        ctx: &TransferContext,
        backend: &str,
        bytes: u64,
        wall: std::time::Duration,
    ) -> std::time::Duration {
        self.stats.observations += 1;
        let key = self.key_of(ctx);
        let cpu_per_byte = self.cpu_per_byte_in(&key, backend);
        let cpu = std::time::Duration::from_nanos((cpu_per_byte * bytes.max(1) as f64) as u64);
        let obs = Observation { bytes, wall, cpu };
        self.record_in(&key, backend, obs);
        self.spare_key = Some(key);
        cpu
    }

    /// The CPU nanoseconds per byte of `backend`'s last sample in the context of `ctx` (0
    /// when it has none): what a transfer whose CPU time was not read is taken to cost.
    pub fn cpu_per_byte(&mut self, ctx: &TransferContext, backend: &str) -> f64 {
        let key = self.key_of(ctx);
        let cpu = self.cpu_per_byte_in(&key, backend);
        self.spare_key = Some(key);
        cpu
    }

    /// [`Selector::cpu_per_byte`] in the context `key`.
    fn cpu_per_byte_in(&self, key: &ContextKey, backend: &str) -> f64 {
        self.keys
            .get(key)
            .and_then(|s| s.candidates.get(backend))
            .and_then(|c| c.samples.as_slice().last())
            .map_or(0.0, |s| s.cpu_ns_per_byte)
    }

    /// Re-reads: the share of first-read bytes read again, and which candidates keep read
    /// bytes in the page cache (see [`Reuse`]).
    pub fn reuse_mut(&mut self) -> &mut Reuse {
        self.epochs.state += 1;
        &mut self.reuse
    }

    /// For a cold-read context of a re-reading workload (see [`Reuse`]): the best cached
    /// read's cost per byte, in this size class or else in the nearest one measured (reads
    /// from the page cache cost about the same per byte across sizes, and a class read cold
    /// through a direct path is never seen cached). `None` elsewhere, or when unknown.
    fn cached_cost(&self, key: &ContextKey) -> Option<f64> {
        if !self.reuse.applies_to(key) {
            return None;
        }
        self.keys
            .iter()
            .filter(|(k, _)| k.cache == CacheState::Cached && k.same_but_size_and_cache(key))
            .filter_map(|(k, s)| {
                let (_, e) = s.leader(self.config.objective)?;
                Some((k.size_class.abs_diff(key.size_class), e.median))
            })
            .min_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, median)| median)
    }

    /// Refreshes [`KeyState::adjust`] of `key` from what is known of re-reads.
    fn refresh_adjust(&mut self, key: &ContextKey) {
        let cached = self.cached_cost(key);
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        state.adjust.clear();
        if let Some(cached) = cached {
            // Refilled in place: no allocation once the list has grown to size.
            let reuse = &self.reuse;
            state.adjust.extend(
                state
                    .candidates
                    .keys()
                    .map(|name| reuse.adjustment(name, cached)),
            );
        }
    }

    /// Whether a transfer's CPU time must be read for the objective (it costs something).
    pub fn objective_uses_cpu(&self) -> bool {
        !matches!(self.config.objective, Objective::Time)
    }

    /// [`Selector::record`] in the context `key`.
    fn record_in(&mut self, key: &ContextKey, backend: &str, obs: Observation) {
        self.ensure_key(key);
        self.refresh_adjust(key);
        self.epochs.state += 1;
        let cfg = &self.config;
        let state = self.keys.get_mut(key).expect("key was just ensured");
        let sample = obs.sample();
        let of_choice = state.choice() == Some(backend);
        if of_choice {
            match state.watch(sample, cfg) {
                Drift::Steady => {}
                Drift::Held => return,
                Drift::Reexplored => {
                    self.stats.reexplorations += 1;
                    self.epochs.choices += 1;
                    return;
                }
            }
        }
        let cand = match state.candidates.get_mut(backend) {
            Some(cand) => cand,
            None => state.candidates.entry(backend.to_owned()).or_default(),
        };
        cand.samples.push(sample, WINDOW);
        // Measured here: whatever stood for it without samples is gone.
        cand.status = if cand.is_dropped() {
            Status::Dropped { prior: None }
        } else {
            Status::Alive
        };
        let changed = match state.phase {
            Phase::Exploring => {
                state.eliminate(cfg);
                let settled = state.settled(cfg);
                if settled {
                    state.exploit_leader(cfg.objective);
                }
                settled
            }
            Phase::Exploiting { .. } => match state.after_sample(of_choice, cfg) {
                Next::Stay => false,
                Next::Switched => true,
                Next::Explore => {
                    self.stats.reexplorations += 1;
                    true
                }
            },
        };
        if changed {
            self.epochs.choices += 1;
        }
    }

    /// Creates the state of an unseen context; returns whether it did.
    fn ensure_key(&mut self, key: &ContextKey) -> bool {
        let new = !self.keys.contains_key(key);
        if new {
            self.stats.keys += 1;
            self.keys.insert(key.clone(), KeyState::default());
        }
        new
    }

    /// Forgets everything measured (keeps the settings).
    pub fn clear(&mut self) {
        self.epochs.state += 1;
        self.epochs.choices += 1;
        self.keys.clear();
        self.stats = SelectorStats::default();
    }
}
