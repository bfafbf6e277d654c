//! `fastensor bench`: every backend x sizes x read/write, against `posix` and a raw `O_DIRECT`
//! loop measured in the same run.

mod measure;
mod random;
mod report;

use crate::sizes::{format_size, parse_size};
use clap::{Args, ValueEnum};
use fastensor::{Backend, Error, ErrorKind, HostBuffer, Result};
use indicatif::{ProgressBar, ProgressStyle};
use measure::{Sample, RAW};
use report::{median, Cell, Report, SCHEMA};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which directions to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Directions {
    /// Reads and writes.
    Both,
    /// Reads only.
    Read,
    /// Writes only.
    Write,
}

/// Options of `fastensor bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Directory for the test files (on the file system to measure); a temporary directory
    /// inside it is used and removed.
    #[arg(long)]
    dir: PathBuf,
    /// A run of under a minute: fewer sizes and repeats.
    #[arg(long)]
    quick: bool,
    /// Transfer sizes, e.g. `4K,1M,256M` (default 4 KiB to 256 MiB, x4 steps).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Option<Vec<u64>>,
    /// Backends to measure (default: every available one).
    #[arg(long, value_delimiter = ',')]
    backends: Option<Vec<String>>,
    /// Timed repetitions per cell. Without it: 5 (3 with --quick), and small sizes repeat
    /// more, until 8 MiB has moved (at most 64 times).
    #[arg(long)]
    repeat: Option<usize>,
    /// Directions to measure.
    #[arg(long, value_enum, default_value_t = Directions::Both)]
    direction: Directions,
    /// Also write the results as JSON to this file (`-` for standard output).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write the results as CSV to this file (`-` for standard output).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Leave out the `raw` O_DIRECT reference row.
    #[arg(long)]
    no_raw: bool,
    /// Random 4 KiB reads from a cold file, as one batch and one at a time (0: skip).
    #[arg(long, default_value_t = 10_000)]
    random_reads: usize,
    /// Size of the file the random reads come from.
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    random_file: u64,
}

/// A measured path: a backend, or the raw reference loop.
#[derive(Clone)]
enum Subject {
    Backend(Arc<dyn Backend>),
    Raw,
}

impl Subject {
    fn name(&self) -> &str {
        match self {
            Subject::Backend(b) => b.name(),
            Subject::Raw => RAW,
        }
    }
    fn writes(&self) -> bool {
        match self {
            Subject::Backend(b) => b.capabilities().write,
            Subject::Raw => true,
        }
    }
}

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

/// Runs the benchmark and prints the table.
pub fn run(args: BenchArgs) -> Result<()> {
    let registry = fastensor::registry();
    let mut subjects = Vec::new();
    let names = match &args.backends {
        Some(list) => list.clone(),
        None => registry.names(),
    };
    for name in &names {
        let backend = registry.get(name)?;
        match backend.probe() {
            fastensor::Availability::Available => {}
            fastensor::Availability::Unavailable { reason } => {
                if args.backends.is_some() {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("backend `{name}` is unavailable: {reason}"),
                    ));
                }
                eprintln!("skipping `{name}`: unavailable: {reason}");
                continue;
            }
        }
        if !backend.capabilities().host_memory {
            eprintln!("skipping `{name}`: it does not take host memory");
            continue;
        }
        subjects.push(Subject::Backend(backend));
    }
    if !args.no_raw {
        subjects.push(Subject::Raw);
    }
    let sizes = args
        .sizes
        .clone()
        .unwrap_or_else(|| default_sizes(args.quick));
    let repeat = args.repeat.unwrap_or(if args.quick { 3 } else { 5 }).max(1);
    if !args.dir.is_dir() {
        return Err(
            Error::new(ErrorKind::NotFound, "the bench directory does not exist")
                .with_path(&args.dir),
        );
    }
    let work = tempfile_dir(&args.dir)?;
    let result = run_cells(&args, &subjects, &sizes, repeat, work.path());
    let random_rows =
        if args.random_reads > 0 && args.direction != Directions::Write && result.is_ok() {
            let readers: Vec<Arc<dyn Backend>> = subjects
                .iter()
                .filter_map(|s| match s {
                    Subject::Backend(b) => Some(b.clone()),
                    Subject::Raw => None,
                })
                .collect();
            eprintln!(
                "random reads: {} x 4 KiB from a cold {} file",
                args.random_reads,
                format_size(args.random_file)
            );
            random::measure(&readers, work.path(), args.random_reads, args.random_file)?
        } else {
            Vec::new()
        };
    let mut report = Report {
        schema: SCHEMA,
        dir: args.dir.display().to_string(),
        file_system: {
            let loc = fastensor_posix::sys::file_location(&args.dir);
            format!("{} ({})", loc.fs_type, loc.device)
        },
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        cells: result?,
        random_reads: random_rows,
    };
    report.compute_ratios();
    println!(
        "fastensor bench: {} on {}, kernel {}; reads cold (page cache dropped), writes durable (synced); median of {repeat}+ runs",
        report.dir, report.file_system, report.kernel
    );
    print!("{}", report.table());
    if !report.random_reads.is_empty() {
        println!();
        println!(
            "random {} KiB reads from a cold {} file ({} requests):",
            random::REQUEST >> 10,
            format_size(args.random_file),
            args.random_reads
        );
        print!("{}", random::table(&report.random_reads));
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::new(ErrorKind::Other, format!("cannot encode JSON: {e}")))?;
        write_output(path, &text)?;
    }
    if let Some(path) = &args.csv {
        write_output(path, &report.csv())?;
    }
    Ok(())
}

