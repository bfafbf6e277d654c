//! `fastensor bench`: sweeps of backends (and their knobs) x sizes x directions x page-cache
//! states, against `posix` and a raw `O_DIRECT` loop measured in the same run; reports as a
//! table, JSON, CSV and an SVG chart; `fastensor bench compare` for two runs.

mod args;
mod compare;
mod energy;
mod machine;
mod measure;
mod metric;
mod plot;
mod profile;
mod random;
mod render;
mod report;
mod subjects;
mod sweep;

pub use args::BenchCli;
use args::{BenchArgs, BenchCommand, Directions};

use crate::scratch::Scratch;
use crate::sizes::format_size;
use energy::EnergyMeter;
use fastensor::{Availability, Error, ErrorKind, Result};
use measure::Cache;
use report::{BudgetUse, EnergySources, Report, Settings, SCHEMA};
use std::io::Write;
use std::path::{Path, PathBuf};
use subjects::Subject;

fn default_sizes(quick: bool) -> Vec<u64> {
    if quick {
        vec![4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
    } else {
        (0..=8)
            .map(|i| (4u64 << 10) << (2 * i))
            .filter(|&s| s <= 256 << 20)
            .collect()
    }
}

/// Runs `fastensor bench ...`.
pub fn run(cli: BenchCli) -> Result<()> {
    match cli.command {
        Some(BenchCommand::Compare(args)) => compare::run(args),
        Some(BenchCommand::Run(args)) => run_bench(*args),
        None => run_bench(cli.run),
    }
}

/// The backends to measure, probed.
fn backends(args: &BenchArgs) -> Result<Vec<fastensor::core::SharedBackend>> {
    let registry = fastensor::registry();
    let names = args.backends.clone().unwrap_or_else(|| registry.names());
    let mut out = Vec::new();
    for name in &names {
        let backend = registry.get(name)?;
        if let Availability::Unavailable { reason } = backend.probe() {
            if args.backends.is_some() {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("backend `{name}` is unavailable: {reason}"),
                ));
            }
            eprintln!("skipping `{name}`: unavailable: {reason}");
            continue;
        }
        if !backend.capabilities().host_memory {
            eprintln!("skipping `{name}`: it does not take host memory");
            continue;
        }
        out.push(backend);
    }
    Ok(out)
}

/// Every subject: each backend at its defaults or over its knob grid, then `raw`.
fn subjects(
    args: &BenchArgs,
    backends: &[fastensor::core::SharedBackend],
) -> Result<(Vec<Subject>, subjects::KnobGrid)> {
    let mut grid = subjects::parse_knob_args(&args.knobs)?;
    if let Some(unknown) = grid
        .keys()
        .find(|n| !backends.iter().any(|b| b.name() == *n))
    {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("--knobs names `{unknown}`, which is not among the backends measured"),
        ));
    }
    if args.sweep_knobs {
        for b in backends {
            let own = subjects::candidate_grid(&b.knobs());
            if !own.is_empty() {
                grid.entry(b.name().to_string()).or_insert(own);
            }
        }
    }
    let mut out = Vec::new();
    for b in backends {
        out.extend(subjects::expand(b, grid.get(b.name()))?);
    }
    if !args.no_raw {
        out.push(Subject::raw());
    }
    Ok((out, grid))
}

fn run_bench(args: BenchArgs) -> Result<()> {
    let dir = args
        .dir
        .clone()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "--dir is required"))?;
    check_args(&args, &dir)?;
    let backends = backends(&args)?;
    let (subjects, grid) = subjects(&args, &backends)?;
    if !args.no_raw {
        warn_raw_sizes(&args);
    }
    let plan = plan_of(&args);
    let meter = EnergyMeter::new(&args.powercap_root);
    let work = tempfile_dir(&dir)?;
    let outcome = sweep::run(&plan, &subjects, work.path(), &meter)?;
    let random_rows =
        if args.random_reads > 0 && args.direction != Directions::Write && !outcome.exhausted {
            random_reads(&args, &subjects, work.path())?
        } else {
            Vec::new()
        };
    let mut report = Report {
        schema: SCHEMA.to_string(),
        machine: machine::Machine::this(&dir),
        settings: settings_of(&args, &plan, &backends, grid),
        energy: EnergySources {
            cpu: meter.cpu_status(),
            gpu: meter.gpu_status(),
        },
        budget: BudgetUse {
            cells_planned: outcome.planned,
            cells_run: outcome.cells.len(),
            exhausted: outcome.exhausted,
            elapsed_s: outcome.elapsed.as_secs_f64(),
        },
        cells: outcome.cells,
        random_reads: random_rows,
        best_knobs: Default::default(),
    };
    report.compute_ratios();
    report.compute_best_knobs();
    // With `--json -` or `--csv -`, standard output carries only that format.
    let text = stdout_taken(&args).is_some();
    let mut out: Box<dyn Write> = if text {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    };
    print_report(&report, &args, &mut *out).map_err(|e| Error::io(e, "cannot print the report"))?;
    drop(out);
    write_reports(&report, &args)
}

