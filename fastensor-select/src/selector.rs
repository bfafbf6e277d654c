//! Exploration with successive elimination, exploitation with drift detection.

use crate::{ContextKey, Estimate, Fingerprint, Objective, Observation, Samples};
use fastensor_core::TransferContext;
use std::collections::BTreeMap;

/// How the selector explores and when it explores again.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectorConfig {
    /// What to minimise.
    pub objective: Objective,
    /// Samples every surviving candidate gets in a context before the choice is made
    /// (default 3).
    pub min_samples: usize,
    /// A candidate whose *best* sample costs more than this times the leader's median is
    /// dropped from the exploration at once (default 1.3).
    pub elimination_factor: f64,
    /// Once a candidate and the leader have `min_samples` each, the candidate is dropped when
    /// every sample of it is worse than every sample of the leader and its median is worse by
    /// this factor; a candidate closer than this factor to the leader is a contender and
    /// needs `confirm_samples` (default 1.1).
    pub separation_factor: f64,
    /// Samples the leader and every candidate within `separation_factor` of it get before
    /// the choice is made (default 6).
    pub confirm_samples: usize,
    /// Samples kept per candidate and context (default 16).
    pub window: usize,
    /// An observation of the chosen candidate costing more than this times the slowest of
    /// its recent samples counts as a slow one (default 1.5). Measured against the slowest
    /// rather than the median, a path whose cost is naturally bimodal (page-cache writes:
    /// a memory copy, or a wait for writeback) is not taken for a drifting one.
    pub drift_factor: f64,
    /// This many slow observations in a row explore the context again (default 5).
    pub drift_count: u32,
    /// Unseen contexts start from the nearest known size class of the same context: a
    /// candidate that cost there more than `elimination_factor * 2^(distance + 1)` times the
    /// leader is not explored (per-byte costs of `latency + size * rate` change by at most
    /// 2x per doubling of the size). Default on.
    pub inherit: bool,
}

impl Default for SelectorConfig {
    fn default() -> Self {
        SelectorConfig {
            objective: Objective::Time,
            min_samples: 3,
            elimination_factor: 1.3,
            separation_factor: 1.1,
            confirm_samples: 6,
            window: 16,
            drift_factor: 1.5,
            drift_count: 5,
            inherit: true,
        }
    }
}

/// One candidate's record in one context.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CandidateState {
    /// Recent samples.
    pub samples: Samples,
    /// Dropped from exploration (clearly worse than the leader, measured or inherited).
    pub eliminated: bool,
    /// Estimated cost taken from a neighbouring size class (orders the exploration).
    pub prior: Option<f64>,
}

/// Everything known about one context.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyState {
    /// Candidates by backend name.
    pub candidates: BTreeMap<String, CandidateState>,
    /// The chosen backend once exploration is over.
    pub choice: Option<String>,
    /// Slow observations of the choice in a row.
    pub drift_run: u32,
    /// The samples of that run of slow observations (not persisted).
    pub drift_samples: Samples,
    /// How many times drift restarted the exploration.
    pub reexplorations: u32,
}

impl KeyState {
    /// True when every surviving candidate has enough samples.
    fn settled(&self, cfg: &SelectorConfig) -> bool {
        let leader = self.leader(cfg.objective);
        self.candidates
            .values()
            .all(|c| c.eliminated || c.samples.len() >= Self::required(c, leader.as_ref(), cfg))
    }

    /// Samples a surviving candidate needs before the exploration ends: `min_samples`, or
    /// `confirm_samples` for a contender whose median is within `separation_factor` of the
    /// leader's (so that noise does not pick the wrong one of two close candidates).
    fn required(
        c: &CandidateState,
        leader: Option<&(String, Estimate)>,
        cfg: &SelectorConfig,
    ) -> usize {
        let min = cfg.min_samples.max(1);
        if c.samples.len() < min {
            return min;
        }
        match (leader, c.samples.estimate(cfg.objective)) {
            (Some((_, lead)), Some(est)) if est.median <= cfg.separation_factor * lead.median => {
                cfg.confirm_samples.max(min)
            }
            _ => min,
        }
    }

    fn estimate(&self, name: &str, objective: Objective) -> Option<Estimate> {
        self.candidates.get(name)?.samples.estimate(objective)
    }

    /// The surviving candidate with the lowest median (ties: name order).
    fn leader(&self, objective: Objective) -> Option<(String, Estimate)> {
        self.candidates
            .iter()
            .filter(|(_, c)| !c.eliminated)
            .filter_map(|(n, c)| c.samples.estimate(objective).map(|e| (n.clone(), e)))
            .min_by(|a, b| a.1.median.total_cmp(&b.1.median))
    }

