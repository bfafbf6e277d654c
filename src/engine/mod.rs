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
//! Moving bytes and learning stay apart: [`EngineFile`] (`file.rs`, `file/`) picks a
//! backend per transfer and moves the bytes; the engine's one `Measurer` (`measure/`) gives
//! each transfer its context before it runs, and times it and teaches the selector after
//! (see `docs/architecture.md`).

mod builder;
mod decisions;
mod file;
mod group;
mod measure;
mod objects;
mod opener;
mod placement;
mod report;
mod tune;
mod whole;

pub use builder::EngineBuilder;
pub use file::EngineFile;
pub use group::{GroupChoice, GroupContext, GroupRead, GroupSource};
pub use measure::{evict, SystemClock};
pub use opener::place_of;
pub use placement::{NewLoads, NewLoadsMeasured};
pub use report::{BackendUsage, Report};
pub use tune::{default_profile_path, tune, TuneOptions, TuneOutcome};

use crate::profile::Warning;
use fastensor_core::debug_fields;
use fastensor_core::{
    Capabilities, Direction, Error, ErrorKind, MemoryKind, OpenMode, Result, SharedBackend,
    TransferContext,
};
use fastensor_sys::fork::ForkRwLock;
use measure::Measurer;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

    /// True when the backend can move bytes in `ctx`'s direction and memory and has not
    /// refused the file (it is among `refused`).
    pub(crate) fn offered(&self, ctx: &TransferContext, refused: &BTreeSet<String>) -> bool {
        self.fits(ctx.direction, ctx.memory) && !refused.contains(self.name())
    }
}

/// What an [`Engine`] and its clones share: the candidates, the measurer (the selector
/// and everything it learns from), and the settings. Its lock is fork-safe
/// ([`fastensor_sys::fork`]): in a child made by `fork`, one that a thread of the parent
/// held at the fork starts again from the value the engine was built with (the builder's
/// pin) rather than blocking forever.
pub(crate) struct Inner {
    pub(crate) candidates: Vec<Candidate>,
    pub(crate) measurer: Measurer,
    pinned: ForkRwLock<Option<String>>,
    /// The pin given to the builder.
    built_pin: Option<String>,
    pub(crate) profile: Option<PathBuf>,
    /// Whether loads into new host memory may map the file (see `new_load_facts`).
    mapped_loads: bool,
    /// Whether a mapped load that cannot have a lease on its file maps it unprotected
    /// rather than reading it (see `new_load_facts`).
    unprotected_maps: bool,
    /// Where loads into new host memory put their bytes, as the profile's `fastensor tune`
    /// measured it (`None`: not measured; they map).
    measured_new_loads: Option<NewLoads>,
    pub(crate) warning: Option<Warning>,
    /// Object stores, for `s3://` URLs.
    pub(crate) objects: objects::Objects,
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

impl Inner {
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

debug_fields!(Engine, "Engine", |s| {
    backends: s.backend_names(),
    pinned: s.pinned(),
    profile: s.inner.profile,
});

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
    ///
    /// An object URL (`s3://`) is [`fastensor_core::ErrorKind::Unsupported`]:
    /// objects are opened through [`FileOpener::open_file`](fastensor_core::FileOpener::open_file)
    /// (what every checkpoint function does), which gives the object store's file.
    pub fn open(&self, path: &Path, mode: OpenMode) -> Result<EngineFile> {
        if let fastensor_core::location::Location::Object(_) = opener::resolve(path) {
            return Err(fastensor_core::Error::new(
                fastensor_core::ErrorKind::Unsupported,
                "an object is not a local file: open it through FileOpener::open_file",
            )
            .with_path(path));
        }
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

    /// Whether a backend the engine may use takes GPU device memory (its capabilities'
    /// `device_memory`): device tensors then move with no stop in host memory.
    pub fn takes_device_memory(&self) -> bool {
        self.inner.candidates.iter().any(|c| c.caps.device_memory)
    }

    /// [`takes_device_memory`](Self::takes_device_memory) for transfers of the file at
    /// `path`: never for an object (`s3://`), whose bytes arrive in host memory.
    pub fn takes_device_memory_at(&self, path: &Path) -> bool {
        matches!(
            opener::resolve(path),
            fastensor_core::location::Location::File(_)
        ) && self.takes_device_memory()
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
        self.inner.measurer.selector().dictionary()
    }

    /// Counters of the selector (choices, explorations, re-explorations, contexts).
    pub fn selector_stats(&self) -> fastensor_select::SelectorStats {
        let measurer = &self.inner.measurer;
        measurer.stats(&measurer.selector())
    }

    /// The backend chosen for a context once it is explored.
    pub fn choice_for(&self, ctx: &TransferContext) -> Option<String> {
        self.inner.measurer.best_for(ctx)
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
