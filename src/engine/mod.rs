//! The engine: a registry of backends plus a selector that picks, per transfer, the backend
//! that is fastest for its context, measures it, and learns.
//!
//! ```no_run
//! use fastensor::{Engine, OpenMode};
//! # fn main() -> fastensor::Result<()> {
//! let engine = Engine::builder().profile("/tmp/fastensor-profile.toml").build()?;
//! let file = engine.open("/data/tensor.bin".as_ref(), OpenMode::Create)?;
//! let data = vec![7u8; 1 << 20];
//! file.write_at(0, &data)?;
//! let mut back = vec![0u8; 1 << 20];
//! file.read_at(0, &mut back)?;
//! println!("{}", engine.report());
//! engine.save_profile()?;
//! # Ok(()) }
//! ```
//!
//! What a transfer's context and cost are:
//!
//! * A read's context includes the page-cache state of its bytes, asked without reading
//!   anything (`cachestat`, else `mincore`). A read that continues a stream (it starts where
//!   the last one ended) carries the state probed at the stream's first read, and stream
//!   reads are measured in runs (their mean cost): a buffered stream's reads from the
//!   device are mostly cheap and sometimes wait for the readahead they started, so its runs
//!   span 8 MiB (a readahead window) and each is recorded joined with the one before it
//!   (windows that wait and windows read ahead come in turn; a path's first window is held
//!   back until then); other runs end after 8 reads or 4 MiB. While a stream context is
//!   explored, each path keeps the stream for a run of reads. A path that takes a stream
//!   over from another, exploring or chosen, is measured only after warming up there (a
//!   path through the page cache: 8 MiB, or 32 reads; a direct one: 2 reads; see
//!   `stream.rs`); its warm-up reads, like a backend's first transfer on a file of 1 MiB or
//!   more (not from the page cache), are offered only to rule a path far behind out.
//! * The writes the selector chose are recorded in runs too, of up to 8 writes or 512 KiB
//!   (a record takes the selector's lock); an exploration's writes one by one, since the
//!   selector needs each to pick the next (see `write_run.rs`).
//! * The engine counts how many of the bytes read were read before (through the same open
//!   file); when the workload reads bytes again, cold reads are judged with the next read
//!   included, so a path that leaves the bytes in the page cache can win over a faster one
//!   that bypasses it (see [`Reuse`](fastensor_select::Reuse)).
//! * Writes with a durable purpose
//!   ([`Purpose::durable_writes`](fastensor_core::Purpose::durable_writes)) are timed until
//!   their bytes have reached the device.
//! * Wall time is read for every transfer; the process CPU clock (about a microsecond a
//!   reading in a VM, as much as a cached 4 KiB read) only while exploring, when the
//!   objective weighs CPU, and on one exploiting transfer in 16.
//! * A file keeps the selector's last answers and asks again only when the selector's
//!   [`fastensor_select::Epochs`] say an answer may have changed: a choice stands
//!   until some context's choice changes, an exploration's answer until anything is
//!   recorded (a stream's reads are recorded once per run). Asking costs a lock, a context
//!   key and a scan of the candidates, a few hundred nanoseconds per transfer.

mod builder;
mod decisions;
mod file;
mod opener;
mod probe;
mod report;
mod reread;
mod stream;
mod tune;
mod usage;
mod write_run;

pub use builder::EngineBuilder;
pub use file::EngineFile;
pub use probe::{evict, SystemClock};
pub use report::{BackendUsage, Report};
pub use tune::{default_profile_path, tune, TuneOptions, TuneOutcome};

use fastensor_core::{
    Capabilities, Direction, Error, ErrorKind, MemoryKind, OpenMode, Result, SharedBackend,
    TransferContext,
};
use fastensor_select::{
    Choice, Clock, ContextKey, Dictionary, Epochs, Observation, Selector, SelectorConfig,
    SelectorStats, Warning,
};
use fastensor_sys::fork::{ForkMutex, ForkRwLock};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
pub(crate) use usage::{InFlight, InFlightCount, Usage};

