//! Exploration: which candidate to measure next, and successive elimination.

use super::config::SelectorConfig;
use super::state::{CandidateState, KeyState, Status};

impl KeyState {
    /// Successive elimination: drops every candidate clearly worse than the leader, on one
    /// sample (its best one beyond `elimination_factor` times the leader's median) or on
    /// `min_samples` each (fully separated and beyond `separation_factor`).
    pub(crate) fn eliminate(&mut self, cfg: &SelectorConfig) {
        let Some((leader, lead)) = self.leader(cfg.objective).map(|(n, e)| (n.to_owned(), e))
        else {
            return;
        };
        let judged: Vec<_> = self
            .candidates
            .values()
            .enumerate()
            .map(|(i, c)| self.judged(i, c, cfg.objective))
            .collect();
        for ((name, cand), est) in self.candidates.iter_mut().zip(judged) {
            let Some(est) = est else {
                continue;
            };
            if *name == leader || cand.is_dropped() {
                continue;
            }
            let far = est.min > cfg.elimination_factor * lead.median;
            let separated = est.n >= cfg.min_samples
                && lead.n >= cfg.min_samples
                && est.min > lead.max
                && est.median > cfg.separation_factor * lead.median;
            if far || separated {
                cand.status = Status::Dropped { prior: None };
            }
        }
    }

    /// The offered candidate to measure next, and whether that is an exploration: the
    /// surviving one with the fewest samples (ties: a `yardstick` first, then the best
    /// median or prior, then the name); `stay` while it still needs samples, past its first
    /// one only once every other survivor has one (a stream is measured in runs, where one
    /// path's side effects do not land in the next one's sample, and a path far behind is
    /// still dropped on one sample). Without a needy one, the best offered one.
    pub(crate) fn pick(
        &self,
        candidates: &[&str],
        stay: Option<&str>,
        yardstick: impl Fn(&str) -> bool,
        cfg: &SelectorConfig,
    ) -> (String, bool) {
        let offered = || {
            candidates
                .iter()
                .filter_map(|n| self.candidates.get(*n).map(|c| (*n, c)))
        };
        let alive = || offered().filter(|(_, c)| !c.is_dropped());
        let lead = self.leader(cfg.objective).map(|(_, e)| e);
        let needs =
            |n: &str, c: &CandidateState| c.samples.len() < self.required(n, c, lead.as_ref(), cfg);
        let by_rank = |a: &(&str, &CandidateState), b: &(&str, &CandidateState)| {
            a.1.rank(cfg.objective).total_cmp(&b.1.rank(cfg.objective))
        };
        let needy = alive().filter(|(n, c)| needs(n, c)).min_by(|a, b| {
            a.1.samples
                .len()
                .cmp(&b.1.samples.len())
                .then(yardstick(b.0).cmp(&yardstick(a.0)))
                .then(by_rank(a, b))
        });
        let all_others_measured =
            |name: &str| alive().all(|(n, c)| n == name || !c.samples.is_empty());
        let sticky = stay.and_then(|last| {
            alive().find(|(n, c)| {
                *n == last && needs(n, c) && (c.samples.is_empty() || all_others_measured(n))
            })
        });
        let exploring = needy.is_some();
        let pick = sticky
            .or(needy)
            .or_else(|| alive().min_by(by_rank))
            .or_else(|| offered().min_by(by_rank))
            .map_or(candidates[0], |(n, _)| n);
        (pick.to_owned(), exploring)
    }
}
