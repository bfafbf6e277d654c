//! Checkpoints in object storage: S3 and S3-compatible servers (`s3://bucket/key`), Google
//! Cloud Storage (`gs://bucket/key`) and Azure Blob Storage (`az://container/key`, or
//! `abfs[s]://container@account.dfs.core.windows.net/key`) as a
//! source and destination of fastensor's checkpoint code, each through `object_store`'s
//! client of that cloud; what follows holds for the three (`docs/objects.md` says how the
//! other two are configured), and [`ObjectCache`] keeps local copies of what is loaded.
//!
//! [`ObjectStores`] is a [`FileOpener`](fastensor_core::FileOpener) for object URLs (see
//! [`fastensor_core::location`]): opening an object for reading asks the server for its
//! size and ETag once (a HEAD), and every read after that is ranged GETs of
//! [`ObjectConfig::request_bytes`] each, [`ObjectConfig::concurrency`] of them in flight per
//! bucket, each copied into the destination memory as its bytes arrive. Every GET carries the
//! ETag seen at open (`If-Match`): an object replaced during a load is
//! [`ErrorKind::Changed`](fastensor_core::ErrorKind::Changed), which the checkpoint code
//! answers by loading it again, as it does for a local file renamed over. Opening an object
//! for writing starts nothing: the bytes written are cut into parts of
//! [`ObjectConfig::part_bytes`], each uploaded as soon as it is whole (a multipart upload,
//! parts in flight in parallel), and [`sync`](fastensor_core::BackendFile::sync) completes the
//! upload, which is when the object appears, whole. A writer dropped before that aborts the
//! upload: no object and no parts remain. A process killed mid-save leaves no object either,
//! but its uploaded parts stay stored (and billed) until the bucket's lifecycle rule for
//! incomplete multipart uploads removes them.
//!
//! Credentials, region and endpoint come the way the AWS tools take them, credentials whole
//! from the first source that is set: the environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), a web identity of the environment, the
//! static keys of the shared files' profile (`~/.aws/credentials`, `~/.aws/config`, profile
//! `AWS_PROFILE` or `default`), the instance's role; a profile that gets credentials another
//! way (`role_arn`, `credential_process`, `sso_*`, ...) is
//! [`ErrorKind::Unsupported`](fastensor_core::ErrorKind::Unsupported) naming it. Region and
//! endpoint: `AWS_REGION`, `AWS_ENDPOINT_URL` (for S3-compatible servers), else the
//! profile's; an `http://` endpoint is allowed. Keys are used as written (no character is
//! encoded into another key, `a//b` is not `a/b`); one the store cannot name as it is (`/b`,
//! `a/./b`) is [`ErrorKind::InvalidInput`](fastensor_core::ErrorKind::InvalidInput), and so
//! is listing a prefix that holds an empty segment (`object_store` cannot list such keys).
//!
//! Every call blocks its caller until done, also from inside a tokio runtime (the requests
//! run on the crate's own I/O threads); a file opened before `fork()` is
//! [`ErrorKind::Unsupported`](fastensor_core::ErrorKind::Unsupported) in the child, at once. Throttling (503 SlowDown), server errors and dropped
//! connections are retried with exponential backoff (also mid-body: the rest of the range is
//! asked for again); a missing object is [`ErrorKind::NotFound`](fastensor_core::ErrorKind::NotFound)
//! and a refused one [`ErrorKind::PermissionDenied`](fastensor_core::ErrorKind::PermissionDenied),
//! each naming the object.
//!
//! Only host memory is read into and written from; GPU memory is staged by the caller.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod bucket;
mod cache;
mod clouds;
mod config;
mod error;
mod profile;
mod read;
mod stores;
mod write;

pub use cache::{CacheUse, ObjectCache};
pub use config::ObjectConfig;
pub use stores::{ObjectStores, Vars};

/// The name `s3://` objects report as their backend in errors ([`backend_of`] names each
/// store's).
pub const BACKEND: &str = "s3";

/// The name the object at `url` reports as its backend in errors: `s3`, `gcs` or `azure`.
pub fn backend_of(url: &std::path::Path) -> &'static str {
    match fastensor_core::location::Location::of(url) {
        fastensor_core::location::Location::Object(u) if u.scheme == "gs" => "gcs",
        fastensor_core::location::Location::Object(u)
            if matches!(u.scheme, "az" | "abfs" | "abfss") =>
        {
            "azure"
        }
        _ => BACKEND,
    }
}