/// One backend the engine may use.
#[derive(Clone)]
pub(crate) struct Candidate {
    pub(crate) backend: SharedBackend,
    pub(crate) caps: Capabilities,
}

impl Candidate {
    pub(crate) fn name(&self) -> &str {
        self.backend.name()
    }

    /// True when the backend can move bytes this way with this memory.
    pub(crate) fn fits(&self, direction: Direction, memory: MemoryKind) -> bool {
        let way = match direction {
            Direction::Read => self.caps.read,
            Direction::Write => self.caps.write,
        };
        way && self.caps.supports_memory(memory)
    }

    /// True when the backend reads through the page cache (it reads ahead, and what it reads
    /// stays cached).
    pub(crate) fn keeps_cache(&self) -> bool {
        self.caps.read && !self.caps.bypasses_page_cache
    }
}

/// What an [`Engine`] and its clones share. Its locks are fork-safe
/// ([`fastensor_sys::fork`]): in a child made by `fork`, one that a thread of the parent held
/// at the fork starts again from the value the engine was built with (the selector's
/// dictionary as built, the builder's pin, no device windows) rather than blocking forever.
pub(crate) struct Inner {
    pub(crate) candidates: Vec<Candidate>,
    selector: ForkMutex<Selector>,
    /// The selector's settings and dictionary as built (what a child restarts from, see
    /// above).
    built: (SelectorConfig, Dictionary),
    pub(crate) clock: Arc<dyn Clock>,
    pinned: ForkRwLock<Option<String>>,
    /// The pin given to the builder.
    built_pin: Option<String>,
    pub(crate) profile: Option<PathBuf>,
    pub(crate) in_flight: InFlightCount,
    pub(crate) detect_cache: bool,
    /// Whether loads into new host memory may map the file (see `maps_new_loads`).
    mapped_loads: bool,
    /// Loads into new host memory decided so far: mapped, read through a backend.
    new_loads: [AtomicU64; 2],
    /// Jobs of reads given one backend each (see `file/job.rs`).
    jobs: AtomicU64,
    /// Use per candidate (same order as `candidates`).
    pub(crate) usage: Vec<Usage>,
    pub(crate) warning: Option<Warning>,
    /// Whether the objective weighs CPU time (then every transfer reads the CPU clock).
    pub(crate) objective_uses_cpu: bool,
    /// Transfers timed so far (paces the CPU clock readings of exploiting transfers).
    pub(crate) transfers: AtomicU64,
    /// Bytes read for the first time and read again (see [`fastensor_select::Reuse`]).
    pub(crate) reads: reread::ReadCounts,
    /// The selector's [`Epochs`] as last seen (`state`, `choices`), readable without its
    /// lock: files reuse its answers while they stay (see `decisions.rs`).
    epochs: [AtomicU64; 2],
    /// Choices answered from a file's kept answers, and how many of them explorations
    /// (added to the selector's counters in [`Inner::stats`]).
    reused: [AtomicU64; 2],
    /// The readahead window of each device seen (`major:minor` -> bytes), read from sysfs
    /// once per device rather than at every file open.
    windows: ForkMutex<BTreeMap<String, u64>>,
}

/// The readahead window assumed where the device's cannot be read (no sysfs, no backing
/// device): the largest `read_ahead_kb` commonly set (some virtual disks'). A run longer than
/// the true window only measures less often; a shorter one would miss its waits.
const FALLBACK_WINDOW: u64 = 8 << 20;

impl Inner {
    /// The readahead window of the device `device` (see [`Inner::windows`]).
    pub(crate) fn read_ahead_window(&self, device: &str) -> u64 {
        let mut windows = self.windows.lock();
        *windows
            .entry(device.to_string())
            .or_insert_with(|| fastensor_sys::read_ahead_bytes(device).unwrap_or(FALLBACK_WINDOW))
    }
}

