//! What a hostile reading of the object path found: sharded re-saves that could load as a
//! mix of two checkpoints, keys changed on their way to the server, multipart uploads that
//! raced their own abort or found the part limit late, and calls from inside a tokio
//! runtime.

use super::{url, Server};
use fastensor::checkpoint::{self, ShardedCheckpoint, TensorView};
use fastensor::core::{BackendFile, DType, ErrorKind, FileOpener, OpenMode, TensorDesc};
use fastensor::object::ObjectStores;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Shards of the checkpoints below: one tensor each.
const SHARDS: usize = 8;

/// A checkpoint of [`SHARDS`] tensors of 4000 bytes (one shard each at a 4000-byte limit),
/// every byte of save `seed` telling that save apart.
fn checkpoint_of(seed: u8) -> Vec<(TensorDesc, Vec<u8>)> {
    (0..SHARDS)
        .map(|i| {
            let desc = TensorDesc::new(format!("layer{i}"), DType::U8, [4000u64]);
            (desc, vec![seed.wrapping_add(i as u8); 4000])
        })
        .collect()
}

fn views(t: &[(TensorDesc, Vec<u8>)]) -> Vec<TensorView<'_>> {
    t.iter()
        .map(|(d, b)| TensorView::new(d.clone(), &b[..]))
        .collect()
}

/// Which save `ckpt` is, every tensor of it from that one save; panics on a mix.
fn which_save(ckpt: &ShardedCheckpoint, seeds: &[u8]) -> u8 {
    let mut found = None;
    for i in 0..SHARDS {
        let (_, bytes) = ckpt
            .tensor(&format!("layer{i}"))
            .expect("every tensor loads");
        let seed = bytes[0].wrapping_sub(i as u8);
        assert!(seeds.contains(&seed), "layer{i} is of no save");
        assert!(bytes.iter().all(|&b| b == bytes[0]), "layer{i} is torn");
        match found {
            None => found = Some(seed),
            Some(s) => assert_eq!(s, seed, "layer{i} is of another save: a mix"),
        }
    }
    found.expect("tensors")
}

/// The stores, as a saving process that dies (or fails) once `survive` shards were written:
/// later shards and the index are refused, and nothing is deleted.
struct DiesAfter<'a> {
    stores: &'a ObjectStores,
    survive: usize,
    opened: AtomicUsize,
}

impl FileOpener for DiesAfter<'_> {
    fn open_file(&self, path: &Path, mode: OpenMode) -> fastensor::Result<Box<dyn BackendFile>> {
        if mode == OpenMode::Truncate && self.opened.fetch_add(1, Ordering::SeqCst) >= self.survive
        {
            return Err(
                fastensor::Error::new(ErrorKind::Io, "the saving process died").with_path(path),
            );
        }
        self.stores.open_file(path, mode)
    }

    fn place(&self, path: &Path) -> fastensor::core::Place {
        self.stores.place(path)
    }

    fn list_names(&self, dir: &Path) -> fastensor::Result<Vec<String>> {
        self.stores.list_names(dir)
    }
}

#[test]
fn a_sharded_resave_that_dies_after_k_shards_loads_the_previous_checkpoint() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(1);
    let (a, b) = (checkpoint_of(10), checkpoint_of(100));
    let prefix = url("run/");
    checkpoint::save_sharded(&stores, &prefix, &views(&a), 4000).unwrap();
    for k in [0, 2, 5, SHARDS - 1, SHARDS] {
        let dying = DiesAfter {
            stores: &stores,
            survive: k,
            opened: AtomicUsize::new(0),
        };
        let e = checkpoint::save_sharded(&dying, &prefix, &views(&b), 4000).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        let ckpt = checkpoint::load_sharded(&stores, &prefix)
            .unwrap_or_else(|e| panic!("after {k} of {SHARDS} shards: {e}"));
        assert_eq!(which_save(&ckpt, &[10, 100]), 10, "after {k} shards");
    }
    // A save that completes is the one that loads.
    checkpoint::save_sharded(&stores, &prefix, &views(&b), 4000).unwrap();
    assert_eq!(
        which_save(
            &checkpoint::load_sharded(&stores, &prefix).unwrap(),
            &[10, 100]
        ),
        100
    );
    // A shard refused by the server: the save fails, the previous checkpoint loads.
    server.faults(
        "POST",
        r#"{"kind":"internal_error","method":"PUT","path_contains":"-00003-of-","times":1000}"#,
    );
    assert!(checkpoint::save_sharded(&stores, &prefix, &views(&a), 4000).is_err());
    server.faults("DELETE", "");
    assert_eq!(
        which_save(
            &checkpoint::load_sharded(&stores, &prefix).unwrap(),
            &[10, 100]
        ),
        100
    );
}

