//! `auto` against every fixed backend, in one run, on a real disk.
//!
//! `cargo run --release --example auto_vs_fixed -- DIR [--quick] [--rounds N] [--verbose]
//! [--only WORKLOAD]`
//!
//! `--verbose` prints every run's phases and both `auto` engines' reports after each of
//! their runs (on stderr). `--only` runs one workload (`4 KiB`, `64 KiB`, `1 MiB`, `8 MiB` or
//! `mixed`).
//!
//! For each size class, and then for a shuffled mix of all sizes, every engine (one per fixed
//! backend, then `auto` from a cold start, then `auto` warm with what the cold run learned)
//! runs three timed phases on its own file in DIR:
//!
//! * `write`: the whole file in transfers of the size (not synced inside the timing; the file
//!   is synced and its page cache dropped, untimed, afterwards);
//! * `cold`: read it all back from the device;
//! * `cached`: read it all again (now mostly cached, for page-cache backends).
//!
//! Files stay until every contender has run a workload; then they are removed and the
//! system is synced and left 2 s (on a file system mounted with `discard`, freeing a big
//! file keeps the device busy, which must not fall on the next contender's phases).
//!
//! The whole run is repeated `--rounds` times (default 12), each round with a new cold-start
//! `auto` engine (so every round pays for its exploration) and a warm one built from the
//! profile the previous round's cold-start engine saved (before the first round, a cold-start
//! engine runs every workload once, untimed, to make the first profile). Every contender,
//! both `auto` engines included, runs each workload in turn, in an order that changes from
//! round to round so that all meet the same disk conditions, in every position and after
//! every other contender alike (see `balanced_order`; every 6 rounds balance 6 contenders
//! fully). Each phase's median over the rounds is reported, and each total is the median of
//! the rounds' totals (this disk's speed swings between rounds).
//! Ratios are time / time of the best fixed backend of the same row (lower is better), and
//! the total ratios of both `auto` engines and of the next fixed backend come with 90%
//! bootstrap intervals: the next fixed backend's shows how far apart the disk's noise puts
//! two paths. With 6 rounds, `uring` and `posix-direct` (one request at a time, both
//! `O_DIRECT`) came out more than 5% apart at 1 MiB or 8 MiB in 8 of 32 class results, so
//! a goal of 5% needs more rounds than that.
//! `mmap` cannot write: its write phase uses `posix` and it is left out of the mixed total.

use fastensor::engine::evict;
use fastensor::{Engine, EngineFile, OpenMode};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One engine configuration.
struct Contender {
    label: String,
    engine: Engine,
}

#[derive(Debug, Clone, Copy, Default)]
struct Phases {
    write: Duration,
    cold: Duration,
    cached: Duration,
}

impl Phases {
    fn total(&self) -> Duration {
        self.write + self.cold + self.cached
    }
}

/// A small deterministic generator (splitmix64): the mix's order and the bootstrap's draws
/// are the same from run to run.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The transfers of one workload: (offset, length).
fn layout(sizes: &[(usize, usize)], seed: u64) -> Vec<(u64, usize)> {
    let mut items: Vec<usize> = sizes
        .iter()
        .flat_map(|&(s, n)| std::iter::repeat_n(s, n))
        .collect();
    // Deterministic shuffle.
    let mut rng = SplitMix(seed);
    for i in (1..items.len()).rev() {
        let j = rng.below(i + 1);
        items.swap(i, j);
    }
    let mut off = 0u64;
    items
        .into_iter()
        .map(|s| {
            let o = off;
            off += s as u64;
            (o, s)
        })
        .collect()
}

fn run(
    engine: &Engine,
    write_engine: &Engine,
    path: &Path,
    work: &[(u64, usize)],
    buf: &mut [u8],
) -> fastensor::Result<Phases> {
    let mut p = Phases::default();
    {
        let file: EngineFile = write_engine.open(path, OpenMode::Truncate)?;
        let t = Instant::now();
        for &(off, len) in work {
            file.write_at(off, &buf[..len])?;
        }
        p.write = t.elapsed();
        file.sync()?;
    }
    evict(path)?;
    let file = engine.open(path, OpenMode::Read)?;
    let t = Instant::now();
    for &(off, len) in work {
        let n = file.read_at(off, &mut buf[..len])?;
        assert_eq!(n, len);
    }
    p.cold = t.elapsed();
    let t = Instant::now();
    for &(off, len) in work {
        file.read_at(off, &mut buf[..len])?;
    }
    p.cached = t.elapsed();
    Ok(p)
}

