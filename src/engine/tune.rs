//! A short exploration over representative sizes and both directions (`fastensor tune`).

use super::{evict, Engine, NewLoadsMeasured};
use fastensor_core::{Error, ErrorKind, HostBuffer, OpenMode, Result};
use fastensor_select::{Dictionary, Objective, SelectorStats};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What [`tune`] measures.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// Transfer sizes, one size class each (default 4 KiB, 64 KiB, 1 MiB, 8 MiB, 32 MiB).
    pub sizes: Vec<u64>,
    /// Backends to consider (`None`: every available one).
    pub backends: Option<Vec<String>>,
    /// What to minimise.
    pub objective: Objective,
    /// Also measure cold reads (the page cache dropped before each). Default on.
    pub cold_reads: bool,
    /// Also measure cached reads. Default on.
    pub cached_reads: bool,
    /// Most rounds per size (a round is one write and the reads); exploration usually ends
    /// sooner. Default 40.
    pub max_rounds: usize,
    /// Continue from this dictionary's measurements (e.g. an earlier profile).
    pub profile: Option<PathBuf>,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            sizes: vec![4 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20],
            backends: None,
            objective: Objective::Time,
            cold_reads: true,
            cached_reads: true,
            max_rounds: 40,
            profile: None,
        }
    }
}

/// What [`tune`] found.
#[derive(Debug, Clone)]
pub struct TuneOutcome {
    /// The dictionary: save it with [`crate::profile::save`], print it with `Display`.
    pub dictionary: Dictionary,
    /// Selector counters of the run.
    pub stats: SelectorStats,
    /// Transfers run.
    pub transfers: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Time the run took.
    pub elapsed: Duration,
    /// Loads into new host memory, mapped and read, measured cold (with `cold_reads`);
    /// their winner is in the dictionary's knobs (`[knobs.engine] new_loads`).
    pub new_loads: Option<NewLoadsMeasured>,
}

/// Explores every available backend on a scratch file in `dir` (one with no name, which
/// nothing can leave behind: `O_TMPFILE`, or unlinked once open) for each
/// size, writes and reads (cold and cached), until every context has a choice or
/// `max_rounds` is reached; with cold reads, also measures where loads into new host memory
/// should put their bytes ([`NewLoads`](super::NewLoads)); and returns the dictionary.
pub fn tune(dir: &Path, options: &TuneOptions) -> Result<TuneOutcome> {
    if !dir.is_dir() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a directory").with_path(dir));
    }
    let mut builder = Engine::builder().objective(options.objective);
    if let Some(b) = &options.backends {
        builder = builder.backends(b.clone());
    }
    if let Some(p) = &options.profile {
        builder = builder.profile(p.clone());
    }
    let engine = builder.build()?;
    // A file with no name: nothing is left behind however the process ends.
    let scratch =
        crate::atomic::unnamed_file(dir, &format!(".fastensor-tune-{}.bin", std::process::id()))
            .map_err(|e| Error::io(e, "cannot create the scratch file").with_path(dir))?;
    let mut outcome = run(&engine, &crate::atomic::fd_path(&scratch), options)?;
    if options.cold_reads {
        let measured = super::placement::measure(&engine, dir)?;
        measured.store(&mut outcome.dictionary.knobs);
        outcome.new_loads = Some(measured);
    }
    Ok(outcome)
}

fn run(engine: &Engine, path: &Path, options: &TuneOptions) -> Result<TuneOutcome> {
    let start = Instant::now();
    let max = options.sizes.iter().copied().max().unwrap_or(0);
    let max_len = usize::try_from(max)
        .map_err(|_| Error::new(ErrorKind::InvalidInput, "tune size too large"))?;
    let mut buf = HostBuffer::new(max_len)?;
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[0];
    }
    let (mut transfers, mut bytes) = (0u64, 0u64);
    let file = engine.open(path, OpenMode::Truncate)?;
    for &size in &options.sizes {
        let n = size as usize;
        let before = engine.selector_stats().explorations;
        let mut quiet = 0;
        for _round in 0..options.max_rounds.max(1) {
            let explored = engine.selector_stats().explorations;
            file.write_at(0, &buf[..n])?;
            transfers += 1;
            bytes += size;
            if options.cold_reads {
                file.sync()?;
                evict(path)?;
                file.read_at(0, &mut buf[..n])?;
                transfers += 1;
                bytes += size;
            }
            if options.cached_reads {
                file.read_at(0, &mut buf[..n])?;
                file.read_at(0, &mut buf[..n])?;
                transfers += 2;
                bytes += 2 * size;
            }
            // Stop after a few rounds without exploration: every context of this size chose.
            if engine.selector_stats().explorations == explored {
                quiet += 1;
                if quiet >= 2 {
                    break;
                }
            } else {
                quiet = 0;
            }
        }
        let _ = before;
    }
    drop(file);
    Ok(TuneOutcome {
        dictionary: engine.dictionary(),
        stats: engine.selector_stats(),
        transfers,
        bytes,
        elapsed: start.elapsed(),
        new_loads: None,
    })
}

/// The variable that names the profile file; set and empty, it means "no profile".
pub const PROFILE_ENV: &str = "FASTENSOR_PROFILE";

/// Where profiles live by default: `$FASTENSOR_PROFILE`, else
/// `$XDG_CACHE_HOME/fastensor/profile.toml`, else `~/.cache/fastensor/profile.toml`. `None`
/// where there is no profile: `FASTENSOR_PROFILE` set and empty (the one rule, for the
/// command line and Python alike), or no home to put one in.
pub fn default_profile_path() -> Option<PathBuf> {
    profile_path_from(|name| std::env::var_os(name))
}

/// [`default_profile_path`] with the environment given by `var`.
fn profile_path_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    if let Some(p) = var(PROFILE_ENV) {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    let base = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("fastensor").join("profile.toml"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn path_with(vars: &[(&str, &str)]) -> Option<PathBuf> {
        profile_path_from(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn an_empty_profile_variable_means_no_profile() {
        assert_eq!(
            path_with(&[("FASTENSOR_PROFILE", ""), ("HOME", "/h")]),
            None
        );
        assert_eq!(
            path_with(&[("FASTENSOR_PROFILE", "/p.toml"), ("HOME", "/h")]),
            Some(PathBuf::from("/p.toml"))
        );
        assert_eq!(
            path_with(&[("HOME", "/h")]),
            Some(PathBuf::from("/h/.cache/fastensor/profile.toml"))
        );
        assert_eq!(
            path_with(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]),
            Some(PathBuf::from("/x/fastensor/profile.toml"))
        );
        assert_eq!(path_with(&[]), None);
    }
}
