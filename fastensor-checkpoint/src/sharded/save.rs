//! Writing sharded checkpoints: shards concurrently, the index last.

use super::read::open_sharded;
use crate::checksum::for_shard;
use crate::header::Header;
use crate::shard_index::{
    corrupt, read_index, shard_name, tagged_shard_name, ShardedIndex, INDEX_NAME,
};
use crate::view::TensorView;
use crate::{save_with_metadata, FileOpener};
use crate::{Error, ErrorKind, MemRef, OpenMode, Result};
use fastensor_core::parallel;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Shards written at once by [`save_sharded`] (each already split into parallel requests).
const SHARD_JOBS: usize = 2;

/// Splits tensors of `sizes` bytes, in order, into groups of at most `max` bytes (a tensor
/// larger than `max` alone), as `transformers`' `save_pretrained` does.
pub fn plan_shards(sizes: &[u64], max: u64) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0usize, 0u64);
    for (i, &s) in sizes.iter().enumerate() {
        if i > start && bytes + s > max {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += s;
    }
    if start < sizes.len() || out.is_empty() {
        out.push(start..sizes.len());
    }
    out
}

/// Saves `tensors` as a sharded checkpoint in `dir`; see [`save_sharded_with_metadata`].
pub fn save_sharded<O: FileOpener + ?Sized>(
    opener: &O,
    dir: &Path,
    tensors: &[TensorView<'_>],
    max_shard_bytes: u64,
) -> Result<ShardedIndex> {
    save_sharded_with_metadata(opener, dir, tensors, max_shard_bytes, &BTreeMap::new())
}

/// Saves `tensors` (in this order) in `dir` (created if needed) as shards of at most
/// `max_shard_bytes` of data each, every shard carrying `metadata` as its `__metadata__`
/// (checksums under [`CHECKSUMS_KEY`](crate::CHECKSUMS_KEY) restricted to the
/// shard's own tensors), and the index [`INDEX_NAME`] last; see the [module](super) for what a crash leaves.
/// Shards of an earlier save that the new index does not name are removed after it is
/// written. A duplicate name across shards is [`ErrorKind::InvalidInput`].
///
/// Under an object prefix (`s3://…`), the index is the commit point: the shards' names carry
/// a tag of this save ([`tagged_shard_name`]), so no object of the previous save is
/// replaced; the index object replaces the previous one only once every shard is complete;
/// then the shards no index names any more (the previous save's, of any shard count) are
/// deleted through [`FileOpener::remove_file`]. A save that fails or dies at any point
/// leaves the previous index and every shard it names, so a load gives the previous
/// checkpoint or the new one, never a mix (a reader that read the previous index as the new
/// one is committed may find one of its shards deleted: [`ErrorKind::NotFound`]).
pub fn save_sharded_with_metadata<O: FileOpener + ?Sized>(
    opener: &O,
    dir: &Path,
    tensors: &[TensorView<'_>],
    max_shard_bytes: u64,
    metadata: &BTreeMap<String, String>,
) -> Result<ShardedIndex> {
    if max_shard_bytes == 0 {
        return Err(
            Error::new(ErrorKind::InvalidInput, "max_shard_bytes must be positive").with_path(dir),
        );
    }
    let sizes: Vec<u64> = tensors.iter().map(|t| t.data.len() as u64).collect();
    let groups: Vec<&[TensorView<'_>]> = plan_shards(&sizes, max_shard_bytes)
        .into_iter()
        .map(|r| &tensors[r])
        .collect();
    write_shards(opener, dir, &groups, metadata)
}

/// Writes `groups` as the shards of a checkpoint in `dir`, then the index.
fn write_shards<O: FileOpener + ?Sized>(
    opener: &O,
    dir: &Path,
    groups: &[&[TensorView<'_>]],
    metadata: &BTreeMap<String, String>,
) -> Result<ShardedIndex> {
    let mut seen = HashSet::new();
    for t in groups.iter().flat_map(|g| g.iter()) {
        if !seen.insert(t.desc.name.as_str()) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("tensor `{}` is given twice", t.desc.name),
            )
            .with_path(dir));
        }
    }
    if opener.place(dir).commit == fastensor_core::Commit::OnSync {
        return write_object_shards(opener, dir, groups, metadata);
    }
    let index_path = dir.join(INDEX_NAME);
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(e, "cannot create the checkpoint directory").with_path(dir))?;
    // The old index goes first: from here until the new one is in place, no index names a
    // shard that is being replaced.
    match std::fs::remove_file(&index_path) {
        Ok(()) => sync_dir(dir)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(e, "cannot remove the old index").with_path(&index_path)),
    }
    let n = groups.len();
    let names: Vec<String> = (0..n).map(|i| shard_name(i, n)).collect();
    save_groups(opener, dir, groups, &names, metadata)?;
    let (weight_map, total, text) = index_of(groups, &names);
    fastensor_sys::atomic::write(&index_path, text.as_bytes())?;
    // Shards of an earlier save that the new index does not name.
    let keep: HashSet<String> = names.into_iter().collect();
    if let Ok(list) = std::fs::read_dir(dir) {
        for entry in list.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_shard_name(&name) && !keep.contains(&name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    Ok(ShardedIndex {
        path: index_path,
        total_size: Some(total),
        weight_map,
    })
}

/// Writes each group as the shard of its name in `names`, concurrently.
fn save_groups<O: FileOpener + ?Sized>(
    opener: &O,
    dir: &Path,
    groups: &[&[TensorView<'_>]],
    names: &[String],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let jobs: Vec<(usize, &[TensorView<'_>])> = groups.iter().copied().enumerate().collect();
    parallel::for_each(jobs, SHARD_JOBS, |(i, g)| {
        // (each shard keeps the checksums of its own tensors, if there are any)
        let metadata = for_shard(metadata, g.iter().map(|t| t.desc.name.as_str()))?;
        save_with_metadata(opener, &dir.join(&names[i]), g, &metadata)
    })
}

/// The index of `groups` saved as the shards `names`: its weight map, total size and JSON.
fn index_of(
    groups: &[&[TensorView<'_>]],
    names: &[String],
) -> (BTreeMap<String, String>, u64, String) {
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for (g, name) in groups.iter().zip(names) {
        for t in g.iter() {
            weight_map.insert(t.desc.name.clone(), name.clone());
            total += t.data.len() as u64;
        }
    }
    let json = serde_json::json!({
        "metadata": { "total_size": total },
        "weight_map": weight_map,
    });
    let text = serde_json::to_string_pretty(&json).expect("an index always serializes");
    (weight_map, total, text)
}

/// [`write_shards`] under an object prefix: shards named with a tag of this save, the index
/// object last (the commit point), then the shards no index names removed; see
/// [`save_sharded_with_metadata`].
fn write_object_shards<O: FileOpener + ?Sized>(
    opener: &O,
    dir: &Path,
    groups: &[&[TensorView<'_>]],
    metadata: &BTreeMap<String, String>,
) -> Result<ShardedIndex> {
    let n = groups.len();
    let tag = save_tag();
    let names: Vec<String> = (0..n).map(|i| tagged_shard_name(i, n, &tag)).collect();
    let index_path = dir.join(INDEX_NAME);
    let (weight_map, total, text) = index_of(groups, &names);
    let committed = save_groups(opener, dir, groups, &names, metadata).and_then(|()| {
        let file = opener.open_file(&index_path, OpenMode::Truncate)?;
        file.write_at(0, MemRef::Host(text.as_bytes()))?;
        file.sync()
    });
    if let Err(e) = committed {
        // Nothing names this save's shards: those written are removed (best effort; a
        // later save removes what is left).
        for name in &names {
            let _ = opener.remove_file(&dir.join(name));
        }
        return Err(e);
    }
    // Committed: the shards of earlier saves are named by no index now.
    let keep: HashSet<&str> = names.iter().map(String::as_str).collect();
    if let Ok(listed) = opener.list_names(dir) {
        for name in listed {
            if is_shard_name(&name) && !keep.contains(name.as_str()) {
                let _ = opener.remove_file(&dir.join(&name));
            }
        }
    }
    Ok(ShardedIndex {
        path: index_path,
        total_size: Some(total),
        weight_map,
    })
}

/// A tag no other save is expected to draw: 16 hex digits hashed (with the process's
/// random hashing keys) from the time, the process and a counter.
fn save_tag() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    h.write_u32(std::process::id());
    h.write_u64(SAVES.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

/// True for names of the form `model-NNNNN-of-NNNNN.safetensors`, or
/// `model-NNNNN-of-NNNNN-TAG.safetensors` ([`tagged_shard_name`]: a tag of 16 lowercase hex
/// digits).
fn is_shard_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("model-") else {
        return false;
    };
    let Some(rest) = rest.strip_suffix(".safetensors") else {
        return false;
    };
    let b = rest.as_bytes();
    let numbered = |b: &[u8]| {
        b[..5].iter().all(u8::is_ascii_digit)
            && &b[5..9] == b"-of-"
            && b[9..14].iter().all(u8::is_ascii_digit)
    };
    match b.len() {
        14 => numbered(b),
        31 => {
            numbered(b)
                && b[14] == b'-'
                && b[15..]
                    .iter()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        }
        _ => false,
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(e, "cannot sync the directory").with_path(dir))
}

/// Copies the sharded checkpoint at `src` to the directory `dst` through the fast path,
/// keeping its split into shards and the first shard's metadata. Returns the data bytes.
pub fn copy_sharded<O: FileOpener + ?Sized>(opener: &O, src: &Path, dst: &Path) -> Result<u64> {
    let file = open_sharded(opener, src)?;
    let shard_count = file.shard_paths().len();
    let mut shard_of = HashMap::new();
    for (s, e, _) in file.entries() {
        shard_of.insert(e.desc.name.clone(), s);
    }
    let ckpt = file.load_all()?;
    let views = ckpt.views();
    let mut groups: Vec<Vec<TensorView<'_>>> = (0..shard_count).map(|_| Vec::new()).collect();
    for v in views {
        groups[shard_of[&v.desc.name]].push(v);
    }
    groups.retain(|g| !g.is_empty());
    let slices: Vec<&[TensorView<'_>]> = groups.iter().map(Vec::as_slice).collect();
    write_shards(opener, dst, &slices, ckpt.metadata())?;
    Ok(ckpt.data_bytes())
}

/// Reads and validates the index of the sharded checkpoint at `path` and every shard's
/// header (small reads through the page cache; no backend needed), for listings.
pub fn inspect_sharded(path: &Path) -> Result<(ShardedIndex, Vec<(PathBuf, Header)>)> {
    let index = read_index(path)?;
    let mut shards = Vec::new();
    for name in index.shard_names() {
        let p = index.dir().join(name);
        let header = crate::inspect(&p)?;
        shards.push((p, header));
    }
    for (name, file) in &index.weight_map {
        let (_, h) = shards
            .iter()
            .find(|(p, _)| p.file_name().and_then(|f| f.to_str()) == Some(file.as_str()))
            .expect("every shard of the weight map was read");
        if h.get(name).is_none() {
            return Err(corrupt(
                format!("the index puts tensor `{name}` in {file}, which lacks it"),
                &index.path,
            ));
        }
    }
    Ok((index, shards))
}
