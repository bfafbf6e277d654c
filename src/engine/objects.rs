//! The engine's object stores: `s3://` URLs given to the checkpoint code are opened through
//! them (feature `s3`), made on first use from the environment (see `fastensor-object`);
//! and its cache of remote objects, where it has one (given, or `FASTENSOR_CACHE_DIR` read
//! on first use). Without the feature an object URL is [`ErrorKind::Unsupported`].

use fastensor_core::{Error, ErrorKind, FileOpener, Result};
use std::path::Path;

/// The object stores of one engine, made when an object is first opened.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    #[cfg(feature = "s3")]
    stores: std::sync::OnceLock<
        std::result::Result<fastensor_object::ObjectStores, (ErrorKind, String)>,
    >,
    #[cfg(feature = "s3")]
    cache: std::sync::OnceLock<
        std::result::Result<Option<fastensor_object::ObjectCache>, (ErrorKind, String)>,
    >,
}

impl Objects {
    /// These stores, rather than ones made from the environment.
    #[cfg(feature = "s3")]
    pub(crate) fn set_stores(&mut self, stores: fastensor_object::ObjectStores) {
        self.stores = std::sync::OnceLock::from(Ok(stores));
    }

    /// This cache of remote objects (`None`: none), rather than the one
    /// `FASTENSOR_CACHE_DIR` names.
    #[cfg(feature = "s3")]
    pub(crate) fn set_cache(&mut self, cache: Option<fastensor_object::ObjectCache>) {
        self.cache = std::sync::OnceLock::from(Ok(cache));
    }

    /// The local copy of the object at `url` a load reads instead, where the engine has a
    /// cache of remote objects (see [`fastensor_object::ObjectCache::local_copy`]).
    pub(crate) fn local_copy(&self, url: &Path) -> Result<Option<std::path::PathBuf>> {
        #[cfg(feature = "s3")]
        {
            let cache = match self.cache.get_or_init(|| {
                fastensor_object::ObjectCache::from_env().map_err(|e| (e.kind(), e.to_string()))
            }) {
                Ok(Some(cache)) => cache,
                Ok(None) => return Ok(None),
                Err((kind, why)) => return Err(Error::new(*kind, why.clone()).with_path(url)),
            };
            let copy = cache.local_copy(self.stores(url)?, url)?;
            Ok(copy.map(|(path, _)| path))
        }
        #[cfg(not(feature = "s3"))]
        Err(unsupported(url))
    }

    /// The opener of the object at `url`.
    pub(crate) fn opener(&self, url: &Path) -> Result<&dyn FileOpener> {
        #[cfg(feature = "s3")]
        return self.stores(url).map(|s| s as &dyn FileOpener);
        #[cfg(not(feature = "s3"))]
        Err(unsupported(url))
    }

    /// Deletes the object at `url` (nothing when there is none).
    pub(crate) fn remove(&self, url: &Path) -> Result<()> {
        #[cfg(feature = "s3")]
        return self.stores(url)?.delete(url);
        #[cfg(not(feature = "s3"))]
        Err(unsupported(url))
    }

    #[cfg(feature = "s3")]
    fn stores(&self, url: &Path) -> Result<&fastensor_object::ObjectStores> {
        match self.stores.get_or_init(|| {
            fastensor_object::ObjectStores::from_env().map_err(|e| (e.kind(), e.to_string()))
        }) {
            Ok(stores) => Ok(stores),
            Err((kind, why)) => Err(Error::new(*kind, why.clone()).with_path(url)),
        }
    }
}

#[cfg(not(feature = "s3"))]
fn unsupported(url: &Path) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        "object storage needs fastensor built with the `s3` feature",
    )
    .with_path(url)
}
