//! Building an [`Engine`]: the backends allowed, the profile, the selector's settings.

use super::measure::Measurer;
use super::{Candidate, Engine, Inner, SystemClock};
use crate::profile::Warning;
use fastensor_core::debug_fields;
use fastensor_core::Clock;
use fastensor_core::{Error, ErrorKind, Knobs, Registry, Result, SharedBackend};
use fastensor_select::{Objective, SelectorConfig};
use fastensor_sys::fork::ForkRwLock;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Settings of an [`Engine`].
#[derive(Default)]
pub struct EngineBuilder {
    registry: Option<Registry>,
    extra: Vec<SharedBackend>,
    allowed: Option<Vec<String>>,
    profile: Option<PathBuf>,
    config: SelectorConfig,
    clock: Option<Arc<dyn Clock>>,
    pinned: Option<String>,
    no_cache_probe: bool,
    no_mapped_loads: bool,
    unprotected_maps: bool,
    objects: super::objects::Objects,
}

debug_fields!(EngineBuilder, "EngineBuilder", |s| {
    registry: s.registry,
    allowed: s.allowed,
    profile: s.profile,
    config: s.config,
    pinned: s.pinned,
});

impl EngineBuilder {
    /// Starts from this registry instead of every compiled-in backend.
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Adds a backend (to the compiled-in ones, or to the registry given).
    pub fn backend(mut self, backend: SharedBackend) -> Self {
        self.extra.push(backend);
        self
    }

    /// Allows only these backends (an unknown name fails `build`).
    pub fn backends<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.allowed = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Loads the dictionary from `path` when it exists and applies (see
    /// [`Engine::load_warning`]), and saves to it with [`Engine::save_profile`].
    pub fn profile(mut self, path: impl Into<PathBuf>) -> Self {
        self.profile = Some(path.into());
        self
    }

    /// What to minimise (default: wall time).
    pub fn objective(mut self, objective: Objective) -> Self {
        self.config.objective = objective;
        self
    }

    /// Exploration and drift settings (the objective set before is kept unless `config`
    /// changes it).
    pub fn selector_config(mut self, config: SelectorConfig) -> Self {
        self.config = config;
        self
    }

    /// Samples every candidate gets per context before the choice (default 3).
    pub fn min_samples(mut self, n: usize) -> Self {
        self.config.min_samples = n.max(1);
        self
    }

    /// The time source (default [`SystemClock`]); tests pass a virtual clock.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Uses this backend for every transfer.
    pub fn pin(mut self, backend: impl Into<String>) -> Self {
        self.pinned = Some(backend.into());
        self
    }

    /// Whether loads of whole checkpoints into new host memory may map the file (on by
    /// default; see [`plan_new_load`](fastensor_core::policy::plan_new_load)).
    pub fn mapped_loads(mut self, on: bool) -> Self {
        self.no_mapped_loads = !on;
        self
    }

    /// Whether a mapped load that cannot have a read lease on its file maps it anyway,
    /// unprotected from changes to the file, rather than reading it into memory of its own
    /// (off by default; see
    /// [`NewLoadFacts::unprotected_maps`](fastensor_core::policy::NewLoadFacts::unprotected_maps)).
    pub fn unprotected_maps(mut self, on: bool) -> Self {
        self.unprotected_maps = on;
        self
    }

    /// The object stores `s3://` URLs are opened through, configured by the caller (an
    /// endpoint, credentials, request sizes), rather than made from the environment on first
    /// use ([`ObjectStores::from_env`](fastensor_object::ObjectStores::from_env)).
    #[cfg(feature = "s3")]
    pub fn object_stores(mut self, stores: fastensor_object::ObjectStores) -> Self {
        self.objects.set_stores(stores);
        self
    }

    /// The cache remote objects are loaded through (a local copy of each version, read as
    /// a local file; see [`ObjectCache`](fastensor_object::ObjectCache)), or `None` for
    /// none, rather than the one `FASTENSOR_CACHE_DIR` names (read on first use).
    #[cfg(feature = "s3")]
    pub fn object_cache(mut self, cache: Option<fastensor_object::ObjectCache>) -> Self {
        self.objects.set_cache(cache);
        self
    }

    /// Turns off the page-cache probe of reads (then every read context is `Unknown`).
    pub fn probe_page_cache(mut self, on: bool) -> Self {
        self.no_cache_probe = !on;
        self
    }

    /// Builds the engine. Fails when no allowed backend is available, when an allowed or
    /// pinned name is unknown, or when the profile is corrupt.
    pub fn build(self) -> Result<Engine> {
        let mut registry = self.registry.unwrap_or_else(crate::registry);
        for b in self.extra {
            registry.register(b)?;
        }
        if let Some(allowed) = &self.allowed {
            registry.retain_names(allowed)?;
        }
        let mut unavailable = Vec::new();
        let mut candidates = Vec::new();
        for entry in registry.entries() {
            match entry.backend.probe() {
                fastensor_core::Availability::Available => candidates.push(Candidate {
                    caps: entry.backend.capabilities(),
                    backend: entry.backend.clone(),
                }),
                other => unavailable.push(format!("{}: {other}", entry.backend.name())),
            }
        }
        if candidates.is_empty() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "no backend is available{}",
                    if unavailable.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", unavailable.join("; "))
                    }
                ),
            ));
        }
        let (selector, warning) =
            crate::profile::load(self.profile.as_deref(), self.config.clone())?;
        let (candidates, warning) = apply_knobs(candidates, selector.knobs(), warning);
        let measured_new_loads = super::placement::from_knobs(selector.knobs());
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock::new()));
        let measurer = Measurer::new(
            selector,
            self.config.clone(),
            &candidates,
            clock,
            !self.no_cache_probe,
        );
        let inner = Inner {
            candidates,
            measurer,
            pinned: ForkRwLock::new(None),
            built_pin: self.pinned.clone(),
            profile: self.profile,
            mapped_loads: !self.no_mapped_loads,
            unprotected_maps: self.unprotected_maps,
            measured_new_loads,
            warning,
            objects: self.objects,
        };
        let engine = Engine {
            inner: Arc::new(inner),
        };
        if let Some(p) = &self.pinned {
            engine.pin(Some(p))?;
        }
        Ok(engine)
    }
}

/// Runs each candidate with the knob settings the profile holds for it. A backend that
/// refuses its settings keeps its defaults, and the reason becomes the load warning.
fn apply_knobs(
    candidates: Vec<Candidate>,
    knobs: &BTreeMap<String, BTreeMap<String, String>>,
    mut warning: Option<Warning>,
) -> (Vec<Candidate>, Option<Warning>) {
    let candidates = candidates
        .into_iter()
        .map(|c| {
            let Some(settings) = knobs.get(c.name()).filter(|k| !k.is_empty()) else {
                return c;
            };
            match c.backend.with_knobs(&Knobs::from(settings.clone())) {
                Ok(backend) => Candidate {
                    caps: backend.capabilities(),
                    backend,
                },
                Err(e) => {
                    warning.get_or_insert(Warning {
                        message: format!("ignoring the profile's knobs for `{}`: {e}", c.name()),
                    });
                    c
                }
            }
        })
        .collect();
    (candidates, warning)
}
