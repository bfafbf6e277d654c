//! Per-tensor checksums: stamped at save, checked on verified reads and by `verify_file`;
//! a flipped byte in any tensor, a truncated shard and swapped tensors are each caught and
//! named.

mod common;

use common::{buffers, targets, views};
use fastensor::checkpoint::{self, checksum, TensorView, CHECKSUMS_KEY};
use fastensor::posix::PosixBackend;
use fastensor::{DType, ErrorKind, TensorDesc};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// Tensors `t0`, `t1`, ... of distinct bytes (the last a 3 MiB one), and an empty one.
fn sample() -> Vec<(TensorDesc, Vec<u8>)> {
    let mut out: Vec<(TensorDesc, Vec<u8>)> = (0..6u8)
        .map(|i| {
            let n = 64 + 32 * i as u64;
            let bytes = (0..n * 4).map(|j| (j as u8).wrapping_mul(7) ^ i).collect();
            (TensorDesc::new(format!("t{i}"), DType::F32, [n]), bytes)
        })
        .collect();
    let big: Vec<u8> = (0..3u32 << 20).map(|j| (j % 253) as u8).collect();
    out.push((TensorDesc::new("big", DType::U8, [3 << 20]), big));
    out.push((TensorDesc::new("empty", DType::F16, [0, 3]), Vec::new()));
    out
}

fn save_stamped(path: &Path, s: &[(TensorDesc, Vec<u8>)]) {
    let views = views(s);
    let mut meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    checksum::stamp(&views, &mut meta).unwrap();
    checkpoint::save_with_metadata(&PosixBackend, path, &views, &meta).unwrap();
}

/// [`sample`] saved stamped as `c.safetensors` in a new directory.
fn stamped_sample() -> (TempDir, PathBuf, Vec<(TensorDesc, Vec<u8>)>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let s = sample();
    save_stamped(&path, &s);
    (dir, path, s)
}

/// Reads every tensor of `path` through a verifying open file.
fn read_verified(path: &Path, s: &[(TensorDesc, Vec<u8>)]) -> fastensor::Result<()> {
    let file = checkpoint::open(&PosixBackend, path)?.verifying()?;
    let mut bufs = buffers(s, 0);
    file.read_into(targets(s, &mut bufs))
}

/// Reads every tensor of the sharded checkpoint at `dir` through a verifying open file.
fn read_sharded_verified(dir: &Path, s: &[(TensorDesc, Vec<u8>)]) -> fastensor::Result<()> {
    let file = checkpoint::open_sharded(&PosixBackend, dir)?.verifying()?;
    let mut bufs = buffers(s, 0);
    file.read_into(targets(s, &mut bufs))
}

fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_flipped_byte_in_any_tensor_is_caught_and_named() {
    let (_dir, path, s) = stamped_sample();
    let ok = checkpoint::verify_file(&PosixBackend, &path).unwrap();
    assert_eq!(ok.tensors, s.len());
    read_verified(&path, &s).unwrap();
    let header = checkpoint::inspect(&path).unwrap();
    assert!(header.metadata().contains_key(CHECKSUMS_KEY));
    for (d, b) in s.iter().filter(|(_, b)| !b.is_empty()) {
        save_stamped(&path, &s);
        let range = header.file_range(header.get(&d.name).unwrap());
        flip_byte(&path, range.start + b.len() as u64 / 2);
        for e in [
            checkpoint::verify_file(&PosixBackend, &path).unwrap_err(),
            read_verified(&path, &s).unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
            let msg = e.to_string();
            assert!(msg.contains(&format!("`{}`", d.name)), "{msg}");
            assert!(msg.contains("c.safetensors"), "{msg}");
        }
    }
}

