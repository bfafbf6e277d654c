//! [`ObjectStores`]: one client per bucket, made on first use from the environment and the
//! AWS shared files, and the [`FileOpener`] of object URLs.

use crate::bucket::Store;
use crate::bucket::{Bucket, IoThreads};
use crate::config::ObjectConfig;
use crate::error::{about, from_store};
use crate::read::ObjectFile;
use crate::write::ObjectWriter;
use fastensor_core::location::{Location, ObjectUrl};
use fastensor_core::{BackendFile, ErrorKind, FileOpener, OpenMode, Result};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::{BackoffConfig, ClientOptions, RetryConfig};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
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
    io: Arc<IoThreads>,
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

    /// The client of `url`'s bucket, made on first use in this process.
    pub(crate) fn bucket(&self, url: &ObjectUrl<'_>, path: &Path) -> Result<Arc<Bucket>> {
        let mut process = self.process.lock();
        let pid = std::process::id();
        if process.as_ref().is_some_and(|p| p.pid != pid) {
            // A fork() child: the parent's threads are gone and its connections are the
            // parent's. Dropping them here would close what the parent still uses.
            std::mem::forget(process.take());
        }
        if process.is_none() {
            *process = Some(PerProcess {
                pid,
                io: Arc::new(IoThreads::new()?),
                buckets: HashMap::new(),
            });
        }
        let here = process.as_mut().expect("made above");
        let name = format!("{}://{}", url.scheme, url.bucket);
        if let Some(b) = here.buckets.get(&name) {
            return Ok(b.clone());
        }
        let store = self.client(url, path)?;
        let bucket = Arc::new(Bucket {
            store,
            in_flight: Arc::new(Semaphore::new(self.config.concurrency)),
            io: here.io.clone(),
            config: self.config.clone(),
        });
        here.buckets.insert(name, bucket.clone());
        Ok(bucket)
    }

    /// A client of `url`'s bucket (S3), bucket (GCS) or container (Azure), configured as
    /// each cloud's tools are ([`crate::profile`] for S3, [`crate::clouds`] for the
    /// others); plain `http://` allowed where the endpoint says so. Errors name `path`.
    fn client(&self, url: &ObjectUrl<'_>, path: &Path) -> Result<Arc<dyn Store>> {
        let refused = |e: object_store::Error| {
            about(
                ErrorKind::InvalidInput,
                "cannot set up the object-storage client",
                path,
            )
            .with_source(e)
        };
        let named = |e: fastensor_core::Error| e.with_path(path);
        // Each builder takes its settings, the HTTP options and the retries the same way.
        macro_rules! built {
            ($builder:expr, $keys:expr, $http:expr) => {{
                let mut builder = $builder;
                for (key, value) in $keys {
                    builder = builder.with_config(key, value);
                }
                let store = builder
                    .with_client_options(self.client_options($http))
                    .with_retry(self.retry())
                    .build()
                    .map_err(refused)?;
                Ok(Arc::new(store) as Arc<dyn Store>)
            }};
        }
        match url.scheme {
            "gs" => {
                let s = crate::clouds::gcs(&*self.vars).map_err(named)?;
                let builder = GoogleCloudStorageBuilder::new().with_bucket_name(url.bucket);
                built!(builder, s.keys, s.http)
            }
            "az" => {
                let s = crate::clouds::azure(&*self.vars).map_err(named)?;
                let builder = MicrosoftAzureBuilder::new().with_container_name(url.bucket);
                built!(builder, s.keys, s.http)
            }
            "abfs" | "abfss" => {
                // `container@account.dfs.core.windows.net`: the URL names the account too.
                let (container, account) =
                    crate::clouds::abfs_authority(url.bucket).ok_or_else(|| {
                        about(
                            ErrorKind::InvalidInput,
                            "an abfs:// URL names `container@account.dfs.core.windows.net`",
                            path,
                        )
                    })?;
                let mut s = crate::clouds::azure(&*self.vars).map_err(named)?;
                s.keys
                    .retain(|(k, _)| *k != object_store::azure::AzureConfigKey::AccountName);
                s.keys.push((
                    object_store::azure::AzureConfigKey::AccountName,
                    account.to_string(),
                ));
                let builder = MicrosoftAzureBuilder::new().with_container_name(container);
                built!(builder, s.keys, s.http)
            }
            _ => {
                let settings = crate::profile::settings(&*self.vars).map_err(named)?;
                let keys: Vec<(AmazonS3ConfigKey, String)> = settings
                    .into_iter()
                    .filter_map(|(k, v)| Some((AmazonS3ConfigKey::from_str(&k).ok()?, v)))
                    .collect();
                let http = keys
                    .iter()
                    .any(|(k, v)| *k == AmazonS3ConfigKey::Endpoint && v.starts_with("http://"));
                built!(
                    AmazonS3Builder::new().with_bucket_name(url.bucket),
                    keys,
                    http
                )
            }
        }
    }

    /// The HTTP settings of every client: time limits, and plain `http://` where `http`.
    fn client_options(&self, http: bool) -> ClientOptions {
        ClientOptions::new()
            .with_allow_http(http)
            .with_timeout(Duration::from_secs(120))
            .with_connect_timeout(Duration::from_secs(10))
    }

    /// Retries with exponential backoff, as [`ObjectConfig`] says.
    fn retry(&self) -> RetryConfig {
        let c = &self.config;
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_secs(10),
                base: 2.0,
            },
            max_retries: c.retries,
            retry_timeout: c.retry_timeout,
        }
    }

    /// The names directly under the prefix `url` (as a directory: `s3://b/dir` lists
    /// `s3://b/dir/*`, not deeper), sorted. [`ErrorKind::InvalidInput`] for a local path.
    pub fn list(&self, url: &Path) -> Result<Vec<String>> {
        let parsed = object_url(url)?;
        let bucket = self.bucket(&parsed, url)?;
        let key = parsed.key.strip_suffix('/').unwrap_or(parsed.key);
        let prefix = if key.is_empty() {
            None
        } else {
            Some(object_key(key, url)?)
        };
        let listed = bucket
            .io
            .block_on(url, bucket.store.list_with_delimiter(prefix.as_ref()))?
            .map_err(|e| match e {
                // The store's client names what it lists by `Path::parse`, which refuses
                // empty segments: a listing that holds `p//...` cannot be returned.
                object_store::Error::InvalidPath { .. } => about(
                    ErrorKind::InvalidInput,
                    "cannot list it: a key under it has an empty segment (`a//b`), which the \
                     store's client cannot list (such objects are read, written and removed \
                     by their own URL)",
                    url,
                )
                .with_source(e),
                e => from_store(e, url, "list"),
            })?;
        let mut names: Vec<String> = listed
            .objects
            .iter()
            .filter_map(|o| o.location.filename().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    /// The bucket and key of the object `path` names; an URL without a key is
    /// [`ErrorKind::InvalidInput`].
    fn object(&self, path: &Path) -> Result<(Arc<Bucket>, object_store::path::Path)> {
        let url = object_url(path)?;
        if url.key.is_empty() || url.key.ends_with('/') {
            return Err(about(
                ErrorKind::InvalidInput,
                "an object URL needs a key after the bucket (s3://bucket/key)",
                path,
            ));
        }
        let key = object_key(url.key, path)?;
        Ok((self.bucket(&url, path)?, key))
    }

    /// The object at `url` opened for reading (one HEAD: its size and ETag).
    pub(crate) fn open_read(&self, url: &Path) -> Result<ObjectFile> {
        let (bucket, key) = self.object(url)?;
        ObjectFile::open(bucket, key, url.to_path_buf())
    }

    /// Deletes the object at `url` (nothing when there is none).
    pub fn delete(&self, url: &Path) -> Result<()> {
        let parsed = object_url(url)?;
        let bucket = self.bucket(&parsed, url)?;
        let key = object_key(parsed.key, url)?;
        match bucket.io.block_on(url, bucket.store.delete(&key))? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(from_store(e, url, "delete")),
        }
    }
}

