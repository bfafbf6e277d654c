//! The engine's object stores: `s3://` URLs given to the checkpoint code are opened through
//! them (feature `s3`), made on first use from the environment (see `fastensor-object`).
//! Without the feature an object URL is [`ErrorKind::Unsupported`].

use fastensor_core::{Error, ErrorKind, FileOpener, Result};
use std::path::Path;

/// The object stores of one engine, made when an object is first opened.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    #[cfg(feature = "s3")]
    stores: std::sync::OnceLock<
        std::result::Result<fastensor_object::ObjectStores, (ErrorKind, String)>,
    >,
}

impl Objects {
    /// The stores given, rather than made from the environment.
    #[cfg(feature = "s3")]
    pub(crate) fn given(stores: fastensor_object::ObjectStores) -> Self {
        let objects = Objects::default();
        let _ = objects.stores.set(Ok(stores));
        objects
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
