//! Checkpoints in object storage, against a real S3 server on the loopback interface
//! (`fastensor-s3-server`, s3s-fs over a temporary directory, with fault injection): loads
//! and saves bit-exact against the local file path, and every fault a typed error or a
//! successful retry, never a partial tensor or a visible partial object.
//!
//! The server binary is `FASTENSOR_S3_SERVER` (scripts/test builds it); without it these
//! tests print that they were skipped, unless `FASTENSOR_REQUIRE_S3` is set.

use fastensor::checkpoint::{self, DimSelection, TensorView};
use fastensor::core::{DType, ErrorKind, FileOpener, MemMut, OpenMode, TensorDesc};
use fastensor::object::{ObjectConfig, ObjectStores};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

const BUCKET: &str = "ckpt";

/// A server on a temporary directory, stopped when dropped.
struct Server {
    child: Child,
    url: String,
    root: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// A server with bucket [`BUCKET`], or `None` (printed) when no server binary is given.
    fn start() -> Option<Server> {
        let Ok(bin) = std::env::var("FASTENSOR_S3_SERVER") else {
            let required = std::env::var_os("FASTENSOR_REQUIRE_S3").is_some();
            assert!(
                !required,
                "FASTENSOR_REQUIRE_S3 is set, but FASTENSOR_S3_SERVER is not"
            );
            eprintln!("skipped: no S3 server (set FASTENSOR_S3_SERVER to fastensor-s3-server)");
            return None;
        };
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let mut child = Command::new(bin)
            .args(["--root".as_ref(), root.path().as_os_str()])
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("the S3 server starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line.trim().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
        Some(Server { child, url, root })
    }

    /// Stores talking to this server, with small parts and requests (many of each) and
    /// `retries` tries after the first.
    fn stores(&self, retries: usize) -> ObjectStores {
        self.stores_with(retries, "fastensor-secret")
    }

    fn stores_with(&self, retries: usize, secret: &str) -> ObjectStores {
        let vars: Vec<(&str, String)> = vec![
            ("AWS_ACCESS_KEY_ID", "fastensor".into()),
            ("AWS_SECRET_ACCESS_KEY", secret.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ENDPOINT_URL", self.url.clone()),
            ("HOME", "/nonexistent".into()),
        ];
        let config = ObjectConfig {
            request_bytes: 1 << 20,
            part_bytes: 5 << 20,
            retries,
            ..ObjectConfig::default()
        };
        ObjectStores::new(
            config,
            Arc::new(move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.clone())
            }),
        )
    }

    /// The file s3s-fs keeps the object `key` in.
    fn file(&self, key: &str) -> PathBuf {
        self.root.path().join(BUCKET).join(key)
    }

    /// Multipart uploads (or their parts) the server still holds.
    fn uploads_left(&self) -> Vec<String> {
        std::fs::read_dir(self.root.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".upload"))
            .collect()
    }

    /// Sends `method /_faults` with `body`; returns the response body.
    fn faults(&self, method: &str, body: &str) -> String {
        let addr = self.url.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "{method} /_faults HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 2"), "{out}");
        out.split_once("\r\n\r\n")
            .map_or(String::new(), |(_, b)| b.to_string())
    }

    /// Adds the fault `kind` on `times` requests of `method`.
    fn fault(&self, kind: &str, method: &str, times: u32) {
        self.faults(
            "POST",
            &format!(r#"{{"kind":"{kind}","method":"{method}","times":{times}}}"#),
        );
    }

    /// How many faults of `kind` fired since the last reset.
    fn fired(&self, kind: &str) -> u64 {
        let stats = self.faults("GET", "");
        let key = format!("\"{kind}\":");
        stats
            .split_once(&key)
            .map(|(_, rest)| {
                rest.chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
                    .parse()
                    .unwrap()
            })
            .unwrap_or(0)
    }
}

fn url(key: &str) -> PathBuf {
    PathBuf::from(format!("s3://{BUCKET}/{key}"))
}

/// Tensors of several dtypes and sizes: empty ones, small ones, one spanning several parts
/// and requests, with a pattern that tells every byte's place.
fn tensors() -> Vec<(TensorDesc, Vec<u8>)> {
    let pattern = |n: usize, seed: u8| -> Vec<u8> {
        (0..n)
            .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
            .collect()
    };
    vec![
        (TensorDesc::new("empty", DType::F32, [0u64, 4]), vec![]),
        (TensorDesc::new("bias", DType::F16, [3u64]), pattern(6, 1)),
        (
            TensorDesc::new("big", DType::F32, [3u64, 1_100_000]),
            pattern(13_200_000, 2),
        ),
        (
            TensorDesc::new("odd", DType::U8, [7u64, 13]),
            pattern(91, 3),
        ),
        (
            TensorDesc::new("mid", DType::BF16, [1000u64, 1000]),
            pattern(2_000_000, 4),
        ),
    ]
}

