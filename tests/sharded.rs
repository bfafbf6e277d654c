//! Sharded checkpoints in the Hugging Face layout: save, load (all, selected, into buffers),
//! interop with the `safetensors` crate both ways, the index written last, hostile indexes,
//! and raw ranged reads across files.

mod common;

use common::views;
use fastensor::checkpoint::{self, sharded};
use fastensor::posix::{DirectBackend, PosixBackend};
use fastensor::{BackendFile, DType, Error, ErrorKind, MemMut, OpenMode, Result, TensorDesc};
use safetensors::tensor::{Dtype, SafeTensors, TensorView as StView};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use tempfile::TempDir;

fn sample() -> Vec<(TensorDesc, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..10u64 {
        let rows = 1 + i * 37;
        let desc = TensorDesc::new(format!("layers.{i}.weight"), DType::F32, [rows, 1024]);
        let len = desc.byte_len().unwrap() as usize;
        out.push((
            desc,
            (0..len).map(|j| (j * 13 + i as usize) as u8).collect(),
        ));
        out.push((
            TensorDesc::new(format!("layers.{i}.bias"), DType::BF16, [7]),
            vec![i as u8; 14],
        ));
    }
    out
}

const MAX: u64 = 400 << 10;

/// The first `n` tensors of [`sample`] saved through `b` in shards of at most [`MAX`]
/// bytes, in a new directory; returns the directory and the whole sample.
fn saved(b: &dyn checkpoint::FileOpener, n: usize) -> (TempDir, Vec<(TensorDesc, Vec<u8>)>) {
    let dir = tempfile::tempdir().unwrap();
    let s = sample();
    checkpoint::save_sharded(b, dir.path(), &views(&s[..n.min(s.len())]), MAX).unwrap();
    (dir, s)
}

#[test]
fn plan_shards_follows_transformers() {
    assert_eq!(sharded::plan_shards(&[5, 5, 5], 10), vec![0..2, 2..3]);
    assert_eq!(sharded::plan_shards(&[20, 1, 1], 10), vec![0..1, 1..3]);
    assert_eq!(
        sharded::plan_shards(&[1, 20, 1], 10),
        vec![0..1, 1..2, 2..3]
    );
    assert_eq!(sharded::plan_shards(&[], 10), vec![0..0]);
}

#[test]
fn save_writes_the_hf_layout_and_safetensors_reads_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    let s = sample();
    let index =
        checkpoint::save_sharded(&DirectBackend::default(), dir.path(), &views(&s), MAX).unwrap();
    let names = index.shard_names();
    let n = names.len();
    assert!(n >= 3, "{n} shards");
    for (i, name) in names.iter().enumerate() {
        assert_eq!(*name, format!("model-{:05}-of-{n:05}.safetensors", i + 1));
    }
    // The index as transformers writes it.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(sharded::INDEX_NAME)).unwrap())
            .unwrap();
    let total: u64 = s.iter().map(|(_, b)| b.len() as u64).sum();
    assert_eq!(json["metadata"]["total_size"], total);
    assert_eq!(json["weight_map"].as_object().unwrap().len(), s.len());
    // Each shard, file by file, with the reference crate.
    let mut found = HashMap::new();
    for name in &names {
        let bytes = std::fs::read(dir.path().join(name)).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut data = 0;
        for (tname, t) in st.tensors() {
            assert_eq!(json["weight_map"][&tname], *name);
            data += t.data().len() as u64;
            found.insert(tname, t.data().to_vec());
        }
        assert!(data <= MAX || st.len() == 1, "{name}: {data} bytes");
    }
    for (d, b) in &s {
        assert_eq!(&found[&d.name], b, "{}", d.name);
    }
}

