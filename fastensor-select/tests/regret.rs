//! The regret of the simulated mixed workloads (see `examples/regret.rs`) stays within 5%.

#[path = "../examples/regret.rs"]
mod regret;

use fastensor_select::SelectorConfig;

#[test]
fn regret_over_1000_transfers_is_at_most_5_percent() {
    for seed in 1..=5 {
        let r = regret::simulate(1000, &regret::MODEL_SIZES, seed, SelectorConfig::default());
        println!("{r:?}");
        assert!(
            r.regret <= 0.05,
            "seed {seed}: regret {:.2}%",
            100.0 * r.regret
        );
        // Exploration is bounded: at most confirm_samples per candidate and context.
        assert!(r.explorations <= (r.contexts * 4 * 6) as u64);
    }
}

#[test]
fn regret_of_the_wide_and_the_growing_workloads_is_at_most_5_percent_on_average() {
    let wide: Vec<u64> = (12..=26).map(|k| 1u64 << k).collect();
    let growing: Vec<u64> = (12..=26).step_by(2).map(|k| 1u64 << k).collect();
    let mean = |run: &dyn Fn(u64) -> f64| (1..=5).map(run).sum::<f64>() / 5.0;
    let wide_regret =
        mean(&|seed| regret::simulate(1000, &wide, seed, SelectorConfig::default()).regret);
    let growing_regret = mean(&|seed| {
        regret::simulate_ascending(60, &growing, seed, SelectorConfig::default()).regret
    });
    assert!(wide_regret <= 0.05, "wide: {:.2}%", 100.0 * wide_regret);
    assert!(
        growing_regret <= 0.05,
        "growing: {:.2}%",
        100.0 * growing_regret
    );
}
