//! What a directory holds, for tests that check what a save or a command left behind. The
//! tests of `fastensor-cli` include this file by path too.

use std::path::Path;

/// The names in `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
