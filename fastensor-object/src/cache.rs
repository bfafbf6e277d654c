//! [`ObjectCache`]: local copies of remote objects on the machine's SSD, so that a second
//! load of a remote checkpoint is a local load (mapped, leased) instead of the network again.
//!
//! An entry is one version of one object: its name is the SHA-256 of the object's URL and
//! ETag (then the object's own file name, for people reading the directory). Every use asks
//! the server for the object's current ETag first (one HEAD): a replaced object has another
//! entry name, so its old bytes are never served; the old entry ages out. An object without
//! an ETag, or larger than the cache, is not cached (its load reads the object itself).
//!
//! A fetch streams the object (ranged GETs in flight together, each pinned to the ETag seen)
//! into a partial file named for its process, written while the next ranges arrive, synced,
//! then renamed to the entry's name: an entry that exists is complete, and a fetch killed
//! midway leaves only a partial file no load takes (removed by the next fetch's cleanup
//! once its process is gone). Processes fetching the same entry take turns on a lock file
//! of the entry's (`flock`): the first fetches, the others wait and find the entry there,
//! so one host downloads an object once. An entry is used by path; its modification time
//! is set at each use, and after each fetch the least recently used entries are removed
//! until the cache holds at most its size (a removed entry mapped by a load stays readable
//! to it).
//!
//! Layout under the cache's directory: `objects/` (entries), `partial/` (fetches under way
//! or killed), `locks/` (one empty lock file per entry ever fetched, kept: removing a lock
//! file another process waits on would let two fetch at once).

use crate::read::ObjectFile;
use crate::stores::ObjectStores;
use fastensor_core::size::parse_size;
use fastensor_core::{BackendFile, Error, ErrorKind, MemMut, Result};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Bytes one step of a fetch reads before handing them to the writer (the GETs of one step
/// are in flight together).
const FETCH_STEP: usize = 64 << 20;

/// Tries of a fetch that finds its object replaced while it is read (each asks for the new
/// version).
const FETCH_TRIES: usize = 3;

/// A size-bounded cache of remote objects in a local directory (see the module
/// documentation). Shared by every process that names the same directory.
#[derive(Debug, Clone)]
pub struct ObjectCache {
    dir: PathBuf,
    max_bytes: u64,
}

/// What [`ObjectCache::local_copy`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    /// The current version was there.
    Hit,
    /// This process fetched it.
    Fetched,
    /// Another process fetched it while this one waited.
    FetchedElsewhere,
}

