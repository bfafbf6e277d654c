//! `fastensor tune` and `fastensor profile show`.

use crate::sizes::parse_size;
use clap::{Args, Subcommand, ValueEnum};
use fastensor::engine::{default_profile_path, tune, TuneOptions};
use fastensor::{Dictionary, Error, ErrorKind, Objective, Result};
use std::path::{Path, PathBuf};

/// What the selector minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ObjectiveArg {
    /// Wall-clock time.
    Time,
    /// CPU time per byte.
    Cpu,
}

/// Options of `fastensor tune`.
#[derive(Debug, Args)]
pub struct TuneArgs {
    /// Directory on the file system to tune for (a scratch file is created and removed).
    #[arg(long)]
    dir: PathBuf,
    /// Where to write the profile (default: $FASTENSOR_PROFILE, else
    /// ~/.cache/fastensor/profile.toml).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Transfer sizes to explore (default 4K,64K,1M,8M,32M).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Option<Vec<u64>>,
    /// Backends to consider (default: every available one).
    #[arg(long, value_delimiter = ',')]
    backends: Option<Vec<String>>,
    /// What to minimise.
    #[arg(long, value_enum, default_value_t = ObjectiveArg::Time)]
    objective: ObjectiveArg,
    /// Most rounds per size (exploration usually ends sooner).
    #[arg(long, default_value_t = 40)]
    max_rounds: usize,
    /// Replace a profile file that cannot be used (not a profile, another format version,
    /// another machine's); the old file is kept as `FILE.bak`.
    #[arg(long)]
    force: bool,
}

/// `fastensor profile ...`.
#[derive(Debug, Subcommand)]
pub enum ProfileCommand {
    /// Print a saved profile (the context -> backend dictionary) as a table.
    Show {
        /// The profile file (default: the default profile path).
        file: Option<PathBuf>,
    },
}

fn profile_path(given: Option<PathBuf>) -> Result<PathBuf> {
    given.or_else(default_profile_path).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidInput,
            "no profile path: give one, or set FASTENSOR_PROFILE (set and empty, it means none) or HOME",
        )
    })
}

/// Saves a selection profile at `path`, creating its directory when missing.
pub fn save_profile(dict: &Dictionary, path: &Path) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(e, "cannot create the profile directory").with_path(parent))?;
    }
    fastensor::profile::save(dict, path)
}

/// Runs a short exploration and writes the profile.
pub fn run_tune(args: TuneArgs) -> Result<()> {
    let mut options = TuneOptions {
        objective: match args.objective {
            ObjectiveArg::Time => Objective::Time,
            ObjectiveArg::Cpu => Objective::Cpu,
        },
        backends: args.backends,
        max_rounds: args.max_rounds.max(1),
        ..TuneOptions::default()
    };
    if let Some(sizes) = args.sizes {
        options.sizes = sizes;
    }
    let path = profile_path(args.profile)?;
    if let Ok(m) = std::fs::metadata(&path).map(|m| m.file_type()) {
        if !m.is_file() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "refusing to write a profile over something that is not a regular file",
            )
            .with_path(&path));
        }
    }
    // Checked before tuning: a file that is no usable profile is replaced only with --force.
    let old = match usable_profile(&path) {
        Ok(old) => old,
        Err(why) if args.force => {
            let bak = backup_path(&path);
            std::fs::copy(&path, &bak).map_err(|e| {
                Error::io(e, "cannot keep the old profile").with_path(&bak)
            })?;
            eprintln!(
                "fastensor: replacing {} ({why}); the old file is kept as {}",
                path.display(),
                bak.display()
            );
            None
        }
        Err(why) => {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("refusing to overwrite a file that is {why} (--force replaces it, keeping it as FILE.bak)"),
            )
            .with_path(&path))
        }
    };
    let mut outcome = tune(&args.dir, &options)?;
    // Keep the backends' knob settings `bench --write-profile` stored in the profile being
    // replaced; the engine's (`[knobs.engine]`) are this run's.
    if let Some(old) = old {
        let engine_knobs = outcome.dictionary.knobs.remove("engine");
        outcome.dictionary.knobs = old.knobs;
        if let Some(k) = engine_knobs {
            outcome.dictionary.knobs.insert("engine".to_string(), k);
        }
    }
    save_profile(&outcome.dictionary, &path)?;
    print!("{}", fastensor::profile::Table(&outcome.dictionary));
    if let Some(m) = &outcome.new_loads {
        let mapped = m.mapped.map_or("cannot map here".to_string(), |d| {
            format!("mapped {:.3} s", d.as_secs_f64())
        });
        println!(
            "loads into new memory: {} ({} MiB cold: {mapped}, read into fresh memory {:.3} s)",
            m.choice.as_str(),
            m.bytes >> 20,
            m.read.as_secs_f64()
        );
    }
    println!(
        "{} transfers, {:.1} MiB in {:.1} s; {} explorations; profile written to {}",
        outcome.transfers,
        outcome.bytes as f64 / (1u64 << 20) as f64,
        outcome.elapsed.as_secs_f64(),
        outcome.stats.explorations,
        path.display()
    );
    Ok(())
}

/// The profile at `path` when it is one this machine would use (`None` when there is no
/// file); else what the file is, in words.
fn usable_profile(path: &Path) -> std::result::Result<Option<Dictionary>, String> {
    match fastensor::profile::read(path) {
        Ok(d) => match other_machine(&d) {
            Some(why) => Err(format!("a profile of another machine ({why})")),
            None => Ok(Some(d)),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            Err(format!("a profile of another format ({})", e.message()))
        }
        Err(e) => Err(format!("not a usable profile ({e})")),
    }
}

/// How the machine `dict` was measured on differs from this one; `None` when it is this one.
fn other_machine(dict: &Dictionary) -> Option<String> {
    fastensor::profile::other_machine(dict)
}

/// `FILE.bak` for `FILE`.
fn backup_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".bak");
    PathBuf::from(name)
}

/// Runs `fastensor profile ...`.
pub fn run_profile(cmd: ProfileCommand) -> Result<()> {
    match cmd {
        ProfileCommand::Show { file } => {
            let path = profile_path(file)?;
            let dict = fastensor::profile::read(&path)?;
            print!("{}", fastensor::profile::Table(&dict));
            if let Some(why) = other_machine(&dict) {
                println!(
                    "warning: this profile was measured on another machine ({why}); the engine \
                     would not use it here"
                );
            }
            Ok(())
        }
    }
}
