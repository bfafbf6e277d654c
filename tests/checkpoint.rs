//! End-to-end tests of `fastensor::checkpoint`: round trips through every POSIX backend,
//! atomic saves, selective loads, loads into caller buffers, validation errors.

mod common;

use common::{buffers, targets, views, Hooked, Hooks};
use fastensor::checkpoint::{self, TensorView};
use fastensor::posix::{DirectBackend, PosixBackend};
use fastensor::{Backend, DType, Error, ErrorKind, MemMut, TensorDesc};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Every dtype, an empty tensor, a 0-d tensor, and a multi-window mix of sizes.
fn sample() -> Vec<(TensorDesc, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, d) in DType::ALL.iter().enumerate() {
        // (a multiple of 4 elements: whole bytes of the packed dtypes too)
        let desc = TensorDesc::new(format!("t.{}", d.name()), *d, [4, i as u64 + 1]);
        let len = desc.byte_len().unwrap() as usize;
        out.push((desc, bytes(len, i as u8)));
    }
    out.push((TensorDesc::new("empty", DType::F16, [0, 5]), Vec::new()));
    out.push((TensorDesc::new("scalar", DType::F64, []), bytes(8, 99)));
    out.push((
        TensorDesc::new("big", DType::F32, [5 << 20]),
        bytes(20 << 20, 7),
    ));
    out.push((
        TensorDesc::new("odd", DType::U8, [4097 * 3 + 1]),
        bytes(4097 * 3 + 1, 3),
    ));
    out.push((
        TensorDesc::new("mid", DType::BF16, [3 << 20]),
        bytes(6 << 20, 5),
    ));
    out
}

fn backends() -> Vec<Arc<dyn Backend>> {
    vec![Arc::new(DirectBackend::default()), Arc::new(PosixBackend)]
}

