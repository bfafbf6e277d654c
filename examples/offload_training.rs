//! A simulated training loop with activation offload, against the same loop with every
//! activation kept in memory.
//!
//! `cargo run --release --example offload_training -- DIR [--layers L] [--act-mb A]
//! [--iters N] [--pin BACKEND] [--write-mbps W] [--read-mbps R]`
//!
//! Forward: each of L layers computes an activation of A MiB (real CPU work over its bytes)
//! and puts it into an [`OffloadStore`] whose swap file is in DIR; backward gets them back in
//! reverse and computes over them again. Two sweeps:
//! 1. compute per layer = the layer's write time at W MB/s, budget from footprint/2 down to
//!    one activation: slowdown against the in-memory loop per footprint/budget ratio;
//! 2. budget = footprint/10, compute per layer from 2x the write time down to 0: how the
//!    stall grows as compute shrinks.

use fastensor::offload::{OffloadConfig, OffloadStore};
use fastensor::{Engine, HostBuffer};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

struct Args {
    dir: String,
    layers: usize,
    act: usize,
    iters: usize,
    pin: Option<String>,
    write_mbps: f64,
}

fn parse() -> Args {
    let mut a = Args {
        dir: String::new(),
        layers: 20,
        act: 16 * MIB,
        iters: 2,
        pin: None,
        write_mbps: 300.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut val = || it.next().expect("a value after the flag");
        match x.as_str() {
            "--layers" => a.layers = val().parse().expect("--layers N"),
            "--act-mb" => a.act = val().parse::<usize>().expect("--act-mb N") * MIB,
            "--iters" => a.iters = val().parse().expect("--iters N"),
            "--pin" => a.pin = Some(val()),
            "--write-mbps" => a.write_mbps = val().parse().expect("--write-mbps W"),
            _ if a.dir.is_empty() => a.dir = x,
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(!a.dir.is_empty(), "usage: offload_training DIR [flags]");
    a
}

/// Real CPU work: `bytes` of mixing arithmetic over `data` (cyclically), in place.
fn compute(data: &mut [u8], bytes: usize, seed: u64) -> u64 {
    let mut acc = seed | 1;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(data.len());
        for w in data[..n].chunks_exact_mut(8) {
            let x = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            let y = (x ^ acc)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(17);
            acc = acc.wrapping_add(y);
            w.copy_from_slice(&y.to_le_bytes());
        }
        left -= n;
    }
    acc
}

/// Bytes of `compute` per millisecond on this machine.
fn calibrate() -> f64 {
    let mut buf = vec![1u8; 64 * MIB];
    compute(&mut buf, 16 * MIB, 1);
    let t = Instant::now();
    std::hint::black_box(compute(&mut buf, 128 * MIB, 2));
    (128 * MIB) as f64 / (t.elapsed().as_secs_f64() * 1e3)
}

struct Run {
    iter: Duration,
    stall: Duration,
    peak: u64,
}

/// One loop; `store` None keeps everything in memory.
fn run(a: &Args, work: usize, store: Option<&OffloadStore>) -> Run {
    let mut total = Duration::ZERO;
    let before = store.map(|s| s.stats());
    for it in 0..a.iters + 1 {
        let t0 = Instant::now();
        let mut kept = Vec::new();
        let mut handles = Vec::new();
        let mut sum = 0u64;
        for l in 0..a.layers {
            let mut act = HostBuffer::new(a.act).expect("memory");
            sum ^= compute(&mut act, work, l as u64);
            match store {
                Some(s) => handles.push(s.put(act, format!("it{it}/layer{l}")).expect("put")),
                None => kept.push(act),
            }
        }
        for l in (0..a.layers).rev() {
            let mut act = match store {
                Some(s) => {
                    let h = handles.pop().expect("one per layer");
                    let act = s.get(&h).expect("get");
                    drop(h);
                    act
                }
                None => kept.pop().expect("one per layer"),
            };
            sum ^= compute(&mut act, work, l as u64);
        }
        std::hint::black_box(sum);
        if it > 0 {
            total += t0.elapsed(); // the first iteration warms up
        }
    }
    let n = a.iters as u32;
    match (store, before) {
        (Some(s), Some(b)) => {
            let st = s.stats();
            Run {
                iter: total / n,
                stall: (st.get_stall + st.put_wait - b.get_stall - b.put_wait) / (n + 1),
                peak: st.peak_held_bytes,
            }
        }
        _ => Run {
            iter: total / n,
            stall: Duration::ZERO,
            peak: (a.layers * a.act) as u64,
        },
    }
}

fn main() -> fastensor::Result<()> {
    let a = parse();
    let mut b = Engine::builder();
    if let Some(p) = &a.pin {
        b = b.pin(p.clone());
    }
    let engine = b.build()?;
    let per_ms = calibrate();
    let footprint = (a.layers * a.act) as u64;
    let io_ms = a.act as f64 / (a.write_mbps * 1e3);
    println!(
        "layers {} x {} MiB = footprint {} MiB; iters {}; backend {}; compute {:.0} MB/s; \
         nominal write time per layer {io_ms:.1} ms ({} MB/s)",
        a.layers,
        a.act / MIB,
        footprint / MIB as u64,
        a.iters,
        a.pin.as_deref().unwrap_or("auto"),
        per_ms / 1e3,
        a.write_mbps
    );
    println!(
        "{:>6} {:>10} {:>9} {:>8} {:>10} {:>10} {:>8} {:>10} {:>9} {:>6}",
        "sweep",
        "compute_ms",
        "budget_MB",
        "fp/bud",
        "iter_ms",
        "inmem_ms",
        "slowdn",
        "stall_ms",
        "peak_MB",
        "pk/bud"
    );
    let row = |sweep: &str, compute_ms: f64, budget: u64, base: &Run| -> fastensor::Result<f64> {
        let config = OffloadConfig::new(&a.dir, budget).prefetch_depth(4);
        let store = OffloadStore::new(&engine, config)?;
        let work = (compute_ms * per_ms) as usize;
        let r = run(&a, work, Some(&store));
        let slow = r.iter.as_secs_f64() / base.iter.as_secs_f64();
        println!(
            "{sweep:>6} {compute_ms:>10.1} {:>9.1} {:>8.1} {:>10.1} {:>10.1} {:>8.3} {:>10.1} {:>9.1} {:>6.2}",
            budget as f64 / MIB as f64,
            footprint as f64 / budget as f64,
            r.iter.as_secs_f64() * 1e3,
            base.iter.as_secs_f64() * 1e3,
            slow,
            r.stall.as_secs_f64() * 1e3,
            r.peak as f64 / MIB as f64,
            r.peak as f64 / budget as f64,
        );
        Ok(slow)
    };
    // Sweep 1: compute = write time; shrink the budget.
    let base = run(&a, (io_ms * per_ms) as usize, None);
    let mut best = 0.0f64;
    for tensors in [a.layers / 2, a.layers / 5, a.layers / 10, 2, 1] {
        let budget = (tensors.max(1) * a.act) as u64;
        let slow = row("budget", io_ms, budget, &base)?;
        if slow <= 1.10 {
            best = best.max(footprint as f64 / budget as f64);
        }
    }
    println!(
        "largest footprint/budget within 10% of in-memory at compute = write time: {best:.1}x"
    );
    // Sweep 2: budget = footprint / 10; shrink compute.
    let budget = footprint / 10;
    for f in [2.0, 1.0, 0.5, 0.25, 0.1, 0.0] {
        let ms = io_ms * f;
        let base = run(&a, (ms * per_ms) as usize, None);
        row("comp", ms, budget, &base)?;
    }
    Ok(())
}
