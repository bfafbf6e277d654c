//! `fastensor ckpt verify` on a file and on a sharded checkpoint, and `ckpt inspect` of
//! every dtype.

use fastensor::checkpoint::{self, checksum, TensorView};
use fastensor::posix::PosixBackend;
use fastensor::{DType, TensorDesc};
mod common;

use common::{ok, run, text};
use std::collections::BTreeMap;

/// `(success, stdout + stderr)` of `fastensor ckpt verify path`.
fn verify(path: &std::path::Path) -> (bool, String) {
    let out = run("ckpt verify", &[path]);
    (out.status.success(), text(&out))
}

#[test]
fn verify_checks_files_and_shards_and_names_a_damaged_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<(TensorDesc, Vec<u8>)> = (0..4u8)
        .map(|i| {
            let d = TensorDesc::new(format!("w{i}"), DType::F32, [256, 64]);
            (d, (0..256 * 64 * 4).map(|j| (j % 251) as u8 ^ i).collect())
        })
        .collect();
    let views: Vec<_> = data
        .iter()
        .map(|(d, b)| TensorView::new(d.clone(), b))
        .collect();
    let mut meta = BTreeMap::new();
    checksum::stamp(&views, &mut meta).unwrap();
    let b = PosixBackend;
    let file = dir.path().join("one.safetensors");
    checkpoint::save_with_metadata(&b, &file, &views, &meta).unwrap();
    let shards = dir.path().join("ckpt");
    checkpoint::save_sharded_with_metadata(&b, &shards, &views, 128 << 10, &meta).unwrap();

    let (ok, out) = verify(&file);
    assert!(ok && out.contains("verified 4 tensors"), "{out}");
    let (ok, out) = verify(&shards);
    assert!(
        ok && out.contains("verified 4 tensors") && out.contains("2 file(s)"),
        "{out}"
    );

    let header = checkpoint::inspect(&file).unwrap();
    let at = header.file_range(header.get("w2").unwrap()).start + 1000;
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[at as usize] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let (ok, out) = verify(&file);
    assert!(!ok, "{out}");
    assert!(
        out.contains("`w2`") && out.contains("one.safetensors") && out.contains("mismatch"),
        "{out}"
    );

    // A file saved without checksums: said so.
    let plain = dir.path().join("plain.safetensors");
    checkpoint::save(&b, &plain, &views).unwrap();
    let (ok, out) = verify(&plain);
    assert!(!ok && out.contains("without checksums"), "{out}");
}

#[test]
fn inspect_lists_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all.safetensors");
    let data: Vec<(TensorDesc, Vec<u8>)> = DType::ALL
        .iter()
        .map(|&d| {
            let desc = TensorDesc::new(format!("x.{}", d.name()), d, [2, 4]);
            let n = desc.byte_len().unwrap() as usize;
            (desc, vec![0u8; n])
        })
        .collect();
    let views: Vec<_> = data
        .iter()
        .map(|(d, b)| TensorView::new(d.clone(), b))
        .collect();
    checkpoint::save(&PosixBackend, &path, &views).unwrap();
    let text = ok(run("ckpt inspect", &[&path]));
    for d in DType::ALL {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("x.{} ", d.name())))
            .unwrap_or_else(|| panic!("{} missing:\n{text}", d.name()));
        assert!(line.contains(&format!(" {} ", d.name())), "{line}");
    }
    assert!(
        text.contains("F8_E4M3FNUZ") && text.contains(" F4 "),
        "{text}"
    );
}