    /// Explores again after the choice drifted, as cheaply as the evidence allows: the choice
    /// restarts from its recent (slow) samples; every other candidate keeps its old median as
    /// a prior and is measured again only when that prior is not clearly worse than the
    /// choice's new cost. When the whole device slowed down, everything is measured again;
    /// when only the choice degraded, only the candidates that can now beat it are.
    fn reexplore_after_drift(&mut self, choice: &str, cfg: &SelectorConfig) {
        let recent = std::mem::take(&mut self.drift_samples);
        let new_cost = recent.estimate(cfg.objective).map(|e| e.median);
        for (name, c) in self.candidates.iter_mut() {
            if name == choice {
                c.samples = recent.clone();
                c.eliminated = false;
                c.prior = None;
                continue;
            }
            let old = c
                .samples
                .estimate(cfg.objective)
                .map(|e| e.median)
                .or(c.prior);
            c.samples.clear();
            c.prior = old;
            c.eliminated = match (old, new_cost) {
                (Some(old), Some(new)) => old > cfg.elimination_factor * new,
                _ => false,
            };
        }
        self.choice = None;
        self.drift_run = 0;
    }
}

/// What [`Selector::choose`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The backend to use.
    pub backend: String,
    /// True while the context is being explored (this transfer is a measurement).
    pub exploring: bool,
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
}

