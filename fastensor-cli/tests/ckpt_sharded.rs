//! `fastensor ckpt inspect` and `ckpt copy` on sharded checkpoints (a directory or an index).

use fastensor::checkpoint::{self, sharded, TensorView};
use fastensor::posix::PosixBackend;
use fastensor::{DType, TensorDesc};
mod common;

use common::{failed, ok, run};

#[test]
fn inspect_and_copy_accept_a_directory_or_an_index() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let data: Vec<(TensorDesc, Vec<u8>)> = (0..6u8)
        .map(|i| {
            let d = TensorDesc::new(format!("w{i}"), DType::F32, [256, 64]);
            (d, vec![i; 256 * 64 * 4])
        })
        .collect();
    let views: Vec<_> = data
        .iter()
        .map(|(d, b)| TensorView::new(d.clone(), b))
        .collect();
    checkpoint::save_sharded(&PosixBackend, &src, &views, 150_000).unwrap();

    let by_dir = ok(run("ckpt inspect", &[&src]));
    assert!(by_dir.contains("3 shards, 6 tensors"), "{by_dir}");
    assert!(
        by_dir.contains("model-00002-of-00003.safetensors"),
        "{by_dir}"
    );
    let by_index = ok(run("ckpt inspect", &[&src.join(sharded::INDEX_NAME)]));
    assert_eq!(by_dir, by_index);

    let dst = dir.path().join("dst");
    let out = ok(run("ckpt copy", &[&src.join(sharded::INDEX_NAME), &dst]));
    assert!(out.contains("copied 393216 bytes"), "{out}");
    let back = checkpoint::load_sharded(&PosixBackend, &dst).unwrap();
    assert_eq!(back.index().shard_names().len(), 3);
    for (d, b) in &data {
        assert_eq!(back.tensor(&d.name).unwrap().1, &b[..]);
    }

    assert!(failed(run("ckpt inspect", &[dir.path()])).contains("index"));
}
