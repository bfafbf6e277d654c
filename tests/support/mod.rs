//! Helpers the root tests of saves and loads share (`mod support;` in each test file).
//! Each test file uses some of them.
#![allow(dead_code, unused_imports)]

mod dir;
pub mod gate;

pub use dir::names_in;

use fastensor::checkpoint::{self, TensorView};
use fastensor::posix::PosixBackend;
use fastensor::{DType, TensorDesc};
use std::path::Path;

/// Saves one tensor `w` of 64 bytes of `value` at `path` through the posix backend.
pub fn save_small(path: &Path, value: u8) -> fastensor::Result<()> {
    let data = [value; 64];
    let t = [TensorView::new(
        TensorDesc::new("w", DType::U8, [64]),
        &data[..],
    )];
    checkpoint::save(&PosixBackend, path, &t)
}

/// The value of the 64 bytes of tensor `w` that [`save_small`] saved at `path`.
pub fn value_at(path: &Path) -> u8 {
    let back = checkpoint::load(&PosixBackend, path).unwrap();
    let w = back.tensor("w").unwrap().1;
    assert!(w.iter().all(|&b| b == w[0]));
    w[0]
}