/// The context of a plain host read of `bytes` in `cache` state (for the engine's tests).
#[cfg(test)]
pub(crate) fn test_read(bytes: u64, cache: fastensor_core::CacheState) -> TransferContext {
    TransferContext {
        direction: Direction::Read,
        bytes,
        memory: MemoryKind::Host,
        location: Default::default(),
        in_flight: 1,
        purpose: fastensor_core::Purpose::General,
        cache,
    }
}

/// The context of a plain host write of `bytes` with `in_flight` requests in flight (for the
/// engine's tests).
#[cfg(test)]
pub(crate) fn test_write(bytes: u64, in_flight: u32) -> TransferContext {
    TransferContext {
        direction: Direction::Write,
        in_flight,
        ..test_read(bytes, fastensor_core::CacheState::Unknown)
    }
}

/// One exploiting transfer in this many reads the process CPU clock.
pub(crate) const CPU_SAMPLE_EVERY: u64 = 16;

/// A transfer of this many bytes or more is large: its own time dwarfs the fixed costs of
/// one transfer (a reading of the CPU clock, a page-cache probe, a handle's set-up, one
/// readahead wait). An exploring read continuing a stream reads the CPU clock when it is
/// large, else one in [`CPU_SAMPLE_EVERY`]; an exploring first transfer through a backend
/// that is large (and not from the page cache) is offered as a warm-up read (see
/// `file/account.rs`); a stream re-probes the page cache every `LARGE` bytes; and a warm-up
/// run of small reads is judged without its slowest (see `Run::far_test_wall`).
pub(crate) const LARGE: u64 = 1 << 20;

