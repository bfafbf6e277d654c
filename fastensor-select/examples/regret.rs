//! Regret of the selector on a simulated mixed workload, deterministic (virtual time).
//!
//! Four simulated backends with known per-call and per-byte costs (different for cold reads,
//! cached reads and writes) and 5% noise with rare 3x outliers; 1,000 transfers of mixed sizes,
//! directions and cache states (and a workload whose sizes grow, 60 transfers per size class,
//! where every new class is seeded from the explored smaller ones). Regret is the time spent,
//! exploration included, over the time of an oracle that knows the best backend of every
//! context and sees the same noise.
//!
//! `cargo run --release -p fastensor-select --example regret`
#![allow(dead_code)]

use fastensor_core::{CacheState, Direction, FileLocation, TransferContext};
use fastensor_select::{ContextKey, Observation, Selector, SelectorConfig};
use std::collections::BTreeMap;
use std::time::Duration;

/// A simulated backend: cost = per_call + bytes * per_byte, per kind of transfer.
#[derive(Debug, Clone)]
pub struct SimBackend {
    pub name: &'static str,
    /// (per-call µs, ns per byte) for cold reads, cached reads, writes; `None`: cannot.
    pub cold: Cost,
    pub cached: Cost,
    pub write: Option<Cost>,
}

impl SimBackend {
    fn cost_ns(&self, ctx: &TransferContext) -> Option<f64> {
        let (call_us, per_byte) = match (ctx.direction, ctx.cache) {
            (Direction::Write, _) => self.write?,
            (Direction::Read, CacheState::Cached) => self.cached,
            (Direction::Read, _) => self.cold,
        };
        Some(call_us * 1e3 + per_byte * ctx.bytes as f64)
    }
}

/// (per-call µs, ns per byte) of one kind of transfer.
type Cost = (f64, f64);

/// The simulated machine.
pub fn backends() -> Vec<SimBackend> {
    // (name, cold reads, cached reads, writes)
    let table: [(&str, Cost, Cost, Option<Cost>); 4] = [
        // page cache: cheap calls; cold reads limited by readahead; writes land in the cache.
        ("posix", (10.0, 0.50), (2.0, 0.10), Some((4.0, 0.30))),
        // O_DIRECT, parallel chunks: expensive calls, best device throughput, cache ignored.
        (
            "posix-direct",
            (70.0, 0.30),
            (70.0, 0.30),
            Some((70.0, 0.28)),
        ),
        // io_uring: middle ground.
        ("uring", (25.0, 0.33), (6.0, 0.12), Some((25.0, 0.31))),
        // mmap: read only; page faults make big cold reads slow.
        ("mmap", (3.0, 0.65), (1.5, 0.085), None),
    ];
    table
        .into_iter()
        .map(|(name, cold, cached, write)| SimBackend {
            name,
            cold,
            cached,
            write,
        })
        .collect()
}

/// splitmix64: a tiny deterministic generator.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The noise of transfer `i` on `backend`: the same for the selector and the oracle.
fn noise(seed: u64, i: usize, backend: usize) -> f64 {
    let mut r = Rng::new(seed ^ ((i as u64) << 8) ^ backend as u64 ^ 0xABCD_EF01);
    let _ = r.next_u64();
    let outlier = if r.unit() < 0.01 { 3.0 } else { 1.0 };
    // Roughly normal with 5% deviation (sum of uniforms).
    let g: f64 = (0..4).map(|_| r.unit()).sum::<f64>() - 2.0;
    (1.0 + 0.05 * g * 1.73).max(0.5) * outlier
}

/// One simulated transfer of a size drawn from `sizes`.
fn transfer(rng: &mut Rng, sizes: &[u64]) -> TransferContext {
    let base = sizes[(rng.next_u64() % sizes.len() as u64) as usize];
    transfer_of(rng, base)
}

