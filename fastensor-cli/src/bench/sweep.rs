//! Runs the cells of a sweep: sizes x directions x cache states x subjects, with warm-up,
//! repetitions, a time budget and a progress bar whose estimate weighs each transfer by its
//! bytes plus a fixed cost (so many small transfers are not estimated as free).

use super::energy::EnergyMeter;
use super::measure::{self, Cache, Sample};
use super::report::Cell;
use super::subjects::Subject;
use crate::sizes::format_size;
use fastensor::{Error, ErrorKind, HostBuffer, Result};
use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use std::path::Path;
use std::time::{Duration, Instant};

/// Work units charged per transfer on top of its bytes (open, evict, sync: about a
/// millisecond, what a disk moves 1 MiB in).
const TRANSFER_COST: u64 = 1 << 20;

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Transfer sizes.
    pub sizes: Vec<u64>,
    /// `write` and/or `read`, in run order.
    pub directions: Vec<&'static str>,
    /// Cache states of reads.
    pub caches: Vec<Cache>,
    /// Timed repetitions; with `exact` false, small sizes repeat more (until 8 MiB moved, at
    /// most 64 times).
    pub repeat: usize,
    /// `repeat` is exact.
    pub exact: bool,
    /// Untimed transfers before the timed ones of each cell.
    pub warmup: usize,
    /// Stop starting cells once this much time has passed.
    pub budget: Option<Duration>,
}

/// What ran.
#[derive(Debug)]
pub struct Outcome {
    /// The measured cells, in run order.
    pub cells: Vec<Cell>,
    /// Cells planned.
    pub planned: usize,
    /// The budget ran out first.
    pub exhausted: bool,
    /// Seconds spent.
    pub elapsed: Duration,
}

impl Plan {
    /// Timed repetitions for `size`.
    pub fn repeats_for(&self, size: u64) -> usize {
        if self.exact {
            return self.repeat;
        }
        let want = (8u64 << 20).div_ceil(size.max(1)) as usize;
        want.clamp(self.repeat, 64.max(self.repeat))
    }

    /// Every cell's (size, direction, cache, subject index), in run order.
    fn cells(&self, subjects: &[Subject]) -> Vec<(u64, &'static str, Option<Cache>, usize)> {
        let mut out = Vec::new();
        for &size in &self.sizes {
            for &d in &self.directions {
                let caches: Vec<Option<Cache>> = if d == "read" {
                    self.caches.iter().copied().map(Some).collect()
                } else {
                    vec![None]
                };
                for cache in caches {
                    for (i, s) in subjects.iter().enumerate() {
                        if d == "write" && !s.writes() {
                            continue;
                        }
                        if s.backend.is_none() && size % RAW_ALIGN != 0 {
                            continue;
                        }
                        out.push((size, d, cache, i));
                    }
                }
            }
        }
        out
    }

    fn work(&self, size: u64) -> u64 {
        (self.warmup + self.repeats_for(size)) as u64 * (size + TRANSFER_COST)
    }
}

fn progress(total: u64, deadline: Option<Instant>) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let left = move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
        let mut eta = state.eta();
        if let Some(d) = deadline {
            eta = eta.min(d.saturating_duration_since(Instant::now()));
        }
        let s = eta.as_secs();
        let _ = write!(w, "{}:{:02}", s / 60, s % 60);
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {percent:>3}% ETA {left} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key("left", left),
    );
    bar
}

/// The `raw` loop is pure `O_DIRECT`: it measures only sizes that are a multiple of this.
pub const RAW_ALIGN: u64 = 4096;

/// Pseudo-random, incompressible content (so no layer can shortcut zeros).
fn fill(buf: &mut [u8], seed: u64) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for c in buf.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let b = s.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