#[test]
fn swapped_tensors_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.safetensors");
    // Two tensors of one size: their bytes swapped in the file, the header unchanged.
    let s: Vec<(TensorDesc, Vec<u8>)> = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                TensorDesc::new(*n, DType::U8, [100]),
                vec![i as u8 + 1; 100],
            )
        })
        .collect();
    save_stamped(&path, &s);
    let header = checkpoint::inspect(&path).unwrap();
    let (ra, rb) = (
        header.file_range(header.get("a").unwrap()),
        header.file_range(header.get("b").unwrap()),
    );
    let mut bytes = std::fs::read(&path).unwrap();
    let a = bytes[ra.start as usize..ra.end as usize].to_vec();
    let b = bytes[rb.start as usize..rb.end as usize].to_vec();
    bytes[ra.start as usize..ra.end as usize].copy_from_slice(&b);
    bytes[rb.start as usize..rb.end as usize].copy_from_slice(&a);
    std::fs::write(&path, bytes).unwrap();
    let e = checkpoint::verify_file(&PosixBackend, &path).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains("checksum mismatch"), "{e}");
    assert_eq!(
        read_verified(&path, &s).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
}

#[test]
fn sharded_checkpoints_keep_each_shards_checksums_and_a_truncated_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let s = sample();
    let views = views(&s);
    let mut meta = BTreeMap::new();
    checksum::stamp(&views, &mut meta).unwrap();
    let b = PosixBackend;
    checkpoint::save_sharded_with_metadata(&b, &ckpt, &views, 1 << 20, &meta).unwrap();
    let file = checkpoint::open_sharded(&b, &ckpt).unwrap();
    let shards: Vec<_> = file.shard_paths().iter().map(|p| p.to_path_buf()).collect();
    assert!(shards.len() >= 2);
    for shard in &shards {
        checkpoint::verify_file(&b, shard).unwrap();
    }
    // Verified reads across shards, then a flipped byte in the big tensor's shard.
    let read_all = || read_sharded_verified(&ckpt, &s);
    read_all().unwrap();
    let big_name = &file.index().weight_map["big"];
    let big_shard = shards
        .iter()
        .find(|p| p.file_name().unwrap() == big_name.as_str())
        .unwrap();
    let header = checkpoint::inspect(big_shard).unwrap();
    let r = header.file_range(header.get("big").unwrap());
    flip_byte(big_shard, r.start + 12345);
    let e = read_all().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains("`big`"), "{e}");
    // A truncated shard: refused when opened, naming the shard and a tensor.
    let len = std::fs::metadata(big_shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(big_shard)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    for e in [
        checkpoint::verify_file(&b, big_shard).unwrap_err(),
        read_all().unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        let msg = e.to_string();
        assert!(msg.contains("`big`") && msg.contains("truncated"), "{msg}");
    }
}

#[test]
fn a_verified_sharded_read_checks_a_tensor_read_in_windows() {
    let dir = tempfile::tempdir().unwrap();
    // 9 MiB: read in 8 MiB windows, checked whole after the reads.
    let huge: Vec<u8> = (0..9u32 << 20).map(|j| (j % 251) as u8).collect();
    let s = vec![(TensorDesc::new("huge", DType::U8, [9 << 20]), huge)];
    let mut meta = BTreeMap::new();
    checksum::stamp(&views(&s), &mut meta).unwrap();
    checkpoint::save_sharded_with_metadata(&PosixBackend, dir.path(), &views(&s), 1, &meta)
        .unwrap();
    read_sharded_verified(dir.path(), &s).unwrap();
    let shard = dir.path().join(checkpoint::sharded::shard_name(0, 1));
    let header = checkpoint::inspect(&shard).unwrap();
    let r = header.file_range(header.get("huge").unwrap());
    flip_byte(&shard, r.start + (8 << 20) + 3);
    let e = read_sharded_verified(dir.path(), &s).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("`huge`"), "{e}");
}

#[test]
fn a_file_saved_without_checksums_cannot_be_verified() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.safetensors");
    let d = TensorDesc::new("w", DType::U8, [4]);
    checkpoint::save(&PosixBackend, &path, &[TensorView::new(d, &[1u8; 4][..])]).unwrap();
    let e = checkpoint::verify_file(&PosixBackend, &path).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("without checksums"), "{e}");
}