fn meta() -> BTreeMap<String, String> {
    [("format", "pt"), ("note", "quote \" and ünïcode")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn round_trip_every_backend() {
    let dir = tempfile::tempdir().unwrap();
    let s = sample();
    for b in backends() {
        let path = dir.path().join(format!("{}.safetensors", b.name()));
        checkpoint::save_with_metadata(&*b, &path, &views(&s), &meta()).unwrap();
        let header = checkpoint::inspect(&path).unwrap();
        assert!(
            header.is_aligned(),
            "data starts at {}",
            header.data_start()
        );
        assert_eq!(header.data_start() % 4096, 0);
        assert_eq!(header.metadata(), &meta());
        let ckpt = checkpoint::load(&*b, &path).unwrap();
        assert_eq!(ckpt.len(), s.len());
        assert_eq!(ckpt.metadata(), &meta());
        for (d, data) in &s {
            let (got_d, got) = ckpt.tensor(&d.name).unwrap();
            assert_eq!(got_d, d);
            assert!(got == &data[..], "tensor {} differs ({})", d.name, b.name());
        }
        assert!(ckpt.tensor("nope").is_none());
        assert_eq!(ckpt.arena().as_ptr() as usize % 4096, 0);
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn unaligned_sources_are_staged_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u.safetensors");
    // More staged windows than staging buffers: the buffers are reused.
    let raw = bytes((58 << 20) + 1, 11);
    let src = &raw[1..]; // not page-aligned
    let tensors = vec![
        TensorView::new(TensorDesc::new("a", DType::U8, [1000]), &src[..1000]),
        TensorView::new(
            TensorDesc::new("b", DType::U8, [(57 << 20) - 1000]),
            &src[1000..57 << 20],
        ),
        TensorView::new(TensorDesc::new("c", DType::U8, [1 << 20]), &src[57 << 20..]),
    ];
    let b = DirectBackend::default();
    checkpoint::save(&b, &path, &tensors).unwrap();
    let ckpt = checkpoint::load(&b, &path).unwrap();
    let all: Vec<u8> = ckpt.iter().flat_map(|(_, d)| d.iter().copied()).collect();
    assert!(all == src);
}

#[test]
fn saving_over_keeps_old_until_rename_and_errors_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let s = sample();
    let b = DirectBackend::default();
    checkpoint::save(&b, &path, &views(&s)).unwrap();
    let before = std::fs::read(&path).unwrap();

    // A write failure half way: the old file stays, the temporary file is removed.
    let failing = Hooked {
        inner: Arc::new(DirectBackend::default()),
        hooks: Hooks {
            budget: Some(Arc::new(AtomicU64::new(8 << 20))),
            ..Hooks::default()
        },
    };
    let bigger: Vec<(TensorDesc, Vec<u8>)> = vec![(
        TensorDesc::new("x", DType::U8, [30 << 20]),
        bytes(30 << 20, 1),
    )];
    let err = checkpoint::save(&failing, &path, &views(&bigger)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StorageFull);
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    // Bad input: nothing is created.
    let bad = vec![TensorView::new(
        TensorDesc::new("x", DType::F32, [3]),
        &[0u8; 11][..],
    )];
    let err = checkpoint::save(&b, &dir.path().join("n.safetensors"), &bad).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("`x`"), "{err}");
    let dup = vec![
        TensorView::new(TensorDesc::new("x", DType::U8, [1]), &[0u8][..]),
        TensorView::new(TensorDesc::new("x", DType::U8, [1]), &[0u8][..]),
    ];
    assert_eq!(
        checkpoint::save(&b, &dir.path().join("n.safetensors"), &dup)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidInput
    );
    let reserved = vec![TensorView::new(
        TensorDesc::new("__metadata__", DType::U8, [1]),
        &[0u8][..],
    )];
    assert_eq!(
        checkpoint::save(&b, &dir.path().join("n.safetensors"), &reserved)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidInput
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    // A new save replaces the file whole.
    checkpoint::save(&b, &path, &views(&bigger)).unwrap();
    let ckpt = checkpoint::load(&b, &path).unwrap();
    assert_eq!(ckpt.len(), 1);
    assert!(ckpt.tensor("x").unwrap().1 == &bigger[0].1[..]);
}

#[test]
fn selected_loads_read_only_what_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.safetensors");
    let s = sample();
    checkpoint::save(&DirectBackend::default(), &path, &views(&s)).unwrap();
    let read = Arc::new(AtomicU64::new(0));
    let counting = Hooked {
        inner: Arc::new(DirectBackend::default()),
        hooks: Hooks {
            read: Some(read.clone()),
            ..Hooks::default()
        },
    };
    let ckpt = checkpoint::load_selected(&counting, &path, ["scalar", "t.F32", "empty"]).unwrap();
    assert_eq!(ckpt.len(), 3);
    for name in ["scalar", "t.F32", "empty"] {
        let want = &s.iter().find(|(d, _)| d.name == name).unwrap().1;
        assert!(ckpt.tensor(name).unwrap().1 == &want[..], "{name}");
    }
    assert!(ckpt.tensor("big").is_none());
    let read = read.load(Ordering::Relaxed);
    assert!(read < 1 << 20, "read {read} bytes for a few small tensors");

    let ckpt = checkpoint::load_selected(&counting, &path, ["big"]).unwrap();
    assert!(
        ckpt.tensor("big").unwrap().1 == &s.iter().find(|(d, _)| d.name == "big").unwrap().1[..]
    );

    let err = checkpoint::load_selected(&counting, &path, ["missing"]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(
        err.to_string().contains("missing") && err.to_string().contains("s.safetensors"),
        "{err}"
    );
}

#[test]
fn load_into_fills_caller_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.safetensors");
    let s = sample();
    checkpoint::save(&PosixBackend, &path, &views(&s)).unwrap();
    let mut bufs = buffers(&s, 0);
    let targets = targets(&s, &mut bufs);
    let header = checkpoint::load_into(&DirectBackend::default(), &path, targets).unwrap();
    assert_eq!(header.entries().len(), s.len());
    for ((d, want), got) in s.iter().zip(&bufs) {
        assert!(got == want, "{}", d.name);
    }
    let mut small = vec![0u8; 3];
    let err = checkpoint::load_into(
        &PosixBackend,
        &path,
        vec![("scalar", MemMut::from(&mut small))],
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = checkpoint::load_into(&PosixBackend, &path, vec![("zz", MemMut::from(&mut small))])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

/// A file as other writers make it: header not padded to 4096.
fn write_foreign(path: &Path, json: &str, data: &[u8]) {
    let mut f = (json.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(json.as_bytes());
    f.extend_from_slice(data);
    std::fs::write(path, f).unwrap();
}

#[test]
fn unaligned_foreign_files_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.safetensors");
    let data = bytes(3 << 20, 9);
    let json = format!(
        r#"{{"b":{{"dtype":"U8","shape":[{}],"data_offsets":[10,{}]}},"a":{{"dtype":"I16","shape":[5],"data_offsets":[0,10]}}}}"#,
        data.len() - 10,
        data.len()
    );
    write_foreign(&path, &json, &data);
    for b in backends() {
        let ckpt = checkpoint::load(&*b, &path).unwrap();
        assert!(ckpt.tensor("a").unwrap().1 == &data[..10]);
        assert!(ckpt.tensor("b").unwrap().1 == &data[10..]);
        let sel = checkpoint::load_selected(&*b, &path, ["b"]).unwrap();
        assert!(sel.tensor("b").unwrap().1 == &data[10..]);
    }
    // copy re-saves it aligned.
    let dst = dir.path().join("g.safetensors");
    let n = checkpoint::copy(&DirectBackend::default(), &path, &dst).unwrap();
    assert_eq!(n, data.len() as u64);
    let h = checkpoint::inspect(&dst).unwrap();
    assert!(h.is_aligned());
    let table = checkpoint::format_table(&h);
    assert!(
        table.contains("I16") && table.contains("2 tensors"),
        "{table}"
    );
    assert_eq!(checkpoint::rows(&h)[0].name, "a");
}

fn corrupt_err(path: &Path) -> Error {
    let err = checkpoint::load(&DirectBackend::default(), path).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(
        err.to_string()
            .contains(&*path.file_name().unwrap().to_string_lossy()),
        "{err}"
    );
    assert_eq!(
        checkpoint::inspect(path).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    err
}

#[test]
fn defects_are_corrupt_errors_naming_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.safetensors");
    let t = |name: &str, dtype: &str, shape: &str, a: u64, b: u64| {
        format!(r#""{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{a},{b}]}}"#)
    };
    // A header of the 4-byte tensor `a` at 0..4 and `entry`.
    let after_a = |entry: String| format!("{{{},{entry}}}", t("a", "U8", "[4]", 0, 4));
    let cases: Vec<(String, usize, &str)> = vec![
        (format!("{{{}}}", t("w", "F32", "[2]", 0, 8)), 4, "w"), // truncated
        (format!("{{{}}}", t("w", "F32", "[3]", 0, 8)), 8, "w"), // dtype × shape
        (format!("{{{}}}", t("w", "F77", "[2]", 0, 8)), 8, "w"), // dtype
        (after_a(t("b", "U8", "[4]", 2, 6)), 6, "b"),            // overlap
        (after_a(t("b", "U8", "[4]", 5, 9)), 9, "b"),            // gap
        (format!("{{{}}}", t("a", "U8", "[4]", 0, 4)), 6, "a"),  // trailing
        (format!("{{{}}}", t("a", "U8", "[4]", 4, 0)), 4, "a"),  // reversed
        (
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0]}}"#.to_string(),
            4,
            "a",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}}"#.to_string(),
            4,
            "a",
        ),
        (r#"{"a":{"dtype":"U8","shape":[4]}}"#.to_string(), 4, "a"),
        (r#"{"a":"#.to_string(), 4, "JSON"),
        (r#"["a"]"#.to_string(), 4, "JSON"),
        (
            format!(
                "{{{},\"__metadata__\":{{\"k\":1}}}}",
                t("a", "U8", "[4]", 0, 4)
            ),
            4,
            "__metadata__",
        ),
    ];
    for (json, data_len, needle) in cases {
        write_foreign(&p, &json, &vec![0u8; data_len]);
        let err = corrupt_err(&p);
        assert!(err.to_string().contains(needle), "{json}: {err}");
    }
    // Header length beyond the file, beyond the limit, file shorter than 8 bytes.
    std::fs::write(&p, 1000u64.to_le_bytes()).unwrap();
    corrupt_err(&p);
    let mut huge = (200_000_000u64).to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    std::fs::write(&p, huge).unwrap();
    assert!(corrupt_err(&p).to_string().contains("limit"));
    std::fs::write(&p, [1, 2, 3]).unwrap();
    corrupt_err(&p);
    // A file truncated after a good save.
    let s = sample();
    checkpoint::save(&PosixBackend, &p, &views(&s)).unwrap();
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    let err = corrupt_err(&p);
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn empty_checkpoint_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e.safetensors");
    checkpoint::save(&DirectBackend::default(), &p, &[]).unwrap();
    let c = checkpoint::load(&DirectBackend::default(), &p).unwrap();
    assert!(c.is_empty());
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 4096);
}

#[test]
fn round_trip_through_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("engine.safetensors");
    let engine = fastensor::Engine::builder().build().unwrap();
    let s = sample();
    checkpoint::save_with_metadata(&engine, &path, &views(&s), &meta()).unwrap();
    let ckpt = checkpoint::load(&engine, &path).unwrap();
    for (d, data) in &s {
        assert!(ckpt.tensor(&d.name).unwrap().1 == &data[..], "{}", d.name);
    }
    let sel = checkpoint::load_selected(&engine, &path, ["odd"]).unwrap();
    assert_eq!(sel.len(), 1);
}

