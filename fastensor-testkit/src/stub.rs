//! A backend for tests made from parts: a name, its capabilities, whether it is available,
//! and what opening a file does. For the backends a test needs only to exist (one that is
//! unavailable, one that refuses every file), so that no test spells out a whole `Backend`
//! implementation for it.
//!
//! ```
//! use fastensor_core::{Backend, ErrorKind, OpenMode};
//! use fastensor_testkit::stub::StubBackend;
//!
//! let missing = StubBackend::new("missing-lib").unavailable("libfoo.so.1 not found");
//! assert!(!missing.probe().is_available());
//! let err = missing.open("/tmp/x".as_ref(), OpenMode::Read).unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::Unavailable);
//! ```

use fastensor_core::{
    Availability, Backend, BackendFile, Capabilities, Error, ErrorKind, OpenMode, Result,
};
use std::path::Path;

type Open = dyn Fn(&Path, OpenMode) -> Result<Box<dyn BackendFile>> + Send + Sync;

/// A [`Backend`] made from parts (see the module's documentation).
pub struct StubBackend {
    name: String,
    capabilities: Capabilities,
    availability: Availability,
    open: Box<Open>,
}

impl std::fmt::Debug for StubBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StubBackend")
            .field("name", &self.name)
            .field("availability", &self.availability)
            .finish_non_exhaustive()
    }
}

impl StubBackend {
    /// An available backend named `name`, with default capabilities, whose opens fail with
    /// [`ErrorKind::Unsupported`] naming the path.
    pub fn new(name: &str) -> Self {
        StubBackend {
            name: name.to_string(),
            capabilities: Capabilities::default(),
            availability: Availability::Available,
            open: Box::new(|path, _| {
                Err(Error::new(ErrorKind::Unsupported, "a stub opens no file").with_path(path))
            }),
        }
    }

    /// With these capabilities.
    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Unavailable for `reason`; its opens fail with [`ErrorKind::Unavailable`].
    pub fn unavailable(mut self, reason: &str) -> Self {
        self.availability = Availability::Unavailable {
            reason: reason.to_string(),
        };
        let reason = reason.to_string();
        self.open = Box::new(move |path, _| {
            Err(Error::new(ErrorKind::Unavailable, reason.clone()).with_path(path))
        });
        self
    }

    /// Whose opens run `open`.
    pub fn opening(
        mut self,
        open: impl Fn(&Path, OpenMode) -> Result<Box<dyn BackendFile>> + Send + Sync + 'static,
    ) -> Self {
        self.open = Box::new(open);
        self
    }
}

impl Backend for StubBackend {
    fn name(&self) -> &str {
        &self.name
    }
    fn capabilities(&self) -> Capabilities {
        self.capabilities.clone()
    }
    fn probe(&self) -> Availability {
        self.availability.clone()
    }
    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        (self.open)(path, mode)
    }
}