impl ObjectCache {
    /// A cache in `dir` (made where missing) holding at most `max_bytes`; `None`: a quarter
    /// of the size of `dir`'s file system. Fails where the directory cannot be made or
    /// written, naming it.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: Option<u64>) -> Result<Self> {
        let dir = dir.into();
        for sub in ["objects", "partial", "locks"] {
            let d = dir.join(sub);
            fs::create_dir_all(&d).map_err(|e| {
                Error::io(e, "cannot make the object cache's directory").with_path(&d)
            })?;
        }
        let max_bytes = match max_bytes {
            Some(m) => m,
            None => {
                let st = rustix::fs::statvfs(&dir).map_err(|e| {
                    Error::io(e.into(), "cannot size the object cache's file system")
                        .with_path(&dir)
                })?;
                st.f_blocks.saturating_mul(st.f_frsize) / 4
            }
        };
        Ok(ObjectCache { dir, max_bytes })
    }

    /// The cache `FASTENSOR_CACHE_DIR` names, of at most `FASTENSOR_CACHE_MAX_BYTES` (a
    /// size such as `200G`; default a quarter of its file system); `None` when the first is
    /// unset or empty. A size that does not parse is [`ErrorKind::InvalidInput`] naming the
    /// variable.
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any variable lookup.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let Some(dir) = var("FASTENSOR_CACHE_DIR").filter(|d| !d.trim().is_empty()) else {
            return Ok(None);
        };
        let max = var("FASTENSOR_CACHE_MAX_BYTES")
            .map(|v| {
                parse_size(&v).map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidInput,
                        format!("FASTENSOR_CACHE_MAX_BYTES: {e}"),
                    )
                })
            })
            .transpose()?;
        Self::new(dir, max).map(Some)
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The most bytes its entries hold together.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Bytes held by the entries now.
    pub fn used_bytes(&self) -> Result<u64> {
        Ok(self.entries()?.iter().map(|e| e.len).sum())
    }

    /// The local copy of the current version of the object at `url` (one HEAD asks which
    /// it is), fetched through `stores` unless it is cached, and what was done; `None`
    /// where the object cannot be cached (no ETag, or larger than the cache). Errors name
    /// the object or the cache's file.
    pub fn local_copy(
        &self,
        stores: &ObjectStores,
        url: &Path,
    ) -> Result<Option<(PathBuf, CacheUse)>> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.try_local_copy(stores, url) {
                Err(e) if e.kind() == ErrorKind::Changed && tries < FETCH_TRIES => continue,
                done => return done,
            }
        }
    }

    fn try_local_copy(
        &self,
        stores: &ObjectStores,
        url: &Path,
    ) -> Result<Option<(PathBuf, CacheUse)>> {
        let object = stores.open_read(url)?;
        let Some(etag) = object.etag() else {
            return Ok(None);
        };
        let len = object.len()?;
        if len > self.max_bytes {
            return Ok(None);
        }
        let key = entry_key(url, etag);
        let entry = self.dir.join("objects").join(entry_name(&key, url));
        if self.take(&entry, len)? {
            return Ok(Some((entry, CacheUse::Hit)));
        }
        // One fetch per entry on this host: the others wait here, then find it.
        let lock_path = self.dir.join("locks").join(&key);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io(e, "cannot open the cache's lock file").with_path(&lock_path))?;
        let waited = !try_lock(&lock, &lock_path)?;
        if waited {
            rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).map_err(|e| {
                Error::io(e.into(), "cannot lock the cache's lock file").with_path(&lock_path)
            })?;
        }
        // Published by another process since the look above (a failed fetch publishes
        // nothing: this one fetches then).
        if self.take(&entry, len)? {
            return Ok(Some((entry, CacheUse::FetchedElsewhere)));
        }
        self.fetch(&object, len, &key, &entry)?;
        drop(lock);
        self.evict(&entry)?;
        Ok(Some((entry, CacheUse::Fetched)))
    }

    /// Whether the complete entry `entry` of `len` bytes is there; marks it used (where
    /// this process may: a cache of another user's is read, not touched).
    fn take(&self, entry: &Path, len: u64) -> Result<bool> {
        match File::open(entry) {
            Ok(f) => {
                let meta = f
                    .metadata()
                    .map_err(|e| Error::io(e, "cannot read a cache entry").with_path(entry))?;
                if meta.len() != len {
                    return Ok(false);
                }
                // Best effort: a time that cannot be set only makes the entry look older.
                let _ = f.set_modified(SystemTime::now());
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io(e, "cannot open a cache entry").with_path(entry)),
        }
    }

    /// Streams `object` into a partial file of this process, syncs it and renames it to
    /// `entry`. On failure the partial file is removed.
    fn fetch(&self, object: &ObjectFile, len: u64, key: &str, entry: &Path) -> Result<()> {
        let partial = self
            .dir
            .join("partial")
            .join(format!("{key}.{}", std::process::id()));
        let result = (|| {
            let file = File::create(&partial)
                .map_err(|e| Error::io(e, "cannot make a cache entry").with_path(&partial))?;
            file.set_len(len)
                .map_err(|e| Error::io(e, "cannot size a cache entry").with_path(&partial))?;
            stream_into(object, len, &file, &partial)?;
            file.sync_all()
                .map_err(|e| Error::io(e, "cannot sync a cache entry").with_path(&partial))?;
            fs::rename(&partial, entry)
                .map_err(|e| Error::io(e, "cannot publish a cache entry").with_path(entry))?;
            let objects = self.dir.join("objects");
            File::open(&objects)
                .and_then(|d| d.sync_all())
                .map_err(|e| Error::io(e, "cannot sync the cache's directory").with_path(&objects))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&partial);
        }
        result
    }

    /// The entries, least recently used first.
    fn entries(&self) -> Result<Vec<Entry>> {
        let objects = self.dir.join("objects");
        let listing = fs::read_dir(&objects)
            .map_err(|e| Error::io(e, "cannot list the object cache").with_path(&objects))?;
        let mut out: Vec<Entry> = listing
            .flatten()
            .filter_map(|d| {
                let meta = d.metadata().ok()?;
                Some(Entry {
                    path: d.path(),
                    len: meta.len(),
                    used: meta.modified().ok()?,
                })
            })
            .collect();
        out.sort_by_key(|e| e.used);
        Ok(out)
    }

    /// Removes the least recently used entries (never `keep`) until the cache holds at most
    /// its size, and the partial files of processes that are gone.
    fn evict(&self, keep: &Path) -> Result<()> {
        let entries = self.entries()?;
        let mut total: u64 = entries.iter().map(|e| e.len).sum();
        for e in entries {
            if total <= self.max_bytes {
                break;
            }
            if e.path != keep && fs::remove_file(&e.path).is_ok() {
                total -= e.len;
            }
        }
        let partial = self.dir.join("partial");
        for d in fs::read_dir(&partial).into_iter().flatten().flatten() {
            let name = d.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.rsplit_once('.'))
                .and_then(|(_, pid)| pid.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = fs::remove_file(d.path());
            }
        }
        Ok(())
    }
}

