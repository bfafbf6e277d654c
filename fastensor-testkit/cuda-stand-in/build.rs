//! Exports a stub for every entry point of `symbols.txt` that `src/` does not define: the
//! stand-in's library holds every symbol cudarc may look up, and the stubs are exactly what
//! it does not implement (see `src/unimplemented.rs`).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::{env, fs};

fn main() {
    println!("cargo:rerun-if-changed=symbols.txt");
    println!("cargo:rerun-if-changed=src");
    let defined = defined_in(Path::new("src"));
    let list = fs::read_to_string("symbols.txt").expect("symbols.txt");
    let mut out = String::new();
    for (kind, names) in sections(&list) {
        let stubs: Vec<&str> = names
            .into_iter()
            .filter(|n| !defined.contains(*n))
            .collect();
        if !stubs.is_empty() {
            writeln!(out, "unsupported!({kind}; {});", stubs.join(", ")).unwrap();
        }
    }
    let path = Path::new(&env::var("OUT_DIR").unwrap()).join("unimplemented.rs");
    fs::write(path, out).expect("writing the stubs");
}

/// The sections of the list: each `[KIND]` line and the names under it.
fn sections(list: &str) -> Vec<(&str, Vec<&str>)> {
    let mut sections: Vec<(&str, Vec<&str>)> = Vec::new();
    for line in list.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            Some(kind) => sections.push((kind, Vec::new())),
            None => sections
                .last_mut()
                .expect("a name before any [KIND]")
                .1
                .push(line),
        }
    }
    sections
}

/// Names of the `extern "C" fn`s the sources under `dir` define.
fn defined_in(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in fs::read_dir(dir).expect("src") {
        let path = entry.expect("src").path();
        if path.is_dir() {
            names.extend(defined_in(&path));
            continue;
        }
        let text = fs::read_to_string(&path).expect("a source file");
        for rest in text.split("extern \"C\" fn ").skip(1) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}