fn views(t: &[(TensorDesc, Vec<u8>)]) -> Vec<TensorView<'_>> {
    t.iter()
        .map(|(d, b)| TensorView::new(d.clone(), &b[..]))
        .collect()
}

fn assert_same(ckpt: &checkpoint::Checkpoint, t: &[(TensorDesc, Vec<u8>)]) {
    for (desc, bytes) in t {
        let (got_desc, got) = ckpt.tensor(&desc.name).expect("every tensor is loaded");
        assert_eq!(got_desc, desc);
        assert!(got == &bytes[..], "tensor {} differs", desc.name);
    }
}

#[test]
fn saves_and_loads_are_bit_exact_against_the_local_file() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(3);
    let t = tensors();
    let local = tempfile::tempdir().unwrap();
    let file = local.path().join("m.safetensors");
    checkpoint::save_checked(
        &stores,
        &url("m.safetensors"),
        &views(&t),
        &Default::default(),
    )
    .unwrap();
    checkpoint::save_checked(
        &fastensor::Engine::new().unwrap(),
        &file,
        &views(&t),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(
        std::fs::read(server.file("m.safetensors")).unwrap(),
        std::fs::read(&file).unwrap(),
        "the object holds the bytes of the local file"
    );
    assert!(server.uploads_left().is_empty());

    assert_same(
        &checkpoint::load(&stores, &url("m.safetensors")).unwrap(),
        &t,
    );
    assert_same(
        &checkpoint::load_verified(&stores, &url("m.safetensors"), None).unwrap(),
        &t,
    );
    let some = checkpoint::load_selected(&stores, &url("m.safetensors"), ["odd", "bias"]).unwrap();
    assert_eq!(some.tensor("odd").unwrap().1, &t[3].1[..]);
    assert!(some.tensor("big").is_none());

    let mut bufs: Vec<Vec<u8>> = t.iter().map(|(_, b)| vec![0xEE; b.len()]).collect();
    let targets: Vec<(&str, MemMut<'_>)> = t
        .iter()
        .zip(bufs.iter_mut())
        .map(|((d, _), b)| (d.name.as_str(), MemMut::Host(&mut b[..])))
        .collect();
    checkpoint::load_into(&stores, &url("m.safetensors"), targets).unwrap();
    for ((_, want), got) in t.iter().zip(&bufs) {
        assert!(want == got);
    }

    // A slice reads only the bytes it covers: rows 1..3 of `mid`, every other column.
    let opened = checkpoint::open(&stores, &url("m.safetensors")).unwrap();
    let sel = [
        DimSelection::from((1, 2, 1)),
        DimSelection::from((0, 500, 2)),
    ];
    let mut got = vec![0u8; 2 * 500 * 2];
    opened
        .read_slice("mid", &sel, MemMut::Host(&mut got))
        .unwrap();
    let want: Vec<u8> = (1..3)
        .flat_map(|r| (0..500).flat_map(move |c| [r * 2000 + c * 4, r * 2000 + c * 4 + 1]))
        .map(|i| t[4].1[i])
        .collect();
    assert_eq!(got, want);
}

#[test]
fn sharded_checkpoints_are_saved_and_loaded_under_a_prefix() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(3);
    let t = tensors();
    let index = checkpoint::save_sharded(&stores, &url("sharded"), &views(&t), 4 << 20).unwrap();
    assert!(index.weight_map.len() == t.len());
    assert!(server
        .file("sharded/model.safetensors.index.json")
        .is_file());
    for prefix in [
        "sharded",
        "sharded/",
        "sharded/model.safetensors.index.json",
    ] {
        let ckpt = checkpoint::load_sharded(&stores, &url(prefix)).unwrap();
        for (desc, bytes) in &t {
            assert!(ckpt.tensor(&desc.name).unwrap().1 == &bytes[..]);
        }
    }
    // Copies between objects, and through an engine from an object prefix to a local
    // directory and back: the same tensors everywhere.
    let bytes = checkpoint::sharded::copy_sharded(&stores, &url("sharded"), &url("copy")).unwrap();
    assert_eq!(bytes, t.iter().map(|(_, b)| b.len() as u64).sum::<u64>());
    let engine = fastensor::Engine::builder()
        .object_stores(server.stores(3))
        .build()
        .unwrap();
    let local = tempfile::tempdir().unwrap();
    checkpoint::sharded::copy_sharded(&engine, &url("copy"), local.path()).unwrap();
    checkpoint::sharded::copy_sharded(&engine, local.path(), &url("back")).unwrap();
    let ckpt = checkpoint::load_sharded(&engine, &url("back")).unwrap();
    for (desc, bytes) in &t {
        assert!(ckpt.tensor(&desc.name).unwrap().1 == &bytes[..]);
    }
}

