//! Interoperability with the reference `safetensors` crate, both directions: every dtype,
//! empty and 0-d tensors, and `__metadata__`.

use fastensor::checkpoint::{self, TensorView};
use fastensor::posix::DirectBackend;
use fastensor::{DType, TensorDesc};
use safetensors::tensor::{Dtype, SafeTensors, TensorView as StView};
use std::collections::{BTreeMap, HashMap};

fn st_dtype(d: DType) -> Dtype {
    serde_json::from_str(&format!("\"{}\"", d.name()))
        .expect("safetensors knows every dtype of ours")
}

fn sample() -> Vec<(TensorDesc, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, d) in DType::ALL.iter().enumerate() {
        // (a multiple of 8 elements: whole bytes of the packed dtypes too)
        let shape = [2, i as u64 + 1, 4];
        let desc = TensorDesc::new(format!("layer.{i}.{}", d.name().to_lowercase()), *d, shape);
        let len = desc.byte_len().unwrap() as usize;
        out.push((desc, (0..len).map(|j| (j * 7 + i) as u8).collect()));
        if let Some(size) = d.size() {
            out.push((
                TensorDesc::new(format!("scalar.{}", d.name()), *d, []),
                vec![i as u8; size],
            ));
        }
        out.push((
            TensorDesc::new(format!("empty.{}", d.name()), *d, [4, 0]),
            Vec::new(),
        ));
    }
    out.push((
        TensorDesc::new("big", DType::F32, [1 << 18, 3]),
        (0..3 << 20).map(|j| (j % 251) as u8).collect(),
    ));
    out
}

fn metadata() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("escaped \"\\\n".to_string(), "värde ✓".to_string()),
    ])
}

#[test]
fn safetensors_reads_what_we_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ours.safetensors");
    let s = sample();
    let views: Vec<_> = s
        .iter()
        .map(|(d, b)| TensorView::new(d.clone(), b))
        .collect();
    checkpoint::save_with_metadata(&DirectBackend::default(), &path, &views, &metadata()).unwrap();

    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), s.len());
    for (d, data) in &s {
        let t = st.tensor(&d.name).unwrap();
        assert_eq!(t.dtype(), st_dtype(d.dtype), "{}", d.name);
        let shape: Vec<u64> = t.shape().iter().map(|&x| x as u64).collect();
        assert_eq!(shape, d.shape, "{}", d.name);
        assert_eq!(t.data(), &data[..], "{}", d.name);
    }
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let got: BTreeMap<_, _> = meta.metadata().clone().unwrap().into_iter().collect();
    assert_eq!(got, metadata());
}

#[test]
fn we_read_what_safetensors_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("theirs.safetensors");
    let s = sample();
    let views: Vec<(String, StView<'_>)> = s
        .iter()
        .map(|(d, b)| {
            let shape = d.shape.iter().map(|&x| x as usize).collect();
            (
                d.name.clone(),
                StView::new(st_dtype(d.dtype), shape, b).unwrap(),
            )
        })
        .collect();
    let meta: HashMap<String, String> = metadata().into_iter().collect();
    safetensors::serialize_to_file(views, Some(meta), &path).unwrap();

    let header = checkpoint::inspect(&path).unwrap();
    assert_eq!(header.metadata(), &metadata());
    let b = DirectBackend::default();
    let ckpt = checkpoint::load(&b, &path).unwrap();
    assert_eq!(ckpt.len(), s.len());
    assert_eq!(ckpt.metadata(), &metadata());
    for (d, data) in &s {
        let (got_d, got) = ckpt.tensor(&d.name).unwrap();
        assert_eq!(got_d, d);
        assert_eq!(got, &data[..], "{}", d.name);
    }
    let names = ["big", "scalar.F64", "empty.BOOL", "layer.6.f8_e5m2"];
    let sel = checkpoint::load_selected(&b, &path, names).unwrap();
    for name in names {
        let want = &s.iter().find(|(d, _)| d.name == name).unwrap().1;
        assert_eq!(sel.tensor(name).unwrap().1, &want[..], "{name}");
    }
    // And a copy through our fast path is still readable by the reference crate.
    let copy = dir.path().join("copy.safetensors");
    checkpoint::copy(&b, &path, &copy).unwrap();
    let bytes = std::fs::read(&copy).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("big").unwrap().data(), &s.last().unwrap().1[..]);
}
