//! The index of a sharded checkpoint: its name, where it is, and reading it.

use crate::{Error, ErrorKind, OpenMode, Result};
use fastensor_core::{BackendFileExt, FileOpener};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The index file's name in a sharded checkpoint's directory.
pub const INDEX_NAME: &str = "model.safetensors.index.json";

/// Longest index file accepted.
const MAX_INDEX_LEN: u64 = 256 << 20;

/// The name of shard `i` (0-based) of `n`: `model-0000{i+1}-of-0000{n}.safetensors`.
pub fn shard_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
}

/// The name of shard `i` (0-based) of `n` of the save tagged `tag`:
/// `model-0000{i+1}-of-0000{n}-{tag}.safetensors`, how saves under an object prefix name
/// their shards, so that no object of an earlier save is replaced before the new index is.
pub fn tagged_shard_name(i: usize, n: usize, tag: &str) -> String {
    format!("model-{:05}-of-{:05}-{tag}.safetensors", i + 1, n)
}

/// A parsed `*.safetensors.index.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardedIndex {
    /// The index file.
    pub path: PathBuf,
    /// `metadata.total_size`, when given.
    pub total_size: Option<u64>,
    /// Tensor name -> shard file name (relative to the index's directory).
    pub weight_map: BTreeMap<String, String>,
}

impl ShardedIndex {
    /// The directory (or object prefix) the shards live in, ending in `/`.
    pub fn dir(&self) -> &Path {
        // By the text, up to and with the last `/`: `Path::parent` folds `a//x.json` into
        // `a`, another object prefix.
        match self
            .path
            .to_str()
            .and_then(|t| t.rfind('/').map(|i| &t[..=i]))
        {
            Some(dir) => Path::new(dir),
            None => match self.path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            },
        }
    }

    /// The shard file names, in sorted order, each once.
    pub fn shard_names(&self) -> Vec<&str> {
        let set: std::collections::BTreeSet<&str> =
            self.weight_map.values().map(String::as_str).collect();
        set.into_iter().collect()
    }
}

/// True when `path` names a sharded checkpoint: a directory, or a file ending in
/// `.index.json`. Where `opener`'s place has no directories of its own (objects), any name
/// but one ending in `.safetensors` is (a prefix such as `s3://bucket/model/` is a sharded
/// checkpoint's "directory"); no request is made.
pub fn is_sharded<O: FileOpener + ?Sized>(opener: &O, path: &Path) -> bool {
    is_sharded_at(opener.place(path), path)
}

/// [`is_sharded`] of `path`, whose place is `place` (as an opener answers it).
pub fn is_sharded_at(place: fastensor_core::Place, path: &Path) -> bool {
    if !place.directories {
        return !path.to_str().is_some_and(|p| p.ends_with(".safetensors"));
    }
    path.is_dir()
        || path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".index.json"))
}

/// The index file of a sharded checkpoint given as its directory (which holds
/// [`INDEX_NAME`], or exactly one `*.safetensors.index.json`) or as the index itself.
pub fn resolve_index(path: &Path) -> Result<PathBuf> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let default = path.join(INDEX_NAME);
    // Whatever it is: one that is not a regular file is refused when it is read.
    if std::fs::symlink_metadata(&default).is_ok() {
        return Ok(default);
    }
    let mut found = Vec::new();
    let dir = std::fs::read_dir(path)
        .map_err(|e| Error::io(e, "cannot list the directory").with_path(path))?;
    for entry in dir.flatten() {
        let name = entry.file_name();
        if name
            .to_str()
            .is_some_and(|n| n.ends_with(".safetensors.index.json") && !n.starts_with('.'))
        {
            found.push(entry.path());
        }
    }
    match found.len() {
        1 => Ok(found.pop().expect("one index")),
        0 => Err(no_index(path)),
        n => Err(many_indexes(n, path)),
    }
}

fn no_index(dir: &Path) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("no {INDEX_NAME} (nor any *.safetensors.index.json) in the directory"),
    )
    .with_path(dir)
}

fn many_indexes(n: usize, dir: &Path) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("{n} *.safetensors.index.json files in the directory: name the one to use"),
    )
    .with_path(dir)
}

pub(crate) fn corrupt(msg: impl Into<String>, path: &Path) -> Error {
    Error::new(ErrorKind::Corrupt, msg).with_path(path)
}

/// Reads the index at `path` whole (see [`open_regular`]): at most `max` bytes, the limit
/// enforced on the bytes read as well as on the length the file reports.
fn read_limited(path: &Path, max: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let (file, len) = open_regular(path)?;
    let over = || corrupt(format!("the index is over the limit of {max} bytes"), path);
    if len > max {
        return Err(over());
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(e, "cannot read the index").with_path(path))?;
    if bytes.len() as u64 > max {
        return Err(over());
    }
    Ok(bytes)
}

/// The regular file at `path` (symbolic links followed) and its length, opened for reading
/// as checkpoints are ([`fastensor_sys::atomic::open_regular`]: a FIFO cannot hang the open;
/// anything but a regular file is [`ErrorKind::InvalidInput`] naming the path).
fn open_regular(path: &Path) -> Result<(std::fs::File, u64)> {
    let file = fastensor_sys::atomic::open_regular(path)?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(e, "cannot stat the index").with_path(path))?
        .len();
    Ok((file, len))
}