#[test]
fn throttling_server_errors_slow_responses_dropped_connections_and_cut_bodies_are_retried() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(5);
    let t = tensors();
    checkpoint::save(&stores, &url("f.safetensors"), &views(&t)).unwrap();
    for kind in ["slow_down", "internal_error", "drop", "truncate"] {
        server.faults("DELETE", "");
        server.fault(kind, "GET", 3);
        let ckpt = checkpoint::load(&stores, &url("f.safetensors"))
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_same(&ckpt, &t);
        assert_eq!(
            server.fired(kind),
            3,
            "{kind}: every fault was met and retried"
        );
    }
    // Slow responses are waited for (well under the client's timeout).
    server.faults("DELETE", "");
    server.faults(
        "POST",
        r#"{"kind":"delay","method":"GET","times":4,"delay_ms":1500}"#,
    );
    let started = std::time::Instant::now();
    assert_same(
        &checkpoint::load(&stores, &url("f.safetensors")).unwrap(),
        &t,
    );
    assert_eq!(server.fired("delay"), 4);
    assert!(started.elapsed() >= std::time::Duration::from_millis(1500));
    // Saves retry too: parts refused or cut off are sent again.
    for kind in ["slow_down", "drop"] {
        server.faults("DELETE", "");
        server.fault(kind, "PUT", 2);
        checkpoint::save(&stores, &url("g.safetensors"), &views(&t))
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_same(
            &checkpoint::load(&stores, &url("g.safetensors")).unwrap(),
            &t,
        );
        assert_eq!(server.fired(kind), 2, "{kind}");
    }
}

#[test]
fn a_changed_etag_reloads_and_one_that_keeps_changing_is_an_error() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(2);
    let t = tensors();
    checkpoint::save(&stores, &url("e.safetensors"), &views(&t)).unwrap();
    server.fault("wrong_etag", "GET", 1);
    assert_same(
        &checkpoint::load(&stores, &url("e.safetensors")).unwrap(),
        &t,
    );
    assert_eq!(server.fired("wrong_etag"), 1);
    server.fault("wrong_etag", "GET", 1000);
    let e = checkpoint::load(&stores, &url("e.safetensors")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Changed, "{e}");
    assert!(e.to_string().contains("s3://ckpt/e.safetensors"), "{e}");
}

#[test]
fn missing_objects_and_refused_credentials_are_typed_errors_naming_the_object() {
    let Some(server) = Server::start() else {
        return;
    };
    let e = checkpoint::load(&server.stores(1), &url("none.safetensors")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("s3://ckpt/none.safetensors"), "{e}");
    let t = tensors();
    checkpoint::save(&server.stores(1), &url("x.safetensors"), &views(&t)).unwrap();
    let wrong = server.stores_with(1, "not-the-secret");
    let e = checkpoint::load(&wrong, &url("x.safetensors")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("s3://ckpt/x.safetensors"), "{e}");
    let e = checkpoint::load(&server.stores(1), Path::new("s3://ckpt")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

#[test]
fn a_failed_or_abandoned_save_leaves_no_object_and_no_parts() {
    let Some(server) = Server::start() else {
        return;
    };
    let stores = server.stores(1);
    let t = tensors();
    server.fault("internal_error", "PUT", 1000);
    let e = checkpoint::save(&stores, &url("fail.safetensors"), &views(&t)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("s3://ckpt/fail.safetensors"), "{e}");
    server.faults("DELETE", "");
    assert!(!server.file("fail.safetensors").exists());
    assert!(
        server.uploads_left().is_empty(),
        "{:?}",
        server.uploads_left()
    );
    let e = checkpoint::load(&stores, &url("fail.safetensors")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);

    // A writer dropped before it is synced (a save that failed on our side) aborts.
    let file = stores
        .open_file(&url("dropped.safetensors"), OpenMode::Truncate)
        .unwrap();
    file.write_at(0, (&vec![7u8; 12 << 20][..]).into()).unwrap();
    drop(file);
    assert!(!server.file("dropped.safetensors").exists());
    assert!(
        server.uploads_left().is_empty(),
        "{:?}",
        server.uploads_left()
    );

    // An earlier object stays whole when a save over it fails.
    checkpoint::save(&stores, &url("keep.safetensors"), &views(&t)).unwrap();
    let before = std::fs::read(server.file("keep.safetensors")).unwrap();
    server.fault("internal_error", "PUT", 1000);
    assert!(checkpoint::save(&stores, &url("keep.safetensors"), &views(&t[..2])).is_err());
    server.faults("DELETE", "");
    assert_eq!(
        std::fs::read(server.file("keep.safetensors")).unwrap(),
        before
    );
}

#[path = "objects/hostile.rs"]
mod hostile;