impl Inner {
    pub(crate) fn selector(&self) -> std::sync::MutexGuard<'_, Selector> {
        self.selector.lock_or(|| self.built_selector())
    }

    /// A selector as the engine was built with (see [`Inner`]).
    fn built_selector(&self) -> Selector {
        let (config, dictionary) = &self.built;
        let mut selector =
            Selector::from_dictionary(dictionary, config.clone()).unwrap_or_else(|_| {
                let mut s = Selector::new(config.clone());
                s.set_fingerprint(dictionary.fingerprint.clone());
                s
            });
        selector.reuse_mut().set_keeping(
            self.candidates
                .iter()
                .filter(|c| c.keeps_cache())
                .map(|c| c.name().to_string()),
        );
        selector
    }

    /// The engine's pinned backend, if any.
    pub(crate) fn pinned(&self) -> std::sync::RwLockReadGuard<'_, Option<String>> {
        self.pinned.read_or(|| self.built_pin.clone())
    }

    /// The candidate called `name`.
    pub(crate) fn candidate(&self, name: &str) -> Result<&Candidate> {
        Ok(&self.candidates[self.candidate_index(name)?])
    }

    /// The index of the candidate called `name` among the candidates.
    pub(crate) fn candidate_index(&self, name: &str) -> Result<usize> {
        self.candidates
            .iter()
            .position(|c| c.name() == name)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "no available backend named `{name}`; available: {}",
                        self.candidates
                            .iter()
                            .map(|c| c.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
    }

    /// Chooses among `names` for `ctx`, staying on `stay` while exploring it (see
    /// [`Selector::choose_staying`]); with the selector's epochs after choosing.
    pub(crate) fn choose(
        &self,
        ctx: &TransferContext,
        names: &[&str],
        stay: Option<&str>,
    ) -> (Option<Choice>, Epochs) {
        let mut sel = self.selector();
        let choice = sel.choose_staying(ctx, names, stay);
        (choice, self.publish(&sel))
    }

    /// Makes the selector's epochs readable without its lock (see [`Inner::epochs`]), and
    /// returns them.
    fn publish(&self, sel: &Selector) -> Epochs {
        let e = sel.epochs();
        self.epochs[0].store(e.state, Ordering::Release);
        self.epochs[1].store(e.choices, Ordering::Release);
        e
    }

    /// The selector's epochs as last published (a transfer reading them while another
    /// thread records may see the older ones: its answer is then one observation late).
    pub(crate) fn epochs(&self) -> Epochs {
        Epochs {
            state: self.epochs[0].load(Ordering::Acquire),
            choices: self.epochs[1].load(Ordering::Acquire),
        }
    }

    /// Counts a choice answered from a file's kept answers.
    pub(crate) fn count_reused(&self, exploring: bool) {
        self.reused[0].fetch_add(1, Ordering::Relaxed);
        if exploring {
            self.reused[1].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The selector's counters, the choices answered from kept answers included.
    pub(crate) fn stats(&self, sel: &Selector) -> SelectorStats {
        let mut stats = sel.stats();
        stats.choices += self.reused[0].load(Ordering::Relaxed);
        stats.explorations += self.reused[1].load(Ordering::Relaxed);
        stats
    }

    /// Whether the next transfer reads the process CPU clock: when the objective needs it,
    /// when `sampled` (a transfer measured on its own while exploring), and one other
    /// transfer in [`CPU_SAMPLE_EVERY`] (reading that clock costs about a microsecond here,
    /// as much as a cached 4 KiB read; the others carry the last measured CPU cost per byte,
    /// and a run of stream reads scales the CPU time of those of its reads that read it).
    pub(crate) fn reads_cpu(&self, sampled: bool) -> bool {
        sampled
            || self.objective_uses_cpu
            || self.transfers.fetch_add(1, Ordering::Relaxed) % CPU_SAMPLE_EVERY == 0
    }

    /// The selector, about to learn from a measurement: told the workload's current re-read
    /// rate first (see [`Reuse`](fastensor_select::Reuse)).
    fn learning_selector(&self) -> std::sync::MutexGuard<'_, Selector> {
        let mut sel = self.selector();
        sel.reuse_mut().set_rate(self.reads.rate());
        sel
    }

    /// Offers the selector a measurement that counts only if it shows `backend` far behind
    /// the leader (see [`Selector::record_if_far`]).
    pub(crate) fn record_if_far(
        &self,
        ctx: &TransferContext,
        backend: &str,
        bytes: u64,
        wall: Duration,
        cpu: Option<Duration>,
    ) {
        if bytes == 0 {
            return;
        }
        let mut sel = self.learning_selector();
        // Unread: the candidate's last measured CPU cost per byte (as for a transfer).
        let cpu = cpu.unwrap_or_else(|| {
            Duration::from_nanos((sel.cpu_per_byte(ctx, backend) * bytes as f64) as u64)
        });
        sel.record_if_far(ctx, backend, Observation { bytes, wall, cpu });
        self.publish(&sel);
    }

    /// Records a transfer of `bytes` through `backend`: its wall time, and its CPU time when
    /// it was read (see [`Inner::reads_cpu`]).
    pub(crate) fn record(
        &self,
        ctx: &TransferContext,
        backend: &str,
        bytes: u64,
        wall: Duration,
        cpu: Option<Duration>,
    ) {
        if bytes > 0 {
            let mut sel = self.learning_selector();
            // The fingerprint is cloned only when it gains a device (`add_location` skips
            // unknown and known ones), not on every transfer.
            let device = &ctx.location.device;
            if !device.is_empty()
                && !sel
                    .fingerprint()
                    .devices
                    .iter()
                    .any(|d| &d.device == device)
            {
                let mut fp = sel.fingerprint().clone();
                fp.add_location(&ctx.location, &crate::profile::ThisMachine);
                sel.set_fingerprint(fp);
            }
            match cpu {
                Some(cpu) => sel.record(ctx, backend, Observation { bytes, wall, cpu }),
                None => {
                    sel.record_wall_only(ctx, backend, bytes, wall);
                }
            }
            self.publish(&sel);
        }
    }

    /// The backend the selector has found best for `ctx`, once that context is explored.
    pub(crate) fn best_for(&self, ctx: &TransferContext) -> Option<String> {
        self.selector()
            .choice_for(&ContextKey::of(ctx))
            .map(String::from)
    }

    /// Counts a job's decision (see `file/job.rs`).
    pub(crate) fn count_job(&self) {
        self.jobs.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a transfer through the candidate at `index` in its use (see [`Report`]), with
    /// its CPU time when it was read.
    pub(crate) fn add_usage(
        &self,
        index: usize,
        bytes: u64,
        wall: Duration,
        cpu: Option<Duration>,
    ) {
        if let Some(u) = self.usage.get(index) {
            u.add(bytes, wall, cpu);
        }
    }
}

/// A registry of backends plus a selector. Cheap to clone (clones share everything), `Send`
/// and `Sync`: open files from any thread.
///
/// An engine, and the files opened through it, keep working in a child process made by
/// `fork(2)` (Python's `os.fork`, torch `DataLoader` workers), alongside the parent: the
/// child sets up io_uring rings of its own and never touches the parent's, and a lock that
/// a thread of the parent held at the fork is replaced in the child (the state it guarded
/// restarts from the engine as built, or from the file as opened) rather than waited for.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("backends", &self.backend_names())
            .field("pinned", &self.pinned())
            .field("profile", &self.inner.profile)
            .finish()
    }
}