#[test]
fn a_reader_racing_sharded_resaves_loads_one_checkpoint_or_a_typed_error() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(1);
    let saves = [checkpoint_of(10), checkpoint_of(100)];
    let prefix = url("race/");
    checkpoint::save_sharded(&stores, &prefix, &views(&saves[0]), 4000).unwrap();
    let done = AtomicBool::new(false);
    let (mut loads, mut errors) = (0, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 1..=12 {
                checkpoint::save_sharded(&stores, &prefix, &views(&saves[i % 2]), 4000).unwrap();
            }
            done.store(true, Ordering::SeqCst);
        });
        while !done.load(Ordering::SeqCst) {
            match checkpoint::load_sharded(&stores, &prefix) {
                Ok(ckpt) => {
                    which_save(&ckpt, &[10, 100]);
                    loads += 1;
                }
                // A typed error naming what failed (a shard deleted under a reader that kept
                // finding the checkpoint replaced; the test server's listing, which fails
                // while files of its directory are deleted) is allowed; a mix never.
                Err(e) => {
                    assert!(
                        e.path().is_some_and(|p| p.starts_with("s3://ckpt/race")),
                        "{e}"
                    );
                    errors += 1;
                }
            }
        }
    });
    assert!(loads > 0, "no load completed ({errors} typed errors)");
}

#[test]
fn shards_of_an_earlier_save_with_another_shard_count_are_removed() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(1);
    let prefix = url("count/");
    let a = checkpoint_of(10);
    checkpoint::save_sharded(&stores, &prefix, &views(&a), 4000).unwrap();
    let index = checkpoint::save_sharded(&stores, &prefix, &views(&a), 12_000).unwrap();
    let mut named: Vec<String> = index.shard_names().iter().map(|s| s.to_string()).collect();
    assert_eq!(named.len(), 3);
    named.push("model.safetensors.index.json".into());
    named.sort();
    assert_eq!(stores.list(&prefix).unwrap(), named);
    assert_eq!(
        which_save(&checkpoint::load_sharded(&stores, &prefix).unwrap(), &[10]),
        10
    );
}

#[test]
fn object_keys_are_kept_as_written() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(1);
    let t = &checkpoint_of(7)[..2];
    for key in [
        "exp#3/m.safetensors",
        "run[lr=1e-4]/m.safetensors",
        "with space/100%/m.safetensors",
        "a%2Fb/m.safetensors",
    ] {
        checkpoint::save(&stores, &url(key), &views(t)).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(
            server.file(key).is_file(),
            "{key} is stored under its own name"
        );
        let got = checkpoint::load(&stores, &url(key)).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(got.tensor("layer1").unwrap().1, &t[1].1[..], "{key}");
        let dir = key.rsplit_once('/').unwrap().0;
        assert_eq!(stores.list(&url(dir)).unwrap(), ["m.safetensors"], "{key}");
    }
    // An object stored by another client under such a key is found.
    let other = server.file("x#1[2] %/m.safetensors");
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    std::fs::copy(server.file("exp#3/m.safetensors"), &other).unwrap();
    checkpoint::load(&stores, &url("x#1[2] %/m.safetensors")).unwrap();
    // Empty segments are kept: `a//m` and `a/m` are two objects.
    let other = checkpoint_of(8);
    checkpoint::save(&stores, &url("a/m.safetensors"), &views(t)).unwrap();
    checkpoint::save(&stores, &url("a//m.safetensors"), &views(&other[..2])).unwrap();
    let got = checkpoint::load(&stores, &url("a//m.safetensors")).unwrap();
    assert_eq!(got.tensor("layer1").unwrap().1, &other[1].1[..]);
    let got = checkpoint::load(&stores, &url("a/m.safetensors")).unwrap();
    assert_eq!(got.tensor("layer1").unwrap().1, &t[1].1[..]);
    // A listing that holds an empty segment is refused, naming the prefix (the store's
    // client cannot list such keys); the objects stay reachable by their URLs.
    for dir in ["a", "a//"] {
        let e = stores.list(&url(dir)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{dir}: {e}");
        assert!(e.to_string().contains("empty segment"), "{dir}: {e}");
    }
    // A sharded checkpoint under such a prefix is loaded by its index's URL, its shards
    // from that prefix, not from the one without the empty segment.
    let a = checkpoint_of(11);
    let b = checkpoint_of(12);
    checkpoint::save_sharded(&stores, &url("x/"), &views(&a), 4000).unwrap();
    let index = checkpoint::save_sharded(&stores, &url("x//"), &views(&b), 4000).unwrap();
    assert!(index.shard_names().len() > 1);
    let got = checkpoint::load_sharded(&stores, &url("x//model.safetensors.index.json")).unwrap();
    assert_eq!(which_save(&got, &[11, 12]), 12);
    stores.delete(&url("a//m.safetensors")).unwrap();
    assert_eq!(stores.list(&url("a")).unwrap(), ["m.safetensors"]);
    // Keys the store cannot name as they are are refused, never changed.
    for key in ["/m.safetensors", "a/./m.safetensors", "a/../m.safetensors"] {
        let e = checkpoint::save(&stores, &url(key), &views(t)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{key}: {e}");
        assert!(e.to_string().contains(key), "{key}: {e}");
        let e = checkpoint::load(&stores, &url(key)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{key}: {e}");
    }
    let got = checkpoint::load(&stores, &url("a/m.safetensors")).unwrap();
    assert_eq!(got.tensor("layer1").unwrap().1, &t[1].1[..]);
}

#[test]
fn a_failed_part_is_reported_after_the_parts_in_flight_finish() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(0);
    // 4 parts of 5 MiB: part 2 fails at once, part 3 is slow.
    let file = stores
        .open_file(&url("parts.safetensors"), OpenMode::Truncate)
        .unwrap();
    server.faults(
        "POST",
        r#"{"kind":"internal_error","method":"PUT","path_contains":"partNumber=2&","times":1000}"#,
    );
    server.faults(
        "POST",
        r#"{"kind":"delay","method":"PUT","path_contains":"partNumber=3&","times":1,"delay_ms":2000}"#,
    );
    let started = Instant::now();
    file.write_at(0, (&vec![3u8; 20 << 20][..]).into()).unwrap();
    let e = file.sync().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(
        started.elapsed() >= Duration::from_millis(2000),
        "the failure returned while part 3 was still in flight ({:?})",
        started.elapsed()
    );
    server.faults("DELETE", "");
    assert!(!server.file("parts.safetensors").exists());
    assert!(
        server.uploads_left().is_empty(),
        "{:?}",
        server.uploads_left()
    );
}

#[test]
fn the_part_size_fits_a_known_size_in_10000_parts_or_is_refused_at_once() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(0);
    // 200 GiB, known before any byte: parts large enough that the last byte is in part
    // 10 000 or before (nothing is sent: the writer is dropped unsynced).
    let file = stores
        .open_file(&url("huge.safetensors"), OpenMode::Truncate)
        .unwrap();
    file.set_len(200 << 30).unwrap();
    file.write_at((200 << 30) - 1, (&[1u8][..]).into())
        .unwrap_or_else(|e| panic!("the last byte of 200 GiB: {e}"));
    drop(file);
    // Parts already out at 5 MiB: growing past 10 000 of them is refused when said.
    let file = stores
        .open_file(&url("grown.safetensors"), OpenMode::Truncate)
        .unwrap();
    file.write_at(0, (&vec![1u8; 5 << 20][..]).into()).unwrap();
    let e = file.set_len(10_001 * (5 << 20)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("s3://ckpt/grown.safetensors"), "{e}");
    drop(file);
    assert!(
        server.uploads_left().is_empty(),
        "{:?}",
        server.uploads_left()
    );
}