/// Says which of the sizes asked for the raw loop skips (not a multiple of its alignment).
fn warn_raw_sizes(args: &BenchArgs) {
    let odd: Vec<String> = args
        .sizes
        .iter()
        .flatten()
        .filter(|&&s| s % sweep::RAW_ALIGN != 0)
        .map(|&s| format_size(s))
        .collect();
    if !odd.is_empty() {
        eprintln!(
            "raw skipped at {}: its O_DIRECT loop needs multiples of {} bytes",
            odd.join(", "),
            sweep::RAW_ALIGN
        );
    }
}

/// The sweep the arguments ask for.
fn plan_of(args: &BenchArgs) -> sweep::Plan {
    let mut caches: Vec<Cache> = args.cache.iter().map(|&c| c.into()).collect();
    caches.sort();
    caches.dedup();
    sweep::Plan {
        sizes: args
            .sizes
            .clone()
            .unwrap_or_else(|| default_sizes(args.quick)),
        directions: match args.direction {
            Directions::Both => vec!["write", "read"],
            Directions::Read => vec!["read"],
            Directions::Write => vec!["write"],
        },
        caches,
        repeat: args.repeat.unwrap_or(if args.quick { 3 } else { 5 }).max(1),
        exact: args.repeat.is_some(),
        warmup: args.warmup,
        budget: args.budget,
    }
}

/// The random 4 KiB reads of every subject at its default settings.
fn random_reads(
    args: &BenchArgs,
    subjects: &[Subject],
    work: &Path,
) -> Result<Vec<random::RandomRow>> {
    let readers: Vec<_> = subjects
        .iter()
        .filter(|s| s.knobs.is_empty())
        .filter_map(|s| s.backend.clone())
        .collect();
    eprintln!(
        "random reads: {} x 4 KiB from a cold {} file",
        args.random_reads,
        format_size(args.random_file)
    );
    random::measure(&readers, work, args.random_reads, args.random_file)
}

/// The settings the report records.
fn settings_of(
    args: &BenchArgs,
    plan: &sweep::Plan,
    backends: &[fastensor::core::SharedBackend],
    grid: subjects::KnobGrid,
) -> Settings {
    Settings {
        sizes: plan.sizes.clone(),
        backends: backends.iter().map(|b| b.name().to_string()).collect(),
        directions: plan.directions.iter().map(|d| d.to_string()).collect(),
        cache: plan.caches.clone(),
        repeat: args.repeat,
        repeat_rule: if plan.exact {
            "exact".to_string()
        } else {
            format!(
                "at least {}; small sizes repeat until 8 MiB moved, at most 64",
                plan.repeat
            )
        },
        warmup: plan.warmup,
        budget_s: plan.budget.map(|b| b.as_secs_f64()),
        knobs: grid,
        raw: !args.no_raw,
        quick: args.quick,
        random_reads: args.random_reads,
        random_file: args.random_file,
    }
}

/// The option that writes to standard output (`-`), if one does.
fn stdout_taken(args: &BenchArgs) -> Option<&'static str> {
    let dash = |p: &Option<PathBuf>| p.as_deref().is_some_and(|p| p.as_os_str() == "-");
    [
        ("--json", &args.json),
        ("--csv", &args.csv),
        ("--plot", &args.plot),
    ]
    .into_iter()
    .find(|(_, p)| dash(p))
    .map(|(name, _)| name)
}