/// Loads into new memory verified, mapped (an engine's default) or read (a plain backend).
fn load_verified_both(path: &Path) -> Vec<fastensor::Result<checkpoint::Checkpoint>> {
    let engine = fastensor::Engine::new().unwrap();
    vec![
        checkpoint::load_verified(&engine, path, None),
        checkpoint::load_verified(&PosixBackend, path, None),
        checkpoint::load_verified(&engine, path, Some(&["big", "t2"])),
    ]
}

#[test]
fn verified_loads_into_new_memory_catch_a_flipped_byte_mapped_or_read() {
    let (dir, path, s) = stamped_sample();
    for (i, loaded) in load_verified_both(&path).into_iter().enumerate() {
        let ckpt = loaded.unwrap_or_else(|e| panic!("load {i}: {e}"));
        assert_eq!(ckpt.tensor("big").unwrap().1, &s[6].1[..]);
    }
    assert!(checkpoint::load(&fastensor::Engine::new().unwrap(), &path)
        .unwrap()
        .arena()
        .is_mapped());
    let header = checkpoint::inspect(&path).unwrap();
    for name in ["t2", "big"] {
        let e = &header.entries()[header.position(name).unwrap()];
        let at = header.file_range(e).start + e.byte_len() / 2;
        flip_byte(&path, at);
        for (i, loaded) in load_verified_both(&path).into_iter().enumerate() {
            let err = loaded
                .err()
                .unwrap_or_else(|| panic!("load {i} missed `{name}`"));
            assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
            assert!(err.to_string().contains(&format!("`{name}`")), "{err}");
            assert!(err.to_string().contains("c.safetensors"), "{err}");
        }
        flip_byte(&path, at);
    }
    let plain = dir.path().join("plain.safetensors");
    let views = views(&s);
    checkpoint::save(&PosixBackend, &plain, &views).unwrap();
    for loaded in load_verified_both(&plain) {
        assert_eq!(loaded.unwrap_err().kind(), ErrorKind::InvalidInput);
    }
}

#[test]
fn a_verified_mapped_load_checks_tensors_that_span_windows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    // 40 MiB and 9 MiB tensors: each spans several 16 MiB windows, hashed in pieces by
    // different threads and joined in order.
    let s: Vec<(TensorDesc, Vec<u8>)> = [(40usize << 20, 3u8), (9 << 20, 5)]
        .iter()
        .enumerate()
        .map(|(i, &(n, k))| {
            let bytes = (0..n)
                .map(|j| (j as u8).wrapping_mul(k) ^ (j >> 12) as u8)
                .collect();
            (
                TensorDesc::new(format!("w{i}"), DType::U8, [n as u64]),
                bytes,
            )
        })
        .collect();
    save_stamped(&path, &s);
    let engine = fastensor::Engine::new().unwrap();
    let ckpt = checkpoint::load_verified(&engine, &path, None).unwrap();
    assert!(ckpt.arena().is_mapped());
    let header = checkpoint::inspect(&path).unwrap();
    let e = &header.entries()[header.position("w0").unwrap()];
    let at = header.file_range(e).start + (33 << 20) + 5;
    flip_byte(&path, at);
    let err = checkpoint::load_verified(&engine, &path, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(err.to_string().contains("`w0`"), "{err}");
}

#[test]
fn a_save_computing_checksums_while_it_writes_stores_what_stamp_computes() {
    let dir = tempfile::tempdir().unwrap();
    let (stamped, checked) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    let s = sample();
    save_stamped(&stamped, &s);
    let views = views(&s);
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let engine = fastensor::Engine::new().unwrap();
    checkpoint::save_checked(&engine, &checked, &views, &meta).unwrap();
    let a = checkpoint::inspect(&stamped).unwrap();
    let b = checkpoint::inspect(&checked).unwrap();
    assert_eq!(a.metadata(), b.metadata());
    assert_eq!(
        std::fs::read(&stamped).unwrap(),
        std::fs::read(&checked).unwrap()
    );
    checkpoint::verify_file(&engine, &checked).unwrap();
    let loaded = checkpoint::load_verified(&engine, &checked, None).unwrap();
    assert_eq!(loaded.tensor("big").unwrap().1, &s[6].1[..]);
}

