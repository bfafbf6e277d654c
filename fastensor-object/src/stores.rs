//! [`ObjectStores`]: one client per bucket, made on first use from the environment and the
//! AWS shared files, and the [`FileOpener`] of object URLs.

use crate::bucket::Bucket;
use crate::config::ObjectConfig;
use crate::error::{about, from_store};
use crate::read::ObjectFile;
use crate::write::ObjectWriter;
use fastensor_core::location::{Location, ObjectUrl};
use fastensor_core::{BackendFile, ErrorKind, FileOpener, OpenMode, Result};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

/// Where settings are looked up: a name gives its value, as the environment would (the
/// process environment, or a table a program or a test gives).
pub type Vars = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The object stores a process reads and writes: one client per bucket, made on first use,
/// sharing one set of I/O threads (made on first use too). Opens object URLs as files for the
/// checkpoint code (see the crate's documentation for what reads and writes do).
pub struct ObjectStores {
    config: ObjectConfig,
    vars: Vars,
    /// The I/O threads and clients of the process that made them: a `fork()` child makes
    /// its own (the parent's threads do not exist in it, and its connections are the
    /// parent's).
    process: Mutex<Option<PerProcess>>,
}

/// What one process made: its I/O threads and its clients, by bucket.
struct PerProcess {
    pid: u32,
    runtime: Arc<Runtime>,
    buckets: HashMap<String, Arc<Bucket>>,
}

impl std::fmt::Debug for ObjectStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStores")
            .field("config", &self.config)
            .field(
                "buckets",
                &self
                    .process
                    .lock()
                    .as_ref()
                    .map(|p| p.buckets.keys().cloned().collect::<Vec<_>>()),
            )
            .finish()
    }
}

impl ObjectStores {
    /// Stores configured by [`ObjectConfig::from_env`], credentials and endpoints from the
    /// environment and the AWS shared files.
    pub fn from_env() -> Result<Self> {
        Ok(Self::new(
            ObjectConfig::from_env()?,
            Arc::new(|name: &str| std::env::var(name).ok()),
        ))
    }

    /// Stores moving objects as `config` says, their settings looked up with `vars` (an
    /// `AWS_*` name gives its value, as the environment would).
    pub fn new(config: ObjectConfig, vars: Vars) -> Self {
        ObjectStores {
            config,
            vars,
            process: Mutex::new(None),
        }
    }

    /// How objects are moved.
    pub fn config(&self) -> &ObjectConfig {
        &self.config
    }