/// The order of `k` contenders in round `round`: a Williams design, a Latin square balanced
/// for what runs just before. Over `k` rounds (`2k` when `k` is odd) every contender runs
/// once in every position and right after every other one once. A plain rotation balanced
/// the positions only and kept one neighbour before each contender in all rounds but one,
/// and on this machine the contender before matters: page-cache writes right after
/// another contender that used the page cache run up to 6x faster than into memory not used
/// for a while (virtio-balloon free page reporting; 8 MiB writes 3.3 ms against 19.7), so
/// `posix`, which ran right after `mmap` (whose writes go through `posix`), wrote 1 GiB in
/// 0.40-0.44 s in the four rounds where it did and 1.27 s in the one where it ran first.
fn balanced_order(k: usize, round: usize) -> Vec<usize> {
    // First row: 0, 1, k-1, 2, k-2, ...; row r adds r (mod k).
    let mut first = vec![0];
    let (mut low, mut high) = (1, k.saturating_sub(1));
    while first.len() < k {
        if first.len() % 2 == 1 {
            first.push(low);
            low += 1;
        } else {
            first.push(high);
            high -= 1;
        }
    }
    let mut row: Vec<usize> = first.iter().map(|&i| (i + round) % k).collect();
    if (round / k) % 2 == 1 {
        row.reverse();
    }
    row
}

/// Removes the files of a workload, then syncs and waits: this file system may be mounted
/// with online `discard`, and freeing a 1 GiB file keeps the device busy for a moment,
/// which must not fall on the next contender's phases.
fn clean_up(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".auto_vs_fixed-") && name.ends_with(".bin") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    rustix::fs::sync();
    std::thread::sleep(Duration::from_secs(2));
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-12)
}

/// One contender's rounds on one workload, summed up.
struct Summary {
    /// Each phase's median over the rounds.
    phases: Phases,
    /// The median of the rounds' totals. Not the sum of the phase medians: an engine that
    /// adapts trades its phases against each other within a round (a page-cache write
    /// leaves cheap re-reads and a slow cold read, a direct write the opposite), so the
    /// medians of its phases can come from different rounds and add up to a round it never
    /// ran (`auto`'s 1 MiB in one run: rounds of 496-843 ms, median 685, phase medians
    /// summing to 748).
    total: Duration,
}

impl Summary {
    fn of(rounds: &[Phases]) -> Self {
        let m = |f: fn(&Phases) -> Duration| median(rounds.iter().map(f).collect());
        Summary {
            phases: Phases {
                write: m(|p| p.write),
                cold: m(|p| p.cold),
                cached: m(|p| p.cached),
            },
            total: m(Phases::total),
        }
    }
}