#[test]
fn calls_from_inside_a_tokio_runtime_work() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(1);
    let t = checkpoint_of(5);
    for threads in [false, true] {
        let runtime = if threads {
            tokio::runtime::Builder::new_multi_thread().build().unwrap()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
        };
        runtime.block_on(async {
            let key = url(&format!("tokio-{threads}.safetensors"));
            checkpoint::save(&stores, &key, &views(&t)).unwrap();
            let got = checkpoint::load(&stores, &key).unwrap();
            assert_eq!(got.tensor("layer3").unwrap().1, &t[3].1[..]);
            // A writer dropped unsynced inside the runtime aborts its upload.
            let file = stores
                .open_file(&url("tokio-dropped"), OpenMode::Truncate)
                .unwrap();
            file.write_at(0, (&vec![1u8; 6 << 20][..]).into()).unwrap();
            drop(file);
            // Stores made, used and dropped inside the runtime (their I/O threads too).
            let inner = server.stores(1);
            assert_eq!(checkpoint::load(&inner, &key).unwrap().len(), t.len());
            drop(inner);
        });
    }
    assert!(
        server.uploads_left().is_empty(),
        "{:?}",
        server.uploads_left()
    );
}

#[test]
fn a_profile_of_a_kind_not_supported_is_refused_naming_it() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    std::fs::write(
        &config,
        "[profile work]\ncredential_process = /bin/false\nregion = us-east-1\n",
    )
    .unwrap();
    let endpoint = server.url.clone();
    let config_file = config.display().to_string();
    let vars: Vec<(&str, String)> = vec![
        ("AWS_PROFILE", "work".into()),
        ("AWS_CONFIG_FILE", config_file),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent".into()),
        ("AWS_ENDPOINT_URL", endpoint),
        ("HOME", "/nonexistent".into()),
    ];
    let stores = ObjectStores::new(
        fastensor::object::ObjectConfig {
            retries: 0,
            ..Default::default()
        },
        std::sync::Arc::new(move |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        }),
    );
    let started = Instant::now();
    let e = checkpoint::load(&stores, &url("any.safetensors")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("`work`"), "{e}");
    assert!(e.to_string().contains("credential_process"), "{e}");
    assert!(e.to_string().contains("s3://ckpt/any.safetensors"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once"
    );
}