/// Reads and validates the index of the sharded checkpoint at `path` (a directory or an
/// index file). Shard names must be plain file names in the index's directory. An index
/// that is not a regular file (a directory, a FIFO, a device, also through a symbolic link)
/// is [`ErrorKind::InvalidInput`], refused without blocking and without reading it; one
/// longer than 256 MiB is [`ErrorKind::Corrupt`], found so after reading at most one byte
/// past the limit.
pub fn read_index(path: &Path) -> Result<ShardedIndex> {
    let index_path = resolve_index(path)?;
    let bytes = read_limited(&index_path, MAX_INDEX_LEN)?;
    parse_index(&bytes, index_path)
}

/// [`read_index`] where `opener`'s place has directories (a local path); elsewhere (an
/// object prefix or index object, `s3://…`) read through `opener`: a prefix holds
/// [`INDEX_NAME`] or exactly one `*.safetensors.index.json` (found by listing it).
pub(crate) fn read_index_from<O: FileOpener + ?Sized>(
    opener: &O,
    path: &Path,
) -> Result<ShardedIndex> {
    if opener.place(path).directories {
        return read_index(path);
    }
    // (`Path::join` keeps the prefix as spelled: `s3://b/a//` and `x` give `s3://b/a//x`.)
    let index_path = if path.to_str().is_some_and(|t| t.ends_with(".json")) {
        path.to_path_buf()
    } else {
        let names = opener.list_names(path)?;
        if names.iter().any(|n| n == INDEX_NAME) {
            path.join(INDEX_NAME)
        } else {
            let found: Vec<&String> = names
                .iter()
                .filter(|n| n.ends_with(".safetensors.index.json") && !n.starts_with('.'))
                .collect();
            match found[..] {
                [one] => path.join(one),
                [] => return Err(no_index(path)),
                _ => return Err(many_indexes(found.len(), path)),
            }
        }
    };
    let file = opener.open_file(&index_path, OpenMode::Read)?;
    if file.len()? > MAX_INDEX_LEN {
        return Err(corrupt(
            format!("the index is over the limit of {MAX_INDEX_LEN} bytes"),
            &index_path,
        ));
    }
    let bytes = file.read_all()?;
    parse_index(&bytes, index_path)
}

/// The index in `bytes`, read from `index_path`, validated.
fn parse_index(bytes: &[u8], index_path: PathBuf) -> Result<ShardedIndex> {
    let p = index_path.as_path();
    let json: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| corrupt(format!("the index is not valid JSON: {e}"), p))?;
    let obj = json
        .as_object()
        .ok_or_else(|| corrupt("the index is not a JSON object", p))?;
    let total_size = match obj.get("metadata").and_then(|m| m.get("total_size")) {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
                .ok_or_else(|| corrupt("metadata.total_size is not a byte count", p))?,
        ),
    };
    let map = obj
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| corrupt("the index has no weight_map object", p))?;
    let mut weight_map = BTreeMap::new();
    for (name, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| corrupt(format!("weight_map[`{name}`] is not a file name"), p))?;
        let plain = Path::new(file).file_name().and_then(|f| f.to_str()) == Some(file);
        if !plain || file == ".." || file == "." {
            return Err(corrupt(
                format!(
                    "weight_map[`{name}`] = `{file}` is not a file name in the index's directory"
                ),
                p,
            ));
        }
        weight_map.insert(name.clone(), file.to_string());
    }
    Ok(ShardedIndex {
        path: index_path,
        total_size,
        weight_map,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_under_an_object_prefix_join_as_spelled() {
        // What `read_index_from` relies on: one separator, and a prefix's own `//` kept.
        let join = |p: &str, n: &str| Path::new(p).join(n);
        assert_eq!(
            join("s3://b/dir/", "x.json"),
            PathBuf::from("s3://b/dir/x.json")
        );
        assert_eq!(
            join("s3://b/dir", "x.json"),
            PathBuf::from("s3://b/dir/x.json")
        );
        assert_eq!(join("s3://b", "x"), PathBuf::from("s3://b/x"));
        assert_eq!(join("s3://b/dir//", "x"), PathBuf::from("s3://b/dir//x"));
    }

    #[test]
    fn the_length_limit_holds_for_the_bytes_read() {
        // A regular file that reports a length of 0 but holds more.
        let path = Path::new("/proc/self/status");
        let e = read_limited(path, 16).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains("over the limit of 16 bytes"), "{e}");
        assert!(read_limited(path, 1 << 20).unwrap().len() > 16);
    }

    #[test]
    fn only_regular_files_are_read() {
        for path in ["/dev/zero", "/dev/null", "/"] {
            let e = read_limited(Path::new(path), MAX_INDEX_LEN).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{path}: {e}");
            assert!(e.to_string().contains("not a regular file"), "{e}");
            assert_eq!(e.path(), Some(Path::new(path)));
        }
    }
}