/// The cells that share a source file and run round-robin: size, direction, cache state.
type GroupKey = (u64, &'static str, Option<Cache>);

/// Runs the plan in `dir`.
pub fn run(plan: &Plan, subjects: &[Subject], dir: &Path, meter: &EnergyMeter) -> Result<Outcome> {
    let todo = plan.cells(subjects);
    let start = Instant::now();
    let deadline = plan.budget.map(|b| start + b);
    let bar = progress(todo.iter().map(|c| plan.work(c.0)).sum(), deadline);
    let gpu = meter.gpu_status().reason.unwrap_or_default();
    let mut cells = Vec::new();
    let mut exhausted = false;
    let mut current: Option<(u64, HostBuffer, HostBuffer)> = None;
    let source = |size: u64| dir.join(format!("read-{size}.bin"));
    // Cells of one (size, direction, cache) run their repetitions round-robin over the
    // subjects, so that a slow spell of a shared, noisy machine hits every subject alike
    // rather than whichever happened to run then.
    let mut groups: Vec<(GroupKey, Vec<usize>)> = Vec::new();
    for &(size, direction, cache, i) in &todo {
        match groups.last_mut() {
            Some((key, members)) if *key == (size, direction, cache) => members.push(i),
            _ => groups.push(((size, direction, cache), vec![i])),
        }
    }
    for ((size, direction, cache), members) in groups {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            exhausted = true;
            break;
        }
        if current.as_ref().map(|c| c.0) != Some(size) {
            if let Some((old, _, _)) = current.take() {
                let _ = std::fs::remove_file(source(old));
            }
            let len = usize::try_from(size)
                .map_err(|_| Error::new(ErrorKind::InvalidInput, "size too large for memory"))?;
            let mut data = HostBuffer::new(len)?;
            fill(&mut data, size);
            measure::write_raw(&source(size), &data).or_else(|_| {
                std::fs::write(source(size), &data[..])
                    .map_err(|e| Error::io(e, "cannot write the read source"))
            })?;
            current = Some((size, data, HostBuffer::new(len)?));
        }
        let Some((_, data, sink)) = current.as_mut() else {
            continue;
        };
        let path = source(size);
        if cache == Some(Cache::Warm) {
            measure::prime(&path, sink)?;
        }
        let target = dir.join(format!("write-{size}.bin"));
        let reps = plan.repeats_for(size);
        let mut samples: Vec<Vec<Sample>> = vec![Vec::with_capacity(reps); members.len()];
        for rep in 0..plan.warmup + reps {
            for (slot, &i) in members.iter().enumerate() {
                let subject = &subjects[i];
                bar.set_message(format!(
                    "{} {direction}{} {}",
                    subject.label(),
                    cache.map_or(String::new(), |c| format!(" {}", c.as_str())),
                    format_size(size)
                ));
                if rep == 0 && cache.is_some() {
                    sink.fill(0); // so the check below sees what this subject read
                }
                let sample = match cache {
                    None => measure::write(subject, &target, data, meter),
                    Some(c) => measure::read(subject, &path, sink, c, meter),
                }
                .map_err(|e| e.with_backend(subject.name()))?;
                if rep == 0 && direction == "read" && sink[..] != data[..] {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!("`{}` read back different bytes", subject.label()),
                    )
                    .with_path(&path));
                }
                if rep >= plan.warmup {
                    samples[slot].push(sample);
                }
                bar.inc(size + TRANSFER_COST);
            }
        }
        let _ = std::fs::remove_file(&target);
        for (slot, &i) in members.iter().enumerate() {
            cells.push(Cell::from_samples(
                &subjects[i],
                direction,
                cache,
                size,
                plan.warmup,
                &samples[slot],
                &gpu,
            ));
        }
    }
    if let Some((old, _, _)) = current.take() {
        let _ = std::fs::remove_file(source(old));
    }
    bar.finish_and_clear();
    Ok(Outcome {
        cells,
        planned: todo.len(),
        exhausted,
        elapsed: start.elapsed(),
    })
}
