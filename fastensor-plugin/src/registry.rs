//! Loading plugins into a [`Registry`]: the [`RegistryExt`] extension trait.

use crate::DynamicBackend;
use fastensor_core::{Backend, Origin, Registry, Result};
use std::path::Path;
use std::sync::Arc;

/// The environment variable listing plugin libraries to load, separated by colons.
pub const PLUGINS_ENV: &str = "FASTENSOR_PLUGINS";

/// Loads dynamic plugins into a [`Registry`] (whose own
/// [`insert`](Registry::insert) takes backends already made): bring it into scope with
/// `use fastensor_plugin::RegistryExt;`.
pub trait RegistryExt {
    /// Loads the plugin library at `path` and adds its backend with
    /// [`Origin::DynamicPlugin`]; returns the backend's name.
    ///
    /// Fails, naming the file, when the file is missing
    /// ([`ErrorKind::NotFound`](fastensor_core::ErrorKind::NotFound)), is not a shared library
    /// or exports no plugin ([`ErrorKind::InvalidInput`](fastensor_core::ErrorKind::InvalidInput)),
    /// was built for another ABI version
    /// ([`ErrorKind::Unsupported`](fastensor_core::ErrorKind::Unsupported)), or when its
    /// backend's name is already taken
    /// ([`ErrorKind::AlreadyExists`](fastensor_core::ErrorKind::AlreadyExists)). The library
    /// stays loaded while the backend or any file it opened lives. Loading runs the library's
    /// code: load only files you trust (see [`DynamicBackend::load`]).
    fn load_plugin(&mut self, path: impl AsRef<Path>) -> Result<String>;

    /// Loads every library listed in [`PLUGINS_ENV`] (`FASTENSOR_PLUGINS`: paths separated by
    /// colons, the platform's path-list separator; empty entries are skipped). Returns one
    /// result per path, in order: the backend's name, or why that library was not loaded. One
    /// bad library does not stop the others.
    fn load_env_plugins(&mut self) -> Vec<Result<String>>;
}

impl RegistryExt for Registry {
    fn load_plugin(&mut self, path: impl AsRef<Path>) -> Result<String> {
        let path = path.as_ref();
        let backend = DynamicBackend::load(path)?;
        let name = backend.name().to_string();
        self.insert(
            Arc::new(backend),
            Origin::DynamicPlugin {
                path: path.to_path_buf(),
            },
        )
        .map_err(|e| e.with_path(path))?;
        Ok(name)
    }

    fn load_env_plugins(&mut self) -> Vec<Result<String>> {
        match std::env::var_os(PLUGINS_ENV) {
            Some(list) => std::env::split_paths(&list)
                .filter(|p| !p.as_os_str().is_empty())
                .map(|p| self.load_plugin(&p))
                .collect(),
            None => Vec::new(),
        }
    }
}