impl Engine {
    /// Settings for a new engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// An engine with every compiled-in available backend and default settings.
    pub fn new() -> Result<Engine> {
        Self::builder().build()
    }

    /// Opens `path`. `Create` and `Truncate` take effect once, here; the handles of the
    /// backends the transfers choose are opened later, when first needed, and kept.
    pub fn open(&self, path: &Path, mode: OpenMode) -> Result<EngineFile> {
        EngineFile::open(self.inner.clone(), path, mode)
    }

    /// The names of the backends the engine may use (available ones only), sorted.
    pub fn backend_names(&self) -> Vec<String> {
        self.inner
            .candidates
            .iter()
            .map(|c| c.name().to_string())
            .collect()
    }

    /// Uses `backend` for every transfer (of every file), or lets the selector choose again
    /// with `None`. Fails for a backend that is not available.
    pub fn pin(&self, backend: Option<&str>) -> Result<()> {
        if let Some(name) = backend {
            self.inner.candidate(name)?;
        }
        *self.inner.pinned.write_or(|| self.inner.built_pin.clone()) = backend.map(String::from);
        Ok(())
    }

    /// The pinned backend, if any.
    pub fn pinned(&self) -> Option<String> {
        self.inner.pinned().clone()
    }

    /// Why the profile given to the builder was not used (another machine or format
    /// version), for the caller to print.
    pub fn load_warning(&self) -> Option<&Warning> {
        self.inner.warning.as_ref()
    }

    /// What the engine has chosen and measured so far.
    pub fn report(&self) -> Report {
        Report::of(self)
    }

    /// A copy of the selector's dictionary.
    pub fn dictionary(&self) -> fastensor_select::Dictionary {
        self.inner.selector().dictionary()
    }

    /// Counters of the selector (choices, explorations, re-explorations, contexts).
    pub fn selector_stats(&self) -> fastensor_select::SelectorStats {
        self.inner.stats(&self.inner.selector())
    }

    /// The backend chosen for a context once it is explored.
    pub fn choice_for(&self, ctx: &TransferContext) -> Option<String> {
        self.inner
            .selector()
            .choice_for(&ContextKey::of(ctx))
            .map(String::from)
    }

    /// Saves what was learned to the profile path given to the builder (atomically).
    /// Fails with [`ErrorKind::InvalidInput`] when no path was given.
    pub fn save_profile(&self) -> Result<()> {
        let path = self.inner.profile.as_ref().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                "the engine was built without a profile path",
            )
        })?;
        self.save_profile_to(path)
    }

    /// Saves what was learned to `path`, atomically and durably (see
    /// [`AtomicFile`](crate::atomic::AtomicFile): a target that is not a regular file is
    /// refused, a symbolic link at `path` replaced by the new file (never followed), the
    /// old file's mode kept).
    pub fn save_profile_to(&self, path: &Path) -> Result<()> {
        crate::profile::save(&self.dictionary(), path)
    }
}
