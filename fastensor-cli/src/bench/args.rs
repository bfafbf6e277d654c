//! The command line of `fastensor bench`.

use super::compare::CompareArgs;
use super::energy::POWERCAP_ROOT;
use super::measure::Cache;
use crate::sizes::parse_size;
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

/// `fastensor bench [run] --dir ...` or `fastensor bench compare A.json B.json`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchCli {
    /// `run` (the default when options are given directly) or `compare`.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// Options of a run.
    #[command(flatten)]
    pub run: BenchArgs,
}

/// Subcommands of `fastensor bench`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Measure (the same as `fastensor bench --dir ...`).
    Run(Box<BenchArgs>),
    /// Print the ratios B/A of two JSON reports, cell by cell.
    Compare(CompareArgs),
}

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

/// Options of a bench run.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Directory for the test files (on the file system to measure); a temporary directory
    /// inside it is used and removed.
    #[arg(long, required = true)]
    pub dir: Option<PathBuf>,
    /// A run of under a minute: fewer sizes and repeats.
    #[arg(long)]
    pub quick: bool,
    /// Transfer sizes, e.g. `4K,1M,256M` (default 4 KiB to 256 MiB, x4 steps).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Option<Vec<u64>>,
    /// Backends to measure (default: every available one).
    #[arg(long, value_delimiter = ',')]
    pub backends: Option<Vec<String>>,
    /// Timed repetitions per cell. Without it: 5 (3 with --quick), and small sizes repeat
    /// more, until 8 MiB has moved (at most 64 times).
    #[arg(long)]
    pub repeat: Option<usize>,
    /// Untimed transfers before each cell's timed ones.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Directions to measure.
    #[arg(long, value_enum, default_value_t = Directions::Both)]
    pub direction: Directions,
    /// Page-cache states of reads: `cold` (evicted before every read), `warm` (read once
    /// through the cache first), or both: `cold,warm`.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cold")]
    pub cache: Vec<CacheArg>,
    /// Knob values to sweep, per backend: `posix-direct:threads=1,2,4,8;chunk=1M,4M`
    /// (repeat the flag for more backends). `fastensor backends` lists the knobs.
    #[arg(long)]
    pub knobs: Vec<String>,
    /// Sweep every backend's own candidate knob values (those not given with --knobs).
    #[arg(long)]
    pub sweep_knobs: bool,
    /// Stop starting new cells after this long (`90s`, `5m`, `1h`); what ran is reported.
    #[arg(long, value_parser = parse_duration)]
    pub budget: Option<Duration>,
    /// Write the best knob settings per swept backend into this selection profile (created
    /// if missing); the engine then runs each backend with them.
    #[arg(long)]
    pub write_profile: Option<PathBuf>,
    /// Also write the results as JSON to this file (`-` for standard output).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write the results as CSV to this file (`-` for standard output).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Draw bandwidth against size (one line per backend, a panel per direction) as SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Leave out the `raw` O_DIRECT reference row.
    #[arg(long)]
    pub no_raw: bool,
    /// Random 4 KiB reads from a cold file, as one batch and one at a time (0: skip).
    #[arg(long, default_value_t = 10_000)]
    pub random_reads: usize,
    /// Size of the file the random reads come from.
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    pub random_file: u64,
    /// Where RAPL energy counters are read (tests point it at a fake tree).
    #[arg(long, default_value = POWERCAP_ROOT, hide = true)]
    pub powercap_root: PathBuf,
}

/// A page-cache state on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CacheArg {
    /// Evicted before every read.
    Cold,
    /// Cached.
    Warm,
}

impl From<CacheArg> for Cache {
    fn from(c: CacheArg) -> Cache {
        match c {
            CacheArg::Cold => Cache::Cold,
            CacheArg::Warm => Cache::Warm,
        }
    }
}

/// Parses `500ms`, `90s`, `5m`, `1h`, or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (examples: 90s, 5m, 1h)"))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1e3,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{text}` is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3 fortnights").is_err());
        assert!(parse_duration("").is_err());
    }
}