fn tempfile_dir(parent: &Path) -> Result<TempDir> {
    let path = parent.join(format!("fastensor-bench-{}", std::process::id()));
    std::fs::create_dir_all(&path)
        .map_err(|e| Error::io(e, "cannot create the bench directory").with_path(&path))?;
    Ok(TempDir(path))
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_output(path: &Path, text: &str) -> Result<()> {
    if path.as_os_str() == "-" {
        println!("{text}");
        return Ok(());
    }
    std::fs::write(path, text).map_err(|e| Error::io(e, "cannot write the report").with_path(path))
}

fn repeats_for(size: u64, repeat: usize, exact: bool) -> usize {
    if exact {
        return repeat;
    }
    let min_bytes = 8u64 << 20;
    let want = min_bytes.div_ceil(size.max(1)) as usize;
    want.clamp(repeat, 64.max(repeat))
}

fn run_cells(
    args: &BenchArgs,
    subjects: &[Subject],
    sizes: &[u64],
    repeat: usize,
    dir: &Path,
) -> Result<Vec<Cell>> {
    let dirs: &[&str] = match args.direction {
        Directions::Both => &["write", "read"],
        Directions::Read => &["read"],
        Directions::Write => &["write"],
    };
    let total_bytes: u64 = sizes
        .iter()
        .map(|&s| s * repeats_for(s, repeat, args.repeat.is_some()) as u64 * (subjects.len() * dirs.len()) as u64)
        .sum();
    let bar = ProgressBar::new(total_bytes);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes} ETA {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut cells = Vec::new();
    for &size in sizes {
        let len = usize::try_from(size)
            .map_err(|_| Error::new(ErrorKind::InvalidInput, "size too large for memory"))?;
        let mut data = HostBuffer::new(len)?;
        fastensor_posix_fill(&mut data, size);
        let mut sink = HostBuffer::new(len)?;
        let source = dir.join(format!("read-{size}.bin"));
        let reps = repeats_for(size, repeat, args.repeat.is_some());
        for &direction in dirs {
            if direction == "read" {
                measure::write_raw(&source, &data).or_else(|_| {
                    measure::write_backend(&fastensor_posix::PosixBackend, &source, &data)
                })?;
            }
            for subject in subjects {
                if direction == "write" && !subject.writes() {
                    continue;
                }
                bar.set_message(format!(
                    "{} {direction} {}",
                    subject.name(),
                    format_size(size)
                ));
                let target = dir.join(format!("write-{}-{size}.bin", subject.name()));
                let mut samples: Vec<Sample> = Vec::with_capacity(reps);
                for rep in 0..reps {
                    let sample = match (direction, subject) {
                        ("write", Subject::Backend(b)) => {
                            measure::write_backend(b.as_ref(), &target, &data)
                        }
                        ("write", Subject::Raw) => measure::write_raw(&target, &data),
                        (_, Subject::Backend(b)) => {
                            measure::read_backend(b.as_ref(), &source, &mut sink)
                        }
                        (_, Subject::Raw) => measure::read_raw(&source, &mut sink),
                    }
                    .map_err(|e| with_subject(e, subject.name()))?;
                    if rep == 0 && direction == "read" && sink[..] != data[..] {
                        return Err(Error::new(
                            ErrorKind::Corrupt,
                            format!("`{}` read back different bytes", subject.name()),
                        )
                        .with_path(&source));
                    }
                    samples.push(sample);
                    bar.inc(size);
                }
                let _ = std::fs::remove_file(&target);
                cells.push(cell(subject.name(), direction, size, &samples));
            }
        }
        let _ = std::fs::remove_file(&source);
    }
    bar.finish_and_clear();
    Ok(cells)
}

fn with_subject(e: Error, name: &str) -> Error {
    e.with_backend(name)
}

/// Pseudo-random, incompressible content (so no layer can shortcut zeros).
fn fastensor_posix_fill(buf: &mut [u8], seed: u64) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for c in buf.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let b = s.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

fn cell(backend: &str, direction: &str, size: u64, samples: &[Sample]) -> Cell {
    let gib = size as f64 / (1u64 << 30) as f64;
    let mut bw: Vec<f64> = samples
        .iter()
        .map(|s| size as f64 / s.seconds.max(1e-9) / 1e9)
        .collect();
    let mut cpu: Vec<f64> = samples.iter().map(|s| s.cpu_seconds / gib).collect();
    let gbps_min = bw.iter().copied().fold(f64::INFINITY, f64::min);
    let gbps_max = bw.iter().copied().fold(0.0, f64::max);
    Cell {
        backend: backend.to_string(),
        direction: direction.to_string(),
        bytes: size,
        repeats: samples.len(),
        gbps_median: median(&mut bw),
        gbps_min,
        gbps_max,
        cpu_s_per_gib: median(&mut cpu),
        ratio_to_posix: None,
        ratio_to_raw: None,
    }
}