/// `key` as the store's path, exactly as written: `#`, `[`, `]`, `%`, spaces, empty segments
/// (`a//b`) and any other character kept, never percent-encoded into another key. A key the
/// store cannot name as it is (one starting with `/`, a `.` or `..` segment, a control
/// character) is [`ErrorKind::InvalidInput`] naming `url`: refused rather than changed into
/// another key.
pub(crate) fn object_key(key: &str, url: &Path) -> Result<object_store::path::Path> {
    use object_store::path::{Path as Key, PathPart};
    let refused = || {
        about(
            ErrorKind::InvalidInput,
            format!(
                "the key `{key}` cannot be named as it is (a leading `/`, a `.` or `..` \
                 segment, or a control character): refused rather than changed into another key"
            ),
            url,
        )
    };
    // Segment by segment: `Path::parse` refuses empty segments and `Path::from` drops them,
    // but a child may be empty, so `a//b` is named as it is.
    let mut built = Key::default();
    for (i, segment) in key.split('/').enumerate() {
        if i == 0 && segment.is_empty() && !key.is_empty() {
            return Err(refused());
        }
        built = built.child(PathPart::parse(segment).map_err(|_| refused())?);
    }
    if built.as_ref() == key {
        Ok(built)
    } else {
        Err(refused())
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
    fn place(&self, _path: &Path) -> fastensor_core::Place {
        fastensor_core::Place::OBJECT
    }

    fn list_names(&self, dir: &Path) -> Result<Vec<String>> {
        self.list(dir)
    }

    fn remove_file(&self, path: &Path) -> Result<()> {
        self.delete(path)
    }

    fn open_file(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        let (bucket, key) = self.object(path)?;
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