#[test]
fn load_sharded_selected_and_into_are_bit_exact() {
    let b = DirectBackend::default();
    let (dir, s) = saved(&b, usize::MAX);
    // By directory and by index.
    for path in [
        dir.path().to_path_buf(),
        dir.path().join(sharded::INDEX_NAME),
    ] {
        let ck = checkpoint::load_sharded(&b, &path).unwrap();
        assert_eq!(ck.len(), s.len());
        for (d, bytes) in &s {
            let (got_d, got) = ck.tensor(&d.name).unwrap();
            assert_eq!(got_d, d);
            assert_eq!(got, &bytes[..]);
        }
    }
    let pick = ["layers.9.weight", "layers.0.bias", "layers.4.weight"];
    let ck = checkpoint::load_selected_sharded(&b, dir.path(), pick).unwrap();
    assert_eq!(ck.len(), 3);
    assert_eq!(
        ck.data_bytes(),
        pick.iter()
            .map(|n| s.iter().find(|(d, _)| d.name == *n).unwrap().1.len() as u64)
            .sum::<u64>()
    );
    for n in pick {
        let want = &s.iter().find(|(d, _)| d.name == n).unwrap().1;
        assert_eq!(ck.tensor(n).unwrap().1, &want[..]);
    }
    let err = checkpoint::load_selected_sharded(&b, dir.path(), ["nope"]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);

    let mut bufs: Vec<Vec<u8>> = s.iter().map(|(_, b)| vec![0u8; b.len()]).collect();
    let targets = s
        .iter()
        .zip(bufs.iter_mut())
        .map(|((d, _), buf)| (d.name.as_str(), MemMut::Host(&mut buf[..])))
        .collect();
    checkpoint::load_into_sharded(&PosixBackend, dir.path(), targets).unwrap();
    for ((_, want), got) in s.iter().zip(&bufs) {
        assert_eq!(got, want);
    }
}

#[test]
fn shards_written_by_safetensors_in_the_hf_layout_load() {
    let dir = tempfile::tempdir().unwrap();
    let s = sample();
    let mut weight_map = BTreeMap::new();
    let halves = [&s[..7], &s[7..]];
    for (i, half) in halves.iter().enumerate() {
        let name = format!("model-{:05}-of-00002.safetensors", i + 1);
        let tensors: Vec<(String, StView<'_>)> = half
            .iter()
            .map(|(d, b)| {
                let shape: Vec<usize> = d.shape.iter().map(|&x| x as usize).collect();
                let dt: Dtype = serde_json::from_str(&format!("\"{}\"", d.dtype.name())).unwrap();
                (d.name.clone(), StView::new(dt, shape, b).unwrap())
            })
            .collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(tensors, Some(meta), &dir.path().join(&name)).unwrap();
        for (d, _) in half.iter() {
            weight_map.insert(d.name.clone(), name.clone());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 1}, "weight_map": weight_map});
    std::fs::write(
        dir.path().join("custom.safetensors.index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    let ck = checkpoint::load_sharded(&DirectBackend::default(), dir.path()).unwrap();
    assert_eq!(ck.metadata().get("format").map(String::as_str), Some("pt"));
    for (d, b) in &s {
        assert_eq!(ck.tensor(&d.name).unwrap().1, &b[..]);
    }
}

/// Opens files through a backend, failing the `fail`-th open for writing.
struct FailOn {
    inner: PosixBackend,
    fail: usize,
    opened: AtomicUsize,
}

impl checkpoint::FileOpener for FailOn {
    fn open_file(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        // Saves write an unnamed temporary file (opened through /proc/self/fd/N): the shard
        // is told by the order of the opens for writing.
        let writes = self
            .opened
            .fetch_add(usize::from(mode != OpenMode::Read), Relaxed);
        if mode != OpenMode::Read && writes + 1 == self.fail {
            return Err(Error::new(ErrorKind::Io, "injected failure").with_path(path));
        }
        self.inner.open_file(path, mode)
    }
}

#[test]
fn a_failed_save_leaves_no_index_naming_its_shards() {
    let b = PosixBackend;
    let (dir, s) = saved(&b, usize::MAX);
    let changed: Vec<(TensorDesc, Vec<u8>)> = s
        .iter()
        .map(|(d, b)| (d.clone(), b.iter().map(|x| x ^ 0xff).collect()))
        .collect();
    let failing = FailOn {
        inner: PosixBackend,
        fail: 2,
        opened: AtomicUsize::new(0),
    };
    let err = checkpoint::save_sharded(&failing, dir.path(), &views(&changed), MAX).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    // Shard 1 may already hold the new data: the old index must be gone.
    assert!(!dir.path().join(sharded::INDEX_NAME).exists());
    assert_eq!(
        checkpoint::load_sharded(&b, dir.path()).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    // No temporary file is left behind.
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with('.'), "{name} left behind");
    }
}

#[test]
fn a_smaller_save_removes_the_old_extra_shards() {
    let b = PosixBackend;
    let (dir, s) = saved(&b, usize::MAX);
    checkpoint::save_sharded(&b, dir.path(), &views(&s), u64::MAX).unwrap();
    let files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files.contains(&"model-00001-of-00001.safetensors".to_string()));
    assert_eq!(
        checkpoint::load_sharded(&b, dir.path()).unwrap().len(),
        s.len()
    );
}

