//! `CheckpointFile::read_slice`: part of a tensor read through the open file, every backend.

use fastensor::checkpoint::{self, DimSelection, FileOpener, TensorView};
use fastensor::posix::{DirectBackend, PosixBackend};
use fastensor::{DType, ErrorKind, MemMut, TensorDesc};

fn sel(v: &[(u64, u64, u64)]) -> Vec<DimSelection> {
    v.iter().copied().map(DimSelection::from).collect()
}

#[test]
fn a_slice_holds_the_selected_elements_row_major() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.safetensors");
    // A 300 x 1000 u32 matrix whose element (r, c) is r * 1000 + c.
    let (rows, cols) = (300u64, 1000u64);
    let data: Vec<u8> = (0..rows * cols)
        .flat_map(|v| (v as u32).to_le_bytes())
        .collect();
    let desc = TensorDesc::new("m", DType::U32, [rows, cols]);
    let views = [TensorView::new(desc, &data[..])];
    let openers: [&dyn FileOpener; 2] = [&PosixBackend, &DirectBackend::default()];
    checkpoint::save(openers[0], &path, &views).unwrap();
    for opener in openers {
        let file = checkpoint::open(opener, &path).unwrap();
        // Rows 10, 13, 16 (step 3), columns 500..504.
        let mut got = vec![0u8; 3 * 4 * 4];
        let s = sel(&[(10, 3, 3), (500, 4, 1)]);
        file.read_slice("m", &s, MemMut::Host(&mut got)).unwrap();
        let values: Vec<u32> = got
            .chunks(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let want: Vec<u32> = [10u32, 13, 16]
            .iter()
            .flat_map(|r| (500..504).map(move |c| r * 1000 + c))
            .collect();
        assert_eq!(values, want);
        // A destination of the wrong length, a name the file lacks, a bad selection.
        let mut short = vec![0u8; 4];
        let e = file
            .read_slice("m", &s, MemMut::Host(&mut short))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let e = file
            .read_slice("x", &s, MemMut::Host(&mut got))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        let far = sel(&[(299, 2, 1), (0, cols, 1)]);
        let e = file
            .read_slice("m", &far, MemMut::Host(&mut got))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("s.safetensors"), "{e}");
    }
}