    /// I/O threads for this process.
    fn new_runtime() -> Result<Arc<Runtime>> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("fastensor-s3")
            .enable_all()
            .build()
            .map(Arc::new)
            .map_err(|e| {
                fastensor_core::Error::new(
                    ErrorKind::Io,
                    format!("cannot start the object-storage I/O threads: {e}"),
                )
            })
    }

    /// The client of `url`'s bucket, made on first use in this process.
    pub(crate) fn bucket(&self, url: &ObjectUrl<'_>, path: &Path) -> Result<Arc<Bucket>> {
        let mut process = self.process.lock();
        let pid = std::process::id();
        if process.as_ref().is_some_and(|p| p.pid != pid) {
            // A fork() child: the parent's threads are gone and its connections are the
            // parent's. Dropping them here would wait for threads that do not exist.
            std::mem::forget(process.take());
        }
        if process.is_none() {
            *process = Some(PerProcess {
                pid,
                runtime: Self::new_runtime()?,
                buckets: HashMap::new(),
            });
        }
        let here = process.as_mut().expect("made above");
        if let Some(b) = here.buckets.get(url.bucket) {
            return Ok(b.clone());
        }
        let store = self.client(url.bucket).map_err(|e| {
            about(
                ErrorKind::InvalidInput,
                "cannot set up the object-storage client",
                path,
            )
            .with_source(e)
        })?;
        let bucket = Arc::new(Bucket {
            store: Arc::new(store),
            in_flight: Arc::new(Semaphore::new(self.config.concurrency)),
            runtime: here.runtime.clone(),
            config: self.config.clone(),
        });
        here.buckets.insert(url.bucket.to_string(), bucket.clone());
        Ok(bucket)
    }

    /// A client of `bucket`: the AWS shared files' settings, then the environment's `AWS_*`
    /// variables over them; plain `http://` allowed where the endpoint says so.
    fn client(&self, bucket: &str) -> object_store::Result<AmazonS3> {
        let mut settings: Vec<(String, String)> = crate::profile::from_files(&*self.vars)
            .into_iter()
            .collect();
        for name in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT_URL_S3",
            "AWS_ENDPOINT",
            "AWS_ALLOW_HTTP",
            "AWS_SKIP_SIGNATURE",
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        ] {
            if let Some(v) = (self.vars)(name) {
                let key = match name {
                    "AWS_ENDPOINT_URL_S3" => "aws_endpoint_url".to_string(),
                    _ => name.to_ascii_lowercase(),
                };
                settings.push((key, v));
            }
        }
        let mut builder = AmazonS3Builder::new().with_bucket_name(bucket);
        let mut http = false;
        for (key, value) in settings {
            let Ok(key) = AmazonS3ConfigKey::from_str(&key) else {
                continue;
            };
            if key == AmazonS3ConfigKey::Endpoint {
                http = value.starts_with("http://");
            }
            builder = builder.with_config(key, value);
        }
        let c = &self.config;
        builder
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(http)
                    .with_timeout(Duration::from_secs(120))
                    .with_connect_timeout(Duration::from_secs(10)),
            )
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(50),
                    max_backoff: Duration::from_secs(10),
                    base: 2.0,
                },
                max_retries: c.retries,
                retry_timeout: c.retry_timeout,
            })
            .build()
    }

    /// The names directly under the prefix `url` (as a directory: `s3://b/dir` lists
    /// `s3://b/dir/*`, not deeper), sorted. [`ErrorKind::InvalidInput`] for a local path.
    pub fn list(&self, url: &Path) -> Result<Vec<String>> {
        let parsed = object_url(url)?;
        let bucket = self.bucket(&parsed, url)?;
        let key = parsed.key.trim_end_matches('/');
        let prefix = (!key.is_empty()).then(|| object_store::path::Path::from(key));
        let listed = bucket
            .runtime
            .block_on(bucket.store.list_with_delimiter(prefix.as_ref()))
            .map_err(|e| from_store(e, url, "list"))?;
        let mut names: Vec<String> = listed
            .objects
            .iter()
            .filter_map(|o| o.location.filename().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Deletes the object at `url` (nothing when there is none).
    pub fn delete(&self, url: &Path) -> Result<()> {
        let parsed = object_url(url)?;
        let bucket = self.bucket(&parsed, url)?;
        let key = object_store::path::Path::from(parsed.key);
        match bucket.runtime.block_on(bucket.store.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(from_store(e, url, "delete")),
        }
    }
}

/// `path` as an object URL, or [`ErrorKind::InvalidInput`].
pub(crate) fn object_url(path: &Path) -> Result<ObjectUrl<'_>> {
    match Location::of(path) {
        Location::Object(url) => Ok(url),
        _ => Err(about(
            ErrorKind::InvalidInput,
            "not an object URL (s3://bucket/key)",
            path,
        )),
    }
}

impl FileOpener for ObjectStores {
    /// `Read`: the object's size and ETag asked for once; `Truncate`: a new object written
    /// by a multipart upload, visible when the file is synced. `ReadWrite` and `Create`
    /// (changing part of an object) are [`ErrorKind::Unsupported`]: objects are written
    /// whole.
    fn list_names(&self, dir: &Path) -> Result<Vec<String>> {
        self.list(dir)
    }

    fn open_file(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        let url = object_url(path)?;
        if url.key.is_empty() || url.key.ends_with('/') {
            return Err(about(
                ErrorKind::InvalidInput,
                "an object URL needs a key after the bucket (s3://bucket/key)",
                path,
            ));
        }
        let bucket = self.bucket(&url, path)?;
        let key = object_store::path::Path::from(url.key);
        let path = PathBuf::from(path);
        match mode {
            OpenMode::Read => Ok(Box::new(ObjectFile::open(bucket, key, path)?)),
            OpenMode::Truncate => Ok(Box::new(ObjectWriter::new(bucket, key, path))),
            OpenMode::ReadWrite | OpenMode::Create => Err(about(
                ErrorKind::Unsupported,
                "objects are written whole: part of an object cannot be changed",
                &path,
            )),
        }
    }
}