/// Refuses settings that cannot be measured, before anything runs.
fn check_args(args: &BenchArgs, dir: &Path) -> Result<()> {
    let invalid = |msg: String| Err(Error::new(ErrorKind::InvalidInput, msg));
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(
                Error::new(ErrorKind::InvalidInput, "--dir: not a directory").with_path(dir),
            )
        }
        Err(e) => {
            return Err(Error::io(e, "--dir: the bench directory cannot be used").with_path(dir))
        }
    }
    if args.sizes.as_ref().is_some_and(|s| s.contains(&0)) {
        return invalid("--sizes: a transfer size must be at least 1 byte".into());
    }
    if args.repeat == Some(0) {
        return invalid("--repeat: at least one timed repetition is needed".into());
    }
    let dashes = [&args.json, &args.csv, &args.plot]
        .iter()
        .filter(|p| p.as_deref().is_some_and(|p| p.as_os_str() == "-"))
        .count();
    if dashes > 1 {
        return invalid(
            "only one of --json, --csv and --plot can write to standard output (-)".into(),
        );
    }
    Ok(())
}

fn print_report(report: &Report, args: &BenchArgs, out: &mut dyn Write) -> std::io::Result<()> {
    let m = &report.machine;
    writeln!(
        out,
        "fastensor bench: {} on {} ({}), kernel {}; reads cold (page cache dropped) or warm, writes durable (synced); median per cell",
        m.dir,
        m.file_system,
        [m.device.as_str(), m.device_model.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" "),
        m.kernel
    )?;
    write!(out, "{}", render::table(report))?;
    for (what, s) in [("CPU", &report.energy.cpu), ("GPU", &report.energy.gpu)] {
        if let Some(why) = &s.reason {
            writeln!(out, "{what} energy unavailable: {why}")?;
        }
    }
    if report.budget.exhausted {
        writeln!(
            out,
            "budget spent: measured {} of {} cells in {:.1} s",
            report.budget.cells_run, report.budget.cells_planned, report.budget.elapsed_s
        )?;
    }
    for (backend, knobs) in &report.best_knobs {
        let k: Vec<String> = knobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(out, "best knobs for {backend}: {}", k.join(","))?;
    }
    if !report.random_reads.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "random {} KiB reads from a cold {} file ({} requests):",
            random::REQUEST >> 10,
            format_size(args.random_file),
            args.random_reads
        )?;
        write!(out, "{}", random::table(&report.random_reads))?;
    }
    Ok(())
}

fn write_reports(report: &Report, args: &BenchArgs) -> Result<()> {
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(report)
            .map_err(|e| Error::new(ErrorKind::Other, format!("cannot encode JSON: {e}")))?;
        write_output(path, &text)?;
    }
    if let Some(path) = &args.csv {
        write_output(path, &render::csv(report))?;
    }
    if let Some(path) = &args.plot {
        let svg = plot::svg(report)
            .map_err(|e| Error::new(ErrorKind::Other, format!("cannot draw the chart: {e}")))?;
        write_output(path, &svg)?;
    }
    if let Some(path) = &args.write_profile {
        if report.best_knobs.is_empty() {
            eprintln!("--write-profile: no backend was swept over knobs; the profile is unchanged");
        } else {
            profile::write(path, &report.best_knobs)?;
            let msg = format!("best knobs written to {}", path.display());
            if stdout_taken(args).is_some() {
                eprintln!("{msg}");
            } else {
                println!("{msg}");
            }
        }
    }
    Ok(())
}

/// The run's scratch directory in `parent`, removed when dropped (and on a signal).
fn tempfile_dir(parent: &Path) -> Result<Scratch> {
    let path = parent.join(format!("fastensor-bench-{}", std::process::id()));
    let scratch = Scratch::new(path);
    std::fs::create_dir_all(scratch.path())
        .map_err(|e| Error::io(e, "cannot create the bench directory").with_path(scratch.path()))?;
    Ok(scratch)
}

/// Writes `text` to `path`, or to standard output for `-`.
pub(crate) fn write_output(path: &Path, text: &str) -> Result<()> {
    if path.as_os_str() == "-" {
        println!("{text}");
        return Ok(());
    }
    fastensor::atomic::write(path, text.as_bytes())
}