/// An entry of the cache.
struct Entry {
    path: PathBuf,
    len: u64,
    used: SystemTime,
}

/// Takes the lock of `file` if no one holds it; whether it did.
fn try_lock(file: &File, path: &Path) -> Result<bool> {
    use rustix::fs::{flock, FlockOperation};
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(Error::io(e.into(), "cannot lock the cache's lock file").with_path(path)),
    }
}

/// The SHA-256 of the URL and the ETag, in hex.
fn entry_key(url: &Path, etag: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(url.as_os_str().as_encoded_bytes());
    ctx.update(b"\0");
    ctx.update(etag.as_bytes());
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The entry's file name: its key, then the object's own name (its first 80 characters of
/// letters, digits, `.`, `-` and `_`), for people reading the directory.
fn entry_name(key: &str, url: &Path) -> String {
    let name: String = url
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(80)
        .collect();
    if name.is_empty() {
        key.to_string()
    } else {
        format!("{key}-{name}")
    }
}

/// Reads `object` in steps of [`FETCH_STEP`] while a second thread writes the step before
/// into `file` (two buffers in turn).
fn stream_into(object: &ObjectFile, len: u64, file: &File, path: &Path) -> Result<()> {
    let step = usize::try_from(len).unwrap_or(usize::MAX).min(FETCH_STEP);
    let (to_writer, written) = std::sync::mpsc::sync_channel::<(u64, Vec<u8>)>(1);
    let (back, free) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> Result<()> {
            for (offset, buf) in written {
                file.write_all_at(&buf, offset)
                    .map_err(|e| Error::io(e, "cannot write a cache entry").with_path(path))?;
                let _ = back.send(buf);
            }
            Ok(())
        });
        let read = (|| -> Result<()> {
            let mut spare = vec![vec![0u8; step], vec![0u8; step]];
            let mut offset = 0u64;
            while offset < len {
                let mut buf = match spare.pop() {
                    Some(b) => b,
                    None => free.recv().map_err(|_| writer_gone(path))?,
                };
                let n = usize::try_from(len - offset)
                    .unwrap_or(usize::MAX)
                    .min(step);
                buf.truncate(n);
                let got = object.read_at(offset, MemMut::Host(&mut buf))?;
                if got != n {
                    return Err(Error::new(ErrorKind::Io, "the object ended early")
                        .with_path(object.path())
                        .with_offset(offset + got as u64));
                }
                to_writer
                    .send((offset, buf))
                    .map_err(|_| writer_gone(path))?;
                offset += n as u64;
            }
            Ok(())
        })();
        drop(to_writer);
        let wrote = writer.join().expect("the cache writer does not panic");
        read.and(wrote)
    })
}

fn writer_gone(path: &Path) -> Error {
    Error::new(ErrorKind::Io, "the cache entry's writer stopped").with_path(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_named_by_url_and_version() {
        let a = entry_key(Path::new("s3://b/m.safetensors"), "\"e1\"");
        assert_eq!(a.len(), 64);
        assert_ne!(a, entry_key(Path::new("s3://b/m.safetensors"), "\"e2\""));
        assert_ne!(a, entry_key(Path::new("s3://b//m.safetensors"), "\"e1\""));
        assert_eq!(
            entry_name(&a, Path::new("s3://b/x/model-00001.safetensors")),
            format!("{a}-model-00001.safetensors")
        );
        assert_eq!(entry_name(&a, Path::new("s3://b/ä ")), a);
    }

    #[test]
    fn the_environment_names_the_cache_and_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap().to_string();
        let none = ObjectCache::from_vars(|_| None).unwrap();
        assert!(none.is_none());
        let vars = |max: &'static str| {
            let d = d.clone();
            move |n: &str| match n {
                "FASTENSOR_CACHE_DIR" => Some(d.clone()),
                "FASTENSOR_CACHE_MAX_BYTES" => Some(max.to_string()),
                _ => None,
            }
        };
        let c = ObjectCache::from_vars(vars("2G")).unwrap().unwrap();
        assert_eq!(c.max_bytes(), 2 << 30);
        assert!(dir.path().join("objects").is_dir());
        let e = ObjectCache::from_vars(vars("lots")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("FASTENSOR_CACHE_MAX_BYTES"), "{e}");
    }
}