/// The ratio of the median total of `ours` to that of `theirs`, with a 90% bootstrap
/// interval: rounds drawn with replacement, the same rounds for both (the contenders of a
/// round share its disk conditions), 2000 times.
fn ratio_interval(ours: &[Phases], theirs: &[Phases], rng: &mut SplitMix) -> (f64, f64, f64) {
    let n = ours.len().min(theirs.len());
    let median_of =
        |v: &[Phases], rounds: &[usize]| median(rounds.iter().map(|&i| v[i].total()).collect());
    let all: Vec<usize> = (0..n).collect();
    let point = ratio(median_of(ours, &all), median_of(theirs, &all));
    if n < 2 {
        return (point, point, point);
    }
    let mut draws: Vec<f64> = (0..2000)
        .map(|_| {
            let rounds: Vec<usize> = (0..n).map(|_| rng.below(n)).collect();
            ratio(median_of(ours, &rounds), median_of(theirs, &rounds))
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    let at = |q: f64| draws[((draws.len() - 1) as f64 * q).round() as usize];
    (point, at(0.05), at(0.95))
}

/// A workload: its label and its transfers (offset, size).
type Workload = (String, Vec<(u64, usize)>);

/// `samples[workload][label]`: the phases of every round.
type Samples = Vec<BTreeMap<String, Vec<Phases>>>;

/// What every round shares: the directory, the fixed backends and those of them that
/// cannot write (their capabilities say so), the profile's path, the engine that writes for
/// those, and whether to print every run.
struct Bench {
    dir: PathBuf,
    names: Vec<String>,
    read_only: BTreeSet<String>,
    profile: PathBuf,
    posix: Engine,
    verbose: bool,
}

/// A fixed backend's label (not one of the selecting engines).
fn is_fixed(label: &str) -> bool {
    !label.starts_with("auto")
}

fn main() -> fastensor::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(args.first().cloned().unwrap_or_else(|| ".".into()));
    std::fs::create_dir_all(&dir).map_err(|e| {
        fastensor::Error::io(e, "cannot create the benchmark directory").with_path(&dir)
    })?;
    let quick = args.iter().any(|a| a == "--quick");
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
        .max(1);
    let workloads = workloads(&args, quick);
    let all = fastensor::registry();
    let names: Vec<String> = Engine::builder()
        .registry(all.clone())
        .build()?
        .backend_names();
    let read_only = names
        .iter()
        .filter(|n| all.get(n).is_ok_and(|b| !b.capabilities().write))
        .cloned()
        .collect();
    println!("dir {}  backends {names:?}  rounds {rounds}", dir.display());
    let bench = Bench {
        profile: dir.join(".auto_vs_fixed-profile.toml"),
        posix: Engine::builder().backends(["posix"]).build()?,
        verbose: args.iter().any(|a| a == "--verbose"),
        dir,
        names,
        read_only,
    };
    // A huge-page-backed buffer, as an application moving tensors would use.
    let mut buf = fastensor::HostBuffer::new(8 << 20)?;
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1];
    }
    first_profile(&bench, &workloads, &mut buf)?;
    let mut samples: Samples = vec![BTreeMap::new(); workloads.len()];
    let mut last_auto: Option<Engine> = None;
    let mut warm_explorations = Vec::new();
    for round in 0..rounds {
        let (auto_cold, explorations) =
            run_round(&bench, round, &workloads, &mut buf, &mut samples)?;
        warm_explorations.push(explorations);
        last_auto = Some(auto_cold);
        eprintln!("round {} of {rounds} done", round + 1);
    }
    let mut labels: Vec<String> = bench.names.clone();
    labels.push("auto".into());
    labels.push("auto-warm".into());
    let (intervals, verdicts) =
        print_medians(&workloads, &samples, &labels, rounds, &bench.read_only);
    println!();
    println!("total ratios to the best fixed backend, with 90% intervals (rounds resampled)");
    for line in &intervals {
        println!("{line}");
    }
    println!();
    println!("goal (within 5% of the best fixed backend per size class, below it on the mix):");
    for v in &verdicts {
        println!("  {v}");
    }
    print_per_round(&workloads, &samples, &bench.read_only);
    if let Some(a) = last_auto {
        println!("\nauto (cold start, last round) report:\n{}", a.report());
    }
    println!("auto-warm explorations per round: {warm_explorations:?}");
    let _ = std::fs::remove_file(&bench.profile);
    Ok(())
}

/// The workloads: one per size class, then a shuffled mix of them (only the one `--only`
/// names, when given: an unknown name ends the program).
fn workloads(args: &[String], quick: bool) -> Vec<Workload> {
    let scale = if quick { 4 } else { 1 };
    // (size, transfers per phase)
    // Each phase moves 64 MiB (4 KiB) to 1 GiB (8 MiB): long enough that a context's
    // exploration, paid once, weighs as it does in a real job rather than dominating.
    let classes: Vec<(usize, usize)> = vec![
        (4 << 10, 16384 / scale),
        (64 << 10, 4096 / scale),
        (1 << 20, 512 / scale),
        (8 << 20, 128 / scale),
    ];
    let mut workloads: Vec<Workload> = classes
        .iter()
        .map(|&(s, n)| {
            (
                fastensor::select::human_bytes(s as u64),
                layout(&[(s, n)], 1),
            )
        })
        .collect();
    workloads.push((
        "mixed".into(),
        layout(
            &classes.iter().map(|&(s, n)| (s, n / 2)).collect::<Vec<_>>(),
            7,
        ),
    ));
    if let Some(only) = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
    {
        workloads.retain(|(label, _)| label == only);
        if workloads.is_empty() {
            eprintln!("--only: no workload called `{only}`");
            std::process::exit(2);
        }
    }
    workloads
}

