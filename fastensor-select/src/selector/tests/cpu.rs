//! CPU cost: wall-only records, ties on time, the CPU objective.

use super::*;

#[test]
fn a_wall_only_record_carries_the_last_measured_cpu_cost() {
    let mut s = Selector::new(SelectorConfig::default());
    let c = ctx(1 << 20);
    // Nothing measured yet: no CPU assumed.
    let none = s.record_wall_only(&c, "a", 1 << 20, Duration::from_micros(100));
    assert_eq!(none, Duration::ZERO);
    let obs = Observation {
        bytes: 1 << 20,
        wall: Duration::from_micros(100),
        cpu: Duration::from_nanos(2 << 20),
    };
    s.record(&c, "a", obs);
    // 2 ns per byte carried over to a transfer twice as big.
    let cpu = s.record_wall_only(&c, "a", 2 << 20, Duration::from_micros(200));
    assert_eq!(cpu, Duration::from_nanos(4 << 20));
    let key = ContextKey::of(&c);
    let samples = s.keys()[&key].candidates["a"].samples.as_slice().to_vec();
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[2].cpu_ns_per_byte, 2.0);
    assert_eq!(s.stats().observations, 3);
}

#[test]
fn cpu_cost_breaks_ties_on_time_and_decides_under_the_cpu_objective() {
    // (objective, backends as (name, wall ns, cpu ns), the choice, why)
    let cases = [
        (
            Objective::Time,
            [
                ("cached", 9_900_000, 1_400_000),
                ("direct", 10_000_000, 1_000_000),
            ],
            "direct",
            "`cached` is 1% faster but takes 40% more CPU: tied on time, `direct` leads",
        ),
        (
            Objective::Time,
            [
                ("cached", 8_000_000, 3_000_000),
                ("direct", 10_000_000, 1_000_000),
            ],
            "cached",
            "a path clearly faster wins whatever its CPU cost",
        ),
        (
            Objective::Cpu,
            [
                ("cached", 9_900_000, 1_400_000),
                ("direct", 10_000_000, 1_500_000),
            ],
            "cached",
            "under the CPU objective, ties on time do not matter",
        ),
    ];
    for (objective, backends, want, why) in cases {
        assert_eq!(chosen_by(objective, &backends), want, "{why}");
    }
}

/// The choice of a fresh selector for `objective` after exploring 4 MiB transfers through
/// `backends` (see `explore_with_cpu`).
fn chosen_by(objective: Objective, backends: &[(&'static str, u64, u64)]) -> String {
    let config = SelectorConfig {
        objective,
        ..SelectorConfig::default()
    };
    explore_with_cpu(&mut Selector::new(config), 4 << 20, backends)
}