/// A data section given as one buffer saves the file `save` writes from separate tensors,
/// and a buffer of the wrong length is refused, leaving nothing.
#[test]
fn save_section_writes_what_save_writes() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = sample();
    let mut section =
        fastensor::HostBuffer::new(tensors.iter().map(|(_, b)| b.len()).sum()).unwrap();
    let mut at = 0;
    for (_, b) in &tensors {
        section[at..at + b.len()].copy_from_slice(b);
        at += b.len();
    }
    let descs: Vec<TensorDesc> = tensors.iter().map(|(d, _)| d.clone()).collect();
    let views = views(&tensors);
    let meta = BTreeMap::from([("k".to_string(), "v".to_string())]);
    let backend = DirectBackend::default();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    checkpoint::save_with_metadata(&backend, &a, &views, &meta).unwrap();
    checkpoint::save_section(&backend, &b, &descs, section.as_mem(), &meta, false).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());

    let short = section.as_mem().slice(0, section.len() - 1);
    let c = dir.path().join("c");
    let err = checkpoint::save_section(&backend, &c, &descs, short, &meta, false).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(!c.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn read_new_places_each_tensor_for_direct_reads_and_checks_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.safetensors");
    let data = sample();
    checkpoint::save_checked(&PosixBackend, &path, &views(&data), &meta()).unwrap();
    let file = checkpoint::open(&PosixBackend, &path).unwrap();
    let starts: BTreeMap<String, u64> = file
        .source()
        .entries()
        .into_iter()
        .map(|(_, e, r)| (e.desc.name.clone(), r.start))
        .collect();
    let ckpt = file.source().read_new(None).unwrap();
    assert_eq!(ckpt.len(), data.len());
    let base = ckpt.arena().base_ptr() as usize;
    for (desc, bytes) in &data {
        let (got_desc, got) = ckpt.tensor(&desc.name).unwrap();
        assert_eq!(got_desc, desc);
        assert_eq!(got, &bytes[..], "{}", desc.name);
        let item = desc.dtype.size().unwrap_or(1);
        let at = got.as_ptr() as usize;
        assert_eq!(
            (at - base) % item,
            0,
            "{} keeps its element alignment",
            desc.name
        );
        if starts[&desc.name].is_multiple_of(item as u64) {
            assert_eq!(
                at % 4096,
                (starts[&desc.name] % 4096) as usize,
                "{}",
                desc.name
            );
        }
    }
    let some = file.source().read_new(Some(&["mid", "scalar"])).unwrap();
    assert_eq!(some.len(), 2);
    assert_eq!(some.tensor("mid").unwrap().1, &data[data.len() - 1].1[..]);
    let missing = file.source().read_new(Some(&["nope"])).unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);

    // A verifying file checks each tensor it reads whole.
    let mut raw = std::fs::read(&path).unwrap();
    let at = starts["big"] as usize + 12345;
    raw[at] ^= 0xff;
    std::fs::write(&path, &raw).unwrap();
    let verifying = checkpoint::open(&PosixBackend, &path)
        .unwrap()
        .verifying()
        .unwrap();
    let e = verifying.source().read_new(None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("big"), "{e}");
}