/// The first profile: a cold-start engine runs every workload once, untimed.
fn first_profile(
    bench: &Bench,
    workloads: &[Workload],
    buf: &mut fastensor::HostBuffer,
) -> fastensor::Result<()> {
    let _ = std::fs::remove_file(&bench.profile);
    let tuner = Engine::builder().profile(&bench.profile).build()?;
    for (_, work) in workloads {
        let path = bench.dir.join(".auto_vs_fixed-tune.bin");
        run(&tuner, &tuner, &path, work, buf)?;
        clean_up(&bench.dir);
    }
    tuner.save_profile()?;
    eprintln!("first profile made");
    Ok(())
}

/// One round: a cold-start engine for the whole round and a warm one from the last profile
/// run every workload beside every fixed backend, in the round's order. Returns the
/// cold-start engine (its profile saved) and the warm one's explorations.
fn run_round(
    bench: &Bench,
    round: usize,
    workloads: &[Workload],
    buf: &mut fastensor::HostBuffer,
    samples: &mut Samples,
) -> fastensor::Result<(Engine, u64)> {
    let warm = Engine::builder().profile(&bench.profile).build()?;
    if let Some(w) = warm.load_warning() {
        println!("warning: {w}");
    }
    let _ = std::fs::remove_file(&bench.profile);
    let auto_cold = Engine::builder().profile(&bench.profile).build()?;
    for (w, (_, work)) in workloads.iter().enumerate() {
        let mut contenders: Vec<Contender> = bench
            .names
            .iter()
            .map(|n| Contender {
                label: n.clone(),
                engine: Engine::builder()
                    .backends([n.as_str()])
                    .build()
                    .expect("available"),
            })
            .collect();
        contenders.push(Contender {
            label: "auto".into(),
            engine: auto_cold.clone(),
        });
        contenders.push(Contender {
            label: "auto-warm".into(),
            engine: warm.clone(),
        });
        let order = balanced_order(contenders.len(), round);
        for c in order.iter().map(|&i| &contenders[i]) {
            let writer = if bench.read_only.contains(&c.label) {
                &bench.posix
            } else {
                &c.engine
            };
            let path = bench.dir.join(format!(".auto_vs_fixed-{}.bin", c.label));
            let p = run(&c.engine, writer, &path, work, buf)?;
            if bench.verbose {
                eprintln!("round {round} {} {}: {p:?}", workloads[w].0, c.label);
                if !is_fixed(&c.label) {
                    eprintln!("{}", c.engine.report());
                }
            }
            samples[w].entry(c.label.clone()).or_default().push(p);
        }
        clean_up(&bench.dir);
    }
    auto_cold.save_profile()?;
    Ok((auto_cold, warm.selector_stats().explorations))
}