impl Selector {
    /// A selector that knows nothing yet.
    pub fn new(config: SelectorConfig) -> Self {
        Selector {
            config,
            keys: BTreeMap::new(),
            fingerprint: Fingerprint::default(),
            stats: SelectorStats::default(),
            knobs: BTreeMap::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &SelectorConfig {
        &self.config
    }

    /// Changes the objective (the stored samples keep wall and CPU time, so nothing is lost).
    pub fn set_objective(&mut self, objective: Objective) {
        self.config.objective = objective;
        for state in self.keys.values_mut() {
            if state.settled(&self.config) {
                state.choice = state.leader(objective).map(|(n, _)| n);
            }
        }
    }

    /// Counters.
    pub fn stats(&self) -> SelectorStats {
        self.stats
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
        }
    }

    /// Tuned knob settings per backend, kept with the dictionary (see [`Dictionary::knobs`]).
    pub fn knobs(&self) -> &BTreeMap<String, BTreeMap<String, String>> {
        &self.knobs
    }

    /// Replaces the tuned knob settings.
    pub fn set_knobs(&mut self, knobs: BTreeMap<String, BTreeMap<String, String>>) {
        self.knobs = knobs;
    }

    /// The chosen backend of a context, once explored.
    pub fn choice_for(&self, key: &ContextKey) -> Option<&str> {
        self.keys.get(key)?.choice.as_deref()
    }

    /// Chooses among `candidates` (names of available backends able to do the transfer).
    /// `None` only when `candidates` is empty.
    pub fn choose(&mut self, ctx: &TransferContext, candidates: &[&str]) -> Option<Choice> {
        if candidates.is_empty() {
            return None;
        }
        self.stats.choices += 1;
        let key = ContextKey::of(ctx);
        self.ensure_key(&key);
        let state = self.keys.get_mut(&key).expect("key was just ensured");
        let mut added = false;
        for name in candidates {
            if !state.candidates.contains_key(*name) {
                state
                    .candidates
                    .insert((*name).to_string(), CandidateState::default());
                added = true;
            }
        }
        if added {
            state.choice = None;
        }
        self.inherit(&key);
        let cfg = &self.config;
        let state = self.keys.get_mut(&key).expect("key was just ensured");
        if let Some(choice) = &state.choice {
            if candidates.contains(&choice.as_str()) {
                return Some(Choice {
                    backend: choice.clone(),
                    exploring: false,
                });
            }
        }
        // Exploring (or the choice is not offered now): the surviving offered candidate with
        // the fewest samples; ties go to the best estimate, then the best prior, then name.
        let offered: Vec<(&str, &CandidateState)> = candidates
            .iter()
            .filter_map(|n| state.candidates.get(*n).map(|c| (*n, c)))
            .collect();
        let alive: Vec<&(&str, &CandidateState)> =
            offered.iter().filter(|(_, c)| !c.eliminated).collect();
        let leader = state.leader(cfg.objective);
        let needs: Vec<&&(&str, &CandidateState)> = alive
            .iter()
            .filter(|(_, c)| c.samples.len() < KeyState::required(c, leader.as_ref(), cfg))
            .collect();
        let rank = |c: &CandidateState| {
            c.samples
                .estimate(cfg.objective)
                .map(|e| e.median)
                .or(c.prior)
                .unwrap_or(f64::INFINITY)
        };
        let pick = if !needs.is_empty() {
            needs
                .iter()
                .min_by(|a, b| {
                    a.1.samples
                        .len()
                        .cmp(&b.1.samples.len())
                        .then(rank(a.1).total_cmp(&rank(b.1)))
                })
                .map(|(n, _)| *n)
        } else {
            // Every offered survivor is measured: the best of them.
            alive
                .iter()
                .map(|c| **c)
                .min_by(|a, b| rank(a.1).total_cmp(&rank(b.1)))
                .or_else(|| {
                    offered
                        .iter()
                        .copied()
                        .min_by(|a, b| rank(a.1).total_cmp(&rank(b.1)))
                })
                .map(|(n, _)| n)
        };
        let backend = pick.unwrap_or(candidates[0]).to_string();
        let exploring = !needs.is_empty();
        if exploring {
            self.stats.explorations += 1;
        }
        Some(Choice { backend, exploring })
    }

    /// Records what a transfer through `backend` cost.
    pub fn record(&mut self, ctx: &TransferContext, backend: &str, obs: Observation) {
        self.stats.observations += 1;
        let key = ContextKey::of(ctx);
        self.ensure_key(&key);
        let cfg = self.config.clone();
        let state = self.keys.get_mut(&key).expect("key was just ensured");
        let sample = obs.sample();
        let cost = cfg.objective.cost(sample);

        // Drift: the choice keeps running well above its estimate.
        if state.choice.as_deref() == Some(backend) {
            let slow = state
                .estimate(backend, cfg.objective)
                .is_some_and(|e| cost > cfg.drift_factor * e.max.max(e.median));
            if slow {
                // Held aside while the run lasts, so the yardstick does not move with it.
                state.drift_run += 1;
                state.drift_samples.push(sample, cfg.window);
                if state.drift_run >= cfg.drift_count.max(1) {
                    state.reexplore_after_drift(backend, &cfg);
                    state.reexplorations += 1;
                    self.stats.reexplorations += 1;
                }
                // The slow samples stand for the choice (after re-exploration) or join its
                // window when the run ends.
                return;
            }
            state.drift_run = 0;
            let held = std::mem::take(&mut state.drift_samples);
            if let Some(cand) = state.candidates.get_mut(backend) {
                for s in held.as_slice() {
                    cand.samples.push(*s, cfg.window);
                }
            }
        }

        let cand = state.candidates.entry(backend.to_string()).or_default();
        cand.samples.push(sample, cfg.window);
        cand.prior = None;

        if state.choice.is_none() {
            Self::eliminate(state, &cfg);
            if state.settled(&cfg) {
                state.choice = state.leader(cfg.objective).map(|(n, _)| n);
                state.drift_run = 0;
            }
        } else if state.settled(&cfg) {
            // Exploiting: keep the choice on the best median (the choice's own samples move).
            state.choice = state.leader(cfg.objective).map(|(n, _)| n);
        }
    }

    /// Successive elimination: drops the candidates clearly worse than the leader.
    fn eliminate(state: &mut KeyState, cfg: &SelectorConfig) {
        let Some((leader, lead)) = state.leader(cfg.objective) else {
            return;
        };
        for (name, cand) in state.candidates.iter_mut() {
            if *name == leader || cand.eliminated {
                continue;
            }
            let Some(est) = cand.samples.estimate(cfg.objective) else {
                continue;
            };
            let far = est.min > cfg.elimination_factor * lead.median;
            let separated = est.n >= cfg.min_samples
                && lead.n >= cfg.min_samples
                && est.min > lead.max
                && est.median > cfg.separation_factor * lead.median;
            if far || separated {
                cand.eliminated = true;
            }
        }
    }

    /// Creates the state of an unseen context.
    fn ensure_key(&mut self, key: &ContextKey) {
        if !self.keys.contains_key(key) {
            self.stats.keys += 1;
            self.keys.insert(key.clone(), KeyState::default());
        }
    }

    /// Seeds the unmeasured candidates of an exploring context from the nearest explored size
    /// class of the same context: their cost there orders the exploration, and a candidate
    /// that cost there more than `elimination_factor * 2^distance` times the leader is not
    /// explored.
    fn inherit(&mut self, key: &ContextKey) {
        if !self.config.inherit {
            return;
        }
        let objective = self.config.objective;
        let Some(state) = self.keys.get(key) else {
            return;
        };
        if state.choice.is_some()
            || !state
                .candidates
                .values()
                .any(|c| c.samples.is_empty() && !c.eliminated && c.prior.is_none())
        {
            return;
        }
        let neighbour = self
            .keys
            .iter()
            .filter(|(k, s)| k.same_but_size(key) && *k != key && s.choice.is_some())
            .min_by_key(|(k, _)| (k.size_class.abs_diff(key.size_class), k.size_class));
        let Some((nk, ns)) = neighbour else { return };
        let Some((_, lead)) = ns.leader(objective) else {
            return;
        };
        let distance = i32::from(nk.size_class.abs_diff(key.size_class)).min(60);
        let limit = self.config.elimination_factor * 2f64.powi(distance);
        let priors: Vec<(String, f64)> = ns
            .candidates
            .iter()
            .filter_map(|(n, c)| c.samples.estimate(objective).map(|e| (n.clone(), e.median)))
            .collect();
        let state = self.keys.get_mut(key).expect("present");
        let mut inherited = false;
        for (name, median) in priors {
            if let Some(c) = state.candidates.get_mut(&name) {
                if c.samples.is_empty() && !c.eliminated && c.prior.is_none() {
                    c.prior = Some(median);
                    inherited = true;
                    if lead.median > 0.0 && median > limit * lead.median {
                        c.eliminated = true;
                    }
                }
            }
        }
        if inherited {
            self.stats.inherited_keys += 1;
        }
    }

    /// Forgets everything measured (keeps the settings).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.stats = SelectorStats::default();
    }
}
