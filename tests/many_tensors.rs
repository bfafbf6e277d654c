//! Checkpoints of very many tiny tensors: header parsing, validation, read planning and the
//! reads themselves stay linear (or n log n) in the number of tensors, for one file and for a
//! sharded checkpoint.

use fastensor::checkpoint::{self, sharded::INDEX_NAME};
use fastensor::posix::PosixBackend;
use fastensor::{Engine, MemMut};
use std::path::Path;
use std::time::Instant;

/// The byte tensor `i` holds.
fn value(i: usize) -> u8 {
    (i as u8).wrapping_mul(31) ^ ((i >> 8) as u8)
}

fn name(i: usize) -> String {
    format!("layer.{i}.w")
}

/// Writes a safetensors file of the one-byte `U8` tensors `range` (as another tool would:
/// the data section unaligned), in file order.
fn write_tiny(path: &Path, range: std::ops::Range<usize>) {
    let mut json = String::from("{");
    for (k, i) in range.clone().enumerate() {
        if k > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            r#""{}":{{"dtype":"U8","shape":[1],"data_offsets":[{k},{}]}}"#,
            name(i),
            k + 1
        ));
    }
    json.push('}');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.extend(range.map(value));
    std::fs::write(path, out).unwrap();
}

fn engine() -> Engine {
    Engine::builder()
        .backends(["posix"])
        .probe_page_cache(false)
        .build()
        .unwrap()
}

/// Loads all of `n` tiny tensors of one file into caller buffers (a shuffled order of
/// targets), then into an arena, checking every byte; returns the seconds each took.
fn load_one_file(n: usize) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.safetensors");
    write_tiny(&path, 0..n);
    let names: Vec<String> = (0..n).map(name).collect();
    let mut out = vec![0u8; n];
    // Targets in an order unlike the file's: every third name from the end first.
    let mut order: Vec<usize> = (0..n).rev().collect();
    order.sort_by_key(|i| i % 3);
    let start = Instant::now();
    {
        let mut slots: Vec<Option<&mut u8>> = out.iter_mut().map(Some).collect();
        let targets: Vec<(&str, MemMut<'_>)> = order
            .iter()
            .map(|&i| {
                let b = slots[i].take().unwrap();
                (names[i].as_str(), MemMut::from(std::slice::from_mut(b)))
            })
            .collect();
        let header = checkpoint::load_into(&engine(), &path, targets).unwrap();
        assert_eq!(header.entries().len(), n);
    }
    let into = start.elapsed().as_secs_f64();
    for (i, b) in out.iter().enumerate() {
        assert_eq!(*b, value(i), "tensor {i}");
    }
    let start = Instant::now();
    let ckpt = checkpoint::load(&PosixBackend, &path).unwrap();
    let whole = start.elapsed().as_secs_f64();
    assert_eq!(ckpt.len(), n);
    for (i, (d, b)) in ckpt.iter().enumerate() {
        assert_eq!((d.name.as_str(), b), (names[i].as_str(), &[value(i)][..]));
    }
    (into, whole)
}

/// Loads all of `n` tiny tensors of a checkpoint of two shards, into caller buffers and into
/// an arena, checking every byte; returns the seconds each took.
fn load_sharded(n: usize) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let half = n / 2;
    let shards = [(0..half, "a.safetensors"), (half..n, "b.safetensors")];
    let mut map = serde_json::Map::new();
    for (range, file) in &shards {
        write_tiny(&dir.path().join(file), range.clone());
        for i in range.clone() {
            map.insert(name(i), (*file).into());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(dir.path().join(INDEX_NAME), index.to_string()).unwrap();
    let names: Vec<String> = (0..n).map(name).collect();
    let mut out = vec![0u8; n];
    let start = Instant::now();
    {
        let targets: Vec<(&str, MemMut<'_>)> = names
            .iter()
            .zip(out.chunks_mut(1))
            .rev()
            .map(|(n, b)| (n.as_str(), MemMut::from(b)))
            .collect();
        checkpoint::load_into_sharded(&engine(), dir.path(), targets).unwrap();
    }
    let into = start.elapsed().as_secs_f64();
    for (i, b) in out.iter().enumerate() {
        assert_eq!(*b, value(i), "tensor {i}");
    }
    let start = Instant::now();
    let ckpt = checkpoint::load_sharded(&PosixBackend, dir.path()).unwrap();
    let whole = start.elapsed().as_secs_f64();
    assert_eq!(ckpt.len(), n);
    for i in (0..n).step_by(997) {
        assert_eq!(ckpt.tensor(&names[i]).unwrap().1, &[value(i)][..]);
    }
    (into, whole)
}

#[test]
fn two_hundred_thousand_one_byte_tensors_load_into_buffers() {
    load_one_file(200_000);
}

#[test]
fn two_hundred_thousand_one_byte_tensors_load_from_two_shards() {
    load_sharded(200_000);
}

/// The load times of growing counts of tiny tensors (run in a release build:
/// `cargo test --release --test many_tensors -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement: prints load times"]
fn load_times_of_many_tiny_tensors() {
    for n in [25_000, 100_000, 200_000, 400_000, 600_000] {
        let (into, whole) = load_one_file(n);
        let (s_into, s_whole) = load_sharded(n);
        println!(
            "{n} tensors: load_into {into:.3} s, load {whole:.3} s; \
             sharded load_into {s_into:.3} s, load {s_whole:.3} s"
        );
    }
}