/// One simulated transfer in the size class of `base`.
fn transfer_of(rng: &mut Rng, base: u64) -> TransferContext {
    // Stay in the size class: up to 1.9x the base.
    let bytes = (base as f64 * (1.0 + 0.9 * rng.unit())) as u64;
    let r = rng.unit();
    let (direction, cache) = if r < 0.4 {
        (Direction::Write, CacheState::Unknown)
    } else if r < 0.7 {
        (Direction::Read, CacheState::Cold)
    } else {
        (Direction::Read, CacheState::Cached)
    };
    TransferContext {
        cache,
        ..TransferContext::host(direction, bytes, FileLocation::new("ext4", "259:1"))
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct RegretReport {
    pub transfers: usize,
    pub contexts: usize,
    pub explorations: u64,
    pub spent_ns: f64,
    pub oracle_ns: f64,
    pub regret: f64,
    /// Part of the regret spent on exploring transfers.
    pub exploring_regret: f64,
    /// Contexts where the final choice is not the oracle's.
    pub wrong_choices: usize,
}

/// Runs `n` transfers with sizes drawn from `sizes` and returns the regret.
pub fn simulate(n: usize, sizes: &[u64], seed: u64, config: SelectorConfig) -> RegretReport {
    let mut rng = Rng::new(seed);
    let workload: Vec<TransferContext> = (0..n).map(|_| transfer(&mut rng, sizes)).collect();
    run(&workload, seed, config)
}

/// Runs `per_size` transfers of each of `sizes` in turn (a workload whose transfers grow, so
/// that every new size class meets explored smaller ones) and returns the regret.
pub fn simulate_ascending(
    per_size: usize,
    sizes: &[u64],
    seed: u64,
    config: SelectorConfig,
) -> RegretReport {
    let mut rng = Rng::new(seed);
    let workload: Vec<TransferContext> = sizes
        .iter()
        .flat_map(|&base| (0..per_size).map(move |_| base))
        .map(|base| transfer_of(&mut rng, base))
        .collect();
    run(&workload, seed, config)
}

/// Runs `workload` through a fresh selector and returns the regret.
fn run(workload: &[TransferContext], seed: u64, config: SelectorConfig) -> RegretReport {
    let n = workload.len();
    let sims = backends();

    // The oracle: per context, the backend with the least expected total time.
    let mut totals: BTreeMap<ContextKey, Vec<f64>> = BTreeMap::new();
    for ctx in workload {
        let t = totals
            .entry(ContextKey::of(ctx))
            .or_insert_with(|| vec![0.0; sims.len()]);
        for (b, sim) in sims.iter().enumerate() {
            t[b] += sim.cost_ns(ctx).unwrap_or(f64::INFINITY);
        }
    }
    let best = |t: &Vec<f64>| (0..t.len()).min_by(|a, b| t[*a].total_cmp(&t[*b])).unwrap();
    let oracle: BTreeMap<ContextKey, usize> =
        totals.iter().map(|(k, t)| (k.clone(), best(t))).collect();

    let mut selector = Selector::new(config);
    let (mut spent, mut oracle_ns, mut exploring_excess) = (0.0, 0.0, 0.0);
    for (i, ctx) in workload.iter().enumerate() {
        let names: Vec<&str> = sims
            .iter()
            .filter(|s| s.cost_ns(ctx).is_some())
            .map(|s| s.name)
            .collect();
        let choice = selector.choose(ctx, &names).expect("candidates");
        let b = sims.iter().position(|s| s.name == choice.backend).unwrap();
        let t = sims[b].cost_ns(ctx).unwrap() * noise(seed, i, b);
        spent += t;
        let o = oracle[&ContextKey::of(ctx)];
        let ot = sims[o].cost_ns(ctx).unwrap() * noise(seed, i, o);
        oracle_ns += ot;
        if choice.exploring {
            exploring_excess += t - ot;
        }
        let wall = Duration::from_nanos(t as u64);
        selector.record(
            ctx,
            &choice.backend,
            Observation {
                bytes: ctx.bytes,
                wall,
                cpu: wall / 4,
            },
        );
    }
    if std::env::var("DEBUG").is_ok() {
        for (k, o) in &oracle {
            let st = &selector.keys()[k];
            let cands: Vec<String> = st
                .candidates
                .iter()
                .map(|(n, c)| {
                    format!(
                        "{n}:{:.3}/{}{}",
                        c.samples
                            .estimate(fastensor_select::Objective::Time)
                            .map_or(0.0, |e| e.median),
                        c.samples.len(),
                        if c.is_dropped() { "x" } else { "" }
                    )
                })
                .collect();
            println!(
                "{k}: oracle {} choice {:?} [{}] totals {:?}",
                sims[*o].name,
                st.choice(),
                cands.join(" "),
                totals[k]
                    .iter()
                    .map(|t| (t / 1e6) as i64)
                    .collect::<Vec<_>>()
            );
        }
    }
    let wrong_choices = oracle
        .iter()
        .filter(|(k, o)| selector.choice_for(k) != Some(sims[**o].name))
        .count();
    RegretReport {
        transfers: n,
        contexts: oracle.len(),
        explorations: selector.stats().explorations,
        spent_ns: spent,
        oracle_ns,
        regret: spent / oracle_ns - 1.0,
        exploring_regret: exploring_excess / oracle_ns,
        wrong_choices,
    }
}

/// Typical tensor sizes of a model: a few size classes, repeated.
pub const MODEL_SIZES: [u64; 6] = [16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];

fn main() {
    if let Ok(seed) = std::env::var("ONE") {
        let r = simulate(
            1000,
            &MODEL_SIZES,
            seed.parse().unwrap(),
            SelectorConfig::default(),
        );
        println!("{r:?}");
        return;
    }
    if std::env::var("SWEEP").is_ok() {
        sweep();
        return;
    }
    let wide: Vec<u64> = (12..=26).map(|k| 1u64 << k).collect();
    let ascending: Vec<u64> = (12..=26).step_by(2).map(|k| 1u64 << k).collect();
    for (label, sizes, grow) in [
        ("model sizes (6 classes)", &MODEL_SIZES[..], false),
        ("log-uniform 4 KiB..64 MiB (15 classes)", &wide[..], false),
        (
            "ascending 4 KiB..64 MiB (8 classes x 60)",
            &ascending[..],
            true,
        ),
    ] {
        let mut regrets = Vec::new();
        for seed in 1..=5u64 {
            let r = if grow {
                simulate_ascending(60, sizes, seed, SelectorConfig::default())
            } else {
                simulate(1000, sizes, seed, SelectorConfig::default())
            };
            println!(
                "{label:42} seed {seed}: contexts {:3}  explorations {:4}  spent {:9.1} ms  oracle {:9.1} ms  regret {:5.2}% (exploring {:5.2}%)  wrong final choices {}",
                r.contexts,
                r.explorations,
                r.spent_ns / 1e6,
                r.oracle_ns / 1e6,
                100.0 * r.regret,
                100.0 * r.exploring_regret,
                r.wrong_choices
            );
            regrets.push(r.regret);
        }
        let mean = regrets.iter().sum::<f64>() / regrets.len() as f64;
        let max = regrets.iter().cloned().fold(f64::MIN, f64::max);
        println!(
            "{label:42} mean regret {:.2}%  max {:.2}%\n",
            100.0 * mean,
            100.0 * max
        );
    }
}

#[allow(unused)]
pub fn sweep() {
    for (e, s, c) in [
        (1.5, 1.1, 6),
        (1.5, 1.1, 3),
        (1.3, 1.1, 6),
        (1.3, 1.1, 3),
        (1.3, 1.05, 5),
        (2.0, 1.1, 6),
    ] {
        let cfg = SelectorConfig {
            elimination_factor: e,
            separation_factor: s,
            confirm_samples: c,
            ..SelectorConfig::default()
        };
        let m: Vec<f64> = (1..=5)
            .map(|seed| simulate(1000, &MODEL_SIZES, seed, cfg.clone()).regret)
            .collect();
        println!(
            "e {e} s {s} c {c}: {:?}",
            m.iter()
                .map(|r| (r * 1000.0).round() / 10.0)
                .collect::<Vec<_>>()
        );
    }
}