/// Files of three tensors with empty ones put at every position: before, between and after
/// them, alone or two in a row, and a file of empty tensors only. An empty tensor's range
/// starts where the next tensor's does.
fn layouts_with_empty_tensors() -> Vec<Vec<(TensorDesc, Vec<u8>)>> {
    let full = |i: u8| {
        let n = 3 + u64::from(i);
        let bytes = (0..n * 4).map(|j| (j as u8).wrapping_mul(13) ^ i).collect();
        (TensorDesc::new(format!("f{i}"), DType::F32, [n]), bytes)
    };
    let empty = |i: usize| {
        (
            TensorDesc::new(format!("e{i}"), DType::F32, [0]),
            Vec::new(),
        )
    };
    let mut out = Vec::new();
    for at in 0..=3 {
        for run in 1..=2 {
            let mut s: Vec<_> = (0..3).map(full).collect();
            for k in 0..run {
                s.insert(at, empty(k));
            }
            out.push(s);
        }
    }
    out.push(vec![empty(0), empty(1)]);
    out
}

#[test]
fn verified_reads_accept_empty_tensors_at_every_position() {
    let dir = tempfile::tempdir().unwrap();
    let engine = fastensor::Engine::new().unwrap();
    for (i, s) in layouts_with_empty_tensors().iter().enumerate() {
        let names: Vec<&str> = s.iter().map(|(d, _)| d.name.as_str()).collect();
        let path = dir.path().join(format!("e{i}.safetensors"));
        let checked = dir.path().join(format!("c{i}.safetensors"));
        save_stamped(&path, s);
        checkpoint::save_checked(&engine, &checked, &views(s), &BTreeMap::new()).unwrap();
        for path in [&path, &checked] {
            let what = format!("{names:?} in {}", path.display());
            let mut loads = vec![
                checkpoint::load_verified(&engine, path, None),
                checkpoint::load_verified(&PosixBackend, path, None),
            ];
            for name in &names {
                loads.push(checkpoint::load_verified(&engine, path, Some(&[name])));
            }
            for loaded in loads {
                let ckpt = loaded.unwrap_or_else(|e| panic!("{what}: {e}"));
                for (d, bytes) in s {
                    if let Some((_, got)) = ckpt.tensor(&d.name) {
                        assert_eq!(got, &bytes[..], "{what}: `{}`", d.name);
                    }
                }
            }
            assert!(checkpoint::load_verified(&engine, path, None)
                .unwrap()
                .arena()
                .is_mapped());
            read_verified(path, s).unwrap_or_else(|e| panic!("{what}: {e}"));
            let done = checkpoint::verify_file(&PosixBackend, path).unwrap();
            assert_eq!(done.tensors, s.len(), "{what}");
        }
        let sharded = dir.path().join(format!("s{i}"));
        let mut meta = BTreeMap::new();
        checksum::stamp(&views(s), &mut meta).unwrap();
        checkpoint::save_sharded_with_metadata(&PosixBackend, &sharded, &views(s), 20, &meta)
            .unwrap();
        read_sharded_verified(&sharded, s).unwrap_or_else(|e| panic!("{names:?} sharded: {e}"));
    }
}

#[test]
fn a_verified_mapped_load_still_names_a_damaged_tensor_after_an_empty_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.safetensors");
    let s = &layouts_with_empty_tensors()[2]; // f0, e0, f1, f2
    save_stamped(&path, s);
    let header = checkpoint::inspect(&path).unwrap();
    let e = &header.entries()[header.position("f1").unwrap()];
    flip_byte(&path, header.file_range(e).start);
    let engine = fastensor::Engine::new().unwrap();
    for loaded in [
        checkpoint::load_verified(&engine, &path, None),
        checkpoint::load_verified(&PosixBackend, &path, None),
    ] {
        let err = loaded.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
        assert!(err.to_string().contains("`f1`"), "{err}");
    }
}