#[test]
fn hostile_or_broken_indexes_are_refused() {
    let b = PosixBackend;
    let (dir, _) = saved(&b, 2);
    let index = dir.path().join(sharded::INDEX_NAME);
    let write =
        |v: serde_json::Value| std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();

    write(serde_json::json!({"weight_map": {"layers.0.weight": "../etc/passwd"}}));
    assert_eq!(
        checkpoint::open_sharded(&b, dir.path()).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    write(serde_json::json!({"weight_map": {"layers.0.weight": "missing.safetensors"}}));
    assert_eq!(
        checkpoint::open_sharded(&b, dir.path()).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    write(serde_json::json!({"weight_map": {"ghost": "model-00001-of-00001.safetensors"}}));
    assert_eq!(
        checkpoint::open_sharded(&b, dir.path()).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    std::fs::write(&index, b"{not json").unwrap();
    assert_eq!(
        checkpoint::open_sharded(&b, dir.path()).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    std::fs::remove_file(&index).unwrap();
    assert_eq!(
        checkpoint::open_sharded(&b, dir.path()).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn read_ranges_reads_across_files_in_one_job() {
    let dir = tempfile::tempdir().unwrap();
    let a: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
    let c: Vec<u8> = (0..1 << 20).map(|i| (i % 241) as u8).collect();
    let (pa, pc) = (dir.path().join("a"), dir.path().join("c"));
    std::fs::write(&pa, &a).unwrap();
    std::fs::write(&pc, &c).unwrap();
    let spans: Vec<(&Path, usize, usize)> = vec![
        (&pa, 0, 100),
        (&pa, 5000, 1_000_000),
        (&pc, 17, 4096),
        (&pa, 3_000_000, 145_728),
        (&pc, 1000, 1),
    ];
    let mut bufs: Vec<Vec<u8>> = spans.iter().map(|s| vec![0u8; s.2]).collect();
    let reqs = spans
        .iter()
        .zip(bufs.iter_mut())
        .map(|(s, b)| (s.0, s.1 as u64, MemMut::Host(&mut b[..])))
        .collect();
    checkpoint::read_ranges(&DirectBackend::default(), reqs).unwrap();
    for (s, got) in spans.iter().zip(&bufs) {
        let src = if s.0 == pa.as_path() { &a } else { &c };
        assert_eq!(&got[..], &src[s.1..s.1 + s.2]);
    }
    let mut past = [0u8; 10];
    let err = checkpoint::read_ranges(
        &PosixBackend,
        vec![(pc.as_path(), (1 << 20) - 5, MemMut::Host(&mut past[..]))],
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
}
