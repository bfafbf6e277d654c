//! The set of backends an engine may use: those compiled in (registered with
//! [`register_backend!`](crate::register_backend)), and those added explicitly
//! ([`Registry::register`], [`Registry::insert`]). Dynamic plugins are loaded by the
//! `fastensor-plugin` crate, which inserts the backends it makes here: this crate loads no
//! shared library.

use crate::{Backend, Error, ErrorKind, Result, SharedBackend};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// A compiled-in backend, collected with `inventory`. Create it with
/// [`register_backend!`](crate::register_backend).
#[derive(Debug)]
pub struct BackendRegistration {
    /// The backend's name.
    pub name: &'static str,
    /// Builds the backend with its default settings.
    pub create: fn() -> SharedBackend,
    /// `module_path!()` of the registering code.
    pub module: &'static str,
    /// Registered with `register_backend!(@built_in ...)`, which fastensor's own backend
    /// crates use (a convention, not checked); other crates register without it and are
    /// plugins.
    pub built_in: bool,
}

inventory::collect!(BackendRegistration);

/// Registers a backend so that [`Registry::compiled_in`] finds it.
///
/// ```ignore
/// fastensor_core::register_backend!("my-backend", || std::sync::Arc::new(MyBackend::default()));
/// ```
#[macro_export]
macro_rules! register_backend {
    ($name:expr, $create:expr) => {
        $crate::register_backend!(@registration $name, $create, false);
    };
    (@built_in $name:expr, $create:expr) => {
        $crate::register_backend!(@registration $name, $create, true);
    };
    (@registration $name:expr, $create:expr, $built_in:expr) => {
        $crate::inventory::submit! {
            $crate::BackendRegistration {
                name: $name,
                create: $create,
                module: module_path!(),
                built_in: $built_in,
            }
        }
    };
}

/// Where a registered backend came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Built into fastensor.
    BuiltIn,
    /// Compiled in from another crate through `inventory`.
    CompiledInPlugin {
        /// The registering module.
        module: &'static str,
    },
    /// Added with [`Registry::register`].
    Registered,
    /// Loaded from a shared library (by `fastensor-plugin`).
    DynamicPlugin {
        /// The library file.
        path: PathBuf,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::BuiltIn => f.write_str("built in"),
            Origin::CompiledInPlugin { module } => write!(f, "compiled-in plugin ({module})"),
            Origin::Registered => f.write_str("registered"),
            Origin::DynamicPlugin { path } => write!(f, "dynamic plugin ({})", path.display()),
        }
    }
}

/// A registered backend and its origin.
#[derive(Clone)]
pub struct Entry {
    /// The backend.
    pub backend: SharedBackend,
    /// Where it came from.
    pub origin: Origin,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("name", &self.backend.name())
            .field("origin", &self.origin)
            .finish()
    }
}

/// Backends by name, iterated in name order.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    entries: BTreeMap<String, Entry>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every backend compiled into this program. Note that `inventory` only sees crates that
    /// are linked: the `fastensor` facade names every backend crate its features enable.
    pub fn compiled_in() -> Self {
        let mut reg = Registry::new();
        for r in inventory::iter::<BackendRegistration> {
            let origin = if r.built_in {
                Origin::BuiltIn
            } else {
                Origin::CompiledInPlugin { module: r.module }
            };
            let backend = (r.create)();
            if backend.name() != r.name {
                // A mismatch is the registering crate's bug; keep the backend under its own name.
                debug_assert_eq!(backend.name(), r.name, "registration name mismatch");
            }
            reg.entries
                .entry(backend.name().to_string())
                .or_insert(Entry { backend, origin });
        }
        reg
    }

    /// Adds a backend; fails when the name is taken.
    pub fn register(&mut self, backend: SharedBackend) -> Result<()> {
        self.insert(backend, Origin::Registered)
    }

    /// Adds a backend with a known origin; fails when the name is taken.
    pub fn insert(&mut self, backend: SharedBackend, origin: Origin) -> Result<()> {
        let name = backend.name().to_string();
        if self.entries.contains_key(&name) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("a backend named `{name}` is already registered"),
            ));
        }
        self.entries.insert(name, Entry { backend, origin });
        Ok(())
    }

    /// Adds a backend given as a value.
    pub fn register_value<B: Backend>(&mut self, backend: B) -> Result<()> {
        self.register(Arc::new(backend))
    }

    /// The backend called `name`; the error lists every known name.
    pub fn get(&self, name: &str) -> Result<SharedBackend> {
        self.entry(name).map(|e| e.backend.clone())
    }

    /// The entry called `name`; the error lists every known name.
    pub fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries.get(name).ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!(
                    "no backend named `{name}`; known backends: {}",
                    if self.entries.is_empty() {
                        "none".to_string()
                    } else {
                        self.names().join(", ")
                    }
                ),
            )
        })
    }

    /// Every name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    /// Every entry, sorted by name.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// Every backend whose probe says it can run here, sorted by name.
    pub fn available(&self) -> Vec<SharedBackend> {
        self.entries
            .values()
            .filter(|e| e.backend.probe().is_available())
            .map(|e| e.backend.clone())
            .collect()
    }

    /// Keeps only the backends whose names are in `names`; fails on an unknown name.
    pub fn retain_names(&mut self, names: &[impl AsRef<str>]) -> Result<()> {
        for n in names {
            self.entry(n.as_ref())?;
        }
        self.entries
            .retain(|k, _| names.iter().any(|n| n.as_ref() == k));
        Ok(())
    }

    /// Number of backends.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackendFile, Capabilities, OpenMode};
    use std::path::Path;

    /// Opens nothing; registered plainly, from this crate.
    struct Nothing;

    impl Backend for Nothing {
        fn open(&self, path: &Path, _: OpenMode) -> Result<Box<dyn BackendFile>> {
            Err(Error::new(ErrorKind::Unsupported, "opens nothing").with_path(path))
        }
        fn name(&self) -> &str {
            "registry-test-nothing"
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
        }
    }

    crate::register_backend!("registry-test-nothing", || Arc::new(Nothing));

    #[test]
    fn a_backend_registered_plainly_is_a_plugin_whatever_its_crate_is_called() {
        let registry = Registry::compiled_in();
        let entry = registry.entry("registry-test-nothing").unwrap();
        assert_eq!(
            entry.origin,
            Origin::CompiledInPlugin {
                module: "fastensor_core::registry::tests"
            }
        );
    }
}
