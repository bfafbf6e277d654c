//! The regret of the simulated mixed workload (see `examples/regret.rs`) stays within 5%.

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
