//! Deterministic tests of the selector's rules, on noiseless linear costs: the shared
//! contexts and cost shapes here, the tests by rule in the modules below.

use super::*;
use fastensor_core::{CacheState, Direction, FileLocation};
use model::LinearCost;
use std::time::Duration;

/// A write of `bytes` from host memory to an ext4 file.
fn ctx(bytes: u64) -> TransferContext {
    TransferContext::host(Direction::Write, bytes, FileLocation::new("ext4", "259:1"))
}

/// A read of `bytes` into host memory from an ext4 file whose pages are `cache`.
fn read_ctx(bytes: u64, cache: CacheState) -> TransferContext {
    TransferContext {
        direction: Direction::Read,
        cache,
        ..ctx(bytes)
    }
}

/// A backend costing `latency_ns + bytes * per_byte_ns` per transfer, without noise.
#[derive(Clone, Copy)]
struct Linear(&'static str, f64, f64);

impl Linear {
    fn observation(&self, bytes: u64) -> Observation {
        let wall = Duration::from_nanos((self.1 + self.2 * bytes as f64) as u64);
        Observation {
            bytes,
            wall,
            cpu: Duration::ZERO,
        }
    }
}

/// An observation of `bytes` bytes taking `ns` nanoseconds (no CPU time).
fn taking(bytes: u64, ns: u64) -> Observation {
    Observation {
        bytes,
        wall: Duration::from_nanos(ns),
        cpu: Duration::ZERO,
    }
}

/// Runs `n` transfers at `c`, each through the selector's choice among `names` and taking
/// `ns(&choice)` nanoseconds; returns the choices in order.
fn run_transfers(
    s: &mut Selector,
    c: &TransferContext,
    names: &[&str],
    n: usize,
    mut ns: impl FnMut(&Choice) -> u64,
) -> Vec<Choice> {
    (0..n)
        .map(|_| {
            let choice = s.choose(c, names).unwrap();
            s.record(c, &choice.backend, taking(c.bytes, ns(&choice)));
            choice
        })
        .collect()
}

/// How many of `choices` explored `name`.
fn explored(choices: &[Choice], name: &str) -> usize {
    choices
        .iter()
        .filter(|c| c.exploring && c.backend == name)
        .count()
}

/// Measures every backend `n` times at `bytes` (the class ends up explored).
fn measure_all(s: &mut Selector, bytes: u64, backends: &[Linear], n: usize) {
    for _ in 0..n {
        for b in backends {
            s.record(&ctx(bytes), b.0, b.observation(bytes));
        }
    }
    assert!(s.choice_for(&ContextKey::of(&ctx(bytes))).is_some());
}

/// Runs transfers of `bytes` through the selector until it stops exploring; returns the
/// backends it explored, in order.
fn explore(s: &mut Selector, bytes: u64, backends: &[Linear]) -> Vec<&'static str> {
    let names: Vec<&str> = backends.iter().map(|b| b.0).collect();
    let mut explored = Vec::new();
    for _ in 0..100 {
        let choice = s.choose(&ctx(bytes), &names).unwrap();
        if !choice.exploring {
            return explored;
        }
        let b = backends.iter().find(|b| b.0 == choice.backend).unwrap();
        explored.push(b.0);
        s.record(&ctx(bytes), b.0, b.observation(bytes));
    }
    panic!("still exploring after 100 transfers");
}

fn state(s: &Selector, bytes: u64) -> &KeyState {
    &s.keys()[&ContextKey::of(&ctx(bytes))]
}

/// Runs transfers of `bytes` until the exploration ends; each backend `(name, wall ns, cpu
/// ns)` costs the same every time. Returns the final choice.
fn explore_with_cpu(s: &mut Selector, bytes: u64, backends: &[(&'static str, u64, u64)]) -> String {
    let names: Vec<&str> = backends.iter().map(|b| b.0).collect();
    for _ in 0..100 {
        let choice = s.choose(&ctx(bytes), &names).unwrap();
        if !choice.exploring {
            return choice.backend.to_string();
        }
        let b = backends.iter().find(|b| b.0 == choice.backend).unwrap();
        let obs = Observation {
            bytes,
            wall: Duration::from_nanos(b.1),
            cpu: Duration::from_nanos(b.2),
        };
        s.record(&ctx(bytes), b.0, obs);
    }
    panic!("still exploring after 100 transfers");
}

mod cost_model;
mod cpu;
mod exploit;
mod rereads;
mod streams;