/// Prints each phase's median per workload and engine, with its ratio to the best fixed
/// backend's; returns the total ratios' intervals and the goal's verdicts, one line each.
fn print_medians(
    workloads: &[Workload],
    samples: &Samples,
    labels: &[String],
    rounds: usize,
    read_only: &BTreeSet<String>,
) -> (Vec<String>, Vec<String>) {
    let mut rng = SplitMix(0x5EED);
    println!();
    println!("medians over {rounds} rounds (total: the median of the rounds' totals)");
    println!("{:8} {:12} {:>10} {:>10} {:>10} {:>10}   ratios to the best fixed (write cold cached total)", "size", "engine", "write ms", "cold ms", "cached ms", "total ms");
    let mut verdicts: Vec<String> = Vec::new();
    let mut intervals: Vec<String> = Vec::new();
    for ((label, _), by_label) in workloads.iter().zip(samples) {
        let results: Vec<(&String, Summary)> = labels
            .iter()
            .filter_map(|l| Some((l, Summary::of(by_label.get(l)?))))
            .collect();
        print_rows(label, &results, read_only);
        // The same ratios with their uncertainty, and the next fixed backend's, which shows
        // how far apart this disk's noise puts two paths.
        let mut ranked: Vec<&(&String, Summary)> = results
            .iter()
            .filter(|(n, _)| is_fixed(n) && !read_only.contains(*n))
            .collect();
        ranked.sort_by_key(|(_, s)| s.total);
        let Some((best_name, _)) = ranked.first() else {
            continue;
        };
        let theirs = &by_label[*best_name];
        let mut line = format!("{label:8} best fixed {best_name:12}");
        let goal = if label == "mixed" { 1.0 } else { 1.05 };
        for a in ["auto", "auto-warm"] {
            let Some(ours) = by_label.get(a) else {
                continue;
            };
            let (r, low, high) = ratio_interval(ours, theirs, &mut rng);
            line += &format!("   {a} {r:.2} [{low:.2} {high:.2}]");
            let met = if label == "mixed" {
                r < goal
            } else {
                r <= goal
            };
            verdicts.push(format!(
                "{label} {a}: {} ({r:.3})",
                if met { "met" } else { "missed" }
            ));
        }
        if let Some((next, _)) = ranked.get(1) {
            let (r, low, high) = ratio_interval(&by_label[*next], theirs, &mut rng);
            line += &format!("   next fixed {next} {r:.2} [{low:.2} {high:.2}]");
        }
        intervals.push(line);
    }
    (intervals, verdicts)
}

/// The rows of one workload: each engine's phase medians and their ratios to the best
/// fixed backend's (read-only backends are left out of the write and total bests).
fn print_rows(label: &str, results: &[(&String, Summary)], read_only: &BTreeSet<String>) {
    let fixed = |with_read_only: bool| {
        results
            .iter()
            .filter(move |(n, _)| is_fixed(n) && (with_read_only || !read_only.contains(*n)))
    };
    let best = |f: fn(&Summary) -> Duration, with_read_only: bool| {
        fixed(with_read_only)
            .map(|(_, s)| f(s))
            .min()
            .unwrap_or_default()
    };
    let bw = best(|s| s.phases.write, false);
    let bc = best(|s| s.phases.cold, true);
    let bk = best(|s| s.phases.cached, true);
    let bt = best(|s| s.total, false);
    for (name, s) in results {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let p = &s.phases;
        println!(
            "{:8} {:12} {:10.1} {:10.1} {:10.1} {:10.1}   {:5.2} {:5.2} {:5.2} {}",
            label,
            name,
            ms(p.write),
            ms(p.cold),
            ms(p.cached),
            ms(s.total),
            ratio(p.write, bw),
            ratio(p.cold, bc),
            ratio(p.cached, bk),
            if read_only.contains(*name) {
                "  n/a (read-only)".to_string()
            } else {
                format!("{:5.2}", ratio(s.total, bt))
            },
        );
    }
}

/// The total ratios round by round (each `auto` total against the best fixed backend's
/// total of the same round): how much of a ratio the disk's swings alone move.
fn print_per_round(workloads: &[Workload], samples: &Samples, read_only: &BTreeSet<String>) {
    println!();
    println!("per-round total ratios to the best fixed backend (median [lowest highest])");
    for ((label, _), by_label) in workloads.iter().zip(samples) {
        let Some((best, theirs)) = by_label
            .iter()
            .filter(|(n, _)| is_fixed(n) && !read_only.contains(*n))
            .min_by_key(|(_, v)| Summary::of(v).total)
        else {
            continue;
        };
        let mut line = format!("{label:8} best fixed {best:12}");
        for a in ["auto", "auto-warm"] {
            let Some(ours) = by_label.get(a) else {
                continue;
            };
            let mut r: Vec<f64> = ours
                .iter()
                .zip(theirs)
                .map(|(o, t)| ratio(o.total(), t.total()))
                .collect();
            r.sort_by(f64::total_cmp);
            line += &format!(
                "   {a} {:.2} [{:.2} {:.2}]",
                r[r.len() / 2],
                r[0],
                r[r.len() - 1]
            );
        }
        println!("{line}");
    }
}
