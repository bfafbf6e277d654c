//! Object-store errors as fastensor errors: a kind a caller can act on, the object's URL,
//! and the store's error kept as the source.

use fastensor_core::{Error, ErrorKind};
use std::path::Path;

/// `e`, raised while `doing` something to the object at `url`, as an [`Error`] naming it.
pub(crate) fn from_store(e: object_store::Error, url: &Path, doing: &str) -> Error {
    use object_store::Error as E;
    let (kind, what) = match &e {
        E::NotFound { .. } => (ErrorKind::NotFound, "no such object".to_string()),
        E::PermissionDenied { .. } => (
            ErrorKind::PermissionDenied,
            format!("the server refused to let us {doing} it (403)"),
        ),
        E::Unauthenticated { .. } => (
            ErrorKind::PermissionDenied,
            format!("cannot {doing} it: the credentials were refused (401)"),
        ),
        E::Precondition { .. } | E::NotModified { .. } => (
            ErrorKind::Changed,
            "the object was replaced while it was read".to_string(),
        ),
        E::NotSupported { .. } | E::NotImplemented => (
            ErrorKind::Unsupported,
            format!("the server cannot {doing} it"),
        ),
        E::AlreadyExists { .. } => (ErrorKind::AlreadyExists, "the object exists".to_string()),
        E::InvalidPath { .. } | E::UnknownConfigurationKey { .. } => {
            (ErrorKind::InvalidInput, format!("cannot {doing} it"))
        }
        _ => (ErrorKind::Io, format!("cannot {doing} it")),
    };
    Error::new(kind, what)
        .with_backend(crate::backend_of(url))
        .with_path(url)
        .with_source(e)
}

/// An error of `kind` about the object at `url`.
pub(crate) fn about(kind: ErrorKind, what: impl Into<String>, url: &Path) -> Error {
    Error::new(kind, what)
        .with_backend(crate::backend_of(url))
        .with_path(url)
}
