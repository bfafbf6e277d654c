//! Finding the CUDA shared libraries, and explaining precisely why one is missing.
//!
//! cudarc finds `libcuda` by itself, through the dynamic loader. Its search list for cuFile
//! lacks `libcufile.so.0`, the name the CUDA runtime installs and the `nvidia-cufile` Python
//! package ships, and it cannot load from an explicit path; so cuFile is found here:
//!
//! 1. the path the configuration names, else `FASTENSOR_CUFILE`;
//! 2. `libcufile.so.0` (then `libcufile.so`) in every `LD_LIBRARY_PATH` directory, the CUDA
//!    toolkit directories (`$CUDA_HOME`, `/usr/local/cuda`), the standard library directories,
//!    and the `nvidia/cufile/lib/` folder of every Python `site-packages` found;
//! 3. the bare names, through the dynamic loader (`ld.so.cache`).

use std::path::{Path, PathBuf};

/// The names cuFile is installed under, most specific first.
pub const CUFILE_NAMES: [&str; 2] = ["libcufile.so.0", "libcufile.so"];

/// The environment variable naming the cuFile library to load.
pub const CUFILE_ENV: &str = "FASTENSOR_CUFILE";

/// Standard library directories searched for cuFile.
const STD_DIRS: [&str; 7] = [
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/cuda/targets/sbsa-linux/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/local/lib",
];

/// Where a library may be: a file path to try, or a bare name for the dynamic loader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidate {
    /// A file path, tried only when the file exists.
    Path(PathBuf),
    /// A bare name resolved by the dynamic loader.
    Name(&'static str),
}

impl Candidate {
    fn display(&self) -> String {
        match self {
            Candidate::Path(p) => p.display().to_string(),
            Candidate::Name(n) => (*n).to_string(),
        }
    }
}

/// The cuFile library to load: the explicit path when one is given (and nothing else, so a
/// wrong path is reported rather than silently replaced), else every place searched.
pub fn cufile_candidates(explicit: Option<&Path>) -> (Vec<Candidate>, Option<String>) {
    if let Some(p) = explicit {
        return (
            vec![Candidate::Path(p.to_path_buf())],
            Some("the configured cuFile path".into()),
        );
    }
    if let Some(p) = std::env::var_os(CUFILE_ENV).filter(|v| !v.is_empty()) {
        return (
            vec![Candidate::Path(PathBuf::from(p))],
            Some(CUFILE_ENV.to_string()),
        );
    }
    let mut out = Vec::new();
    for dir in search_dirs() {
        for name in CUFILE_NAMES {
            let p = dir.join(name);
            if !out.contains(&Candidate::Path(p.clone())) {
                out.push(Candidate::Path(p));
            }
        }
    }
    out.extend(CUFILE_NAMES.iter().map(|n| Candidate::Name(n)));
    (out, None)
}

/// The directories searched for cuFile, in order, without duplicates.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut push = |d: PathBuf| {
        if !d.as_os_str().is_empty() && !dirs.contains(&d) {
            dirs.push(d);
        }
    };
    if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
        std::env::split_paths(&v).for_each(&mut push);
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            push(PathBuf::from(&v).join("lib64"));
            push(PathBuf::from(&v).join("lib"));
        }
    }
    STD_DIRS.iter().map(PathBuf::from).for_each(&mut push);
    site_packages()
        .into_iter()
        .map(|sp| sp.join("nvidia/cufile/lib"))
        .for_each(&mut push);
    dirs
}

/// Python `site-packages`/`dist-packages` folders: of the active virtual or conda
/// environment, the user's, and the system's.
fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(var) {
            roots.push(PathBuf::from(v).join("lib"));
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".local/lib"));
    }
    roots.extend(["/usr/local/lib", "/usr/lib", "/opt/conda/lib"].map(PathBuf::from));
    let mut out = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for py in pythons {
            for sub in ["site-packages", "dist-packages"] {
                let sp = py.join(sub);
                if sp.is_dir() {
                    out.push(sp);
                }
            }
        }
    }
    out
}

/// Loads the first candidate that loads; the error says what was tried and why each failed.
pub fn load_first(
    what: &str,
    candidates: &[Candidate],
    origin: Option<&str>,
) -> Result<(libloading::Library, String), String> {
    let mut failures = Vec::new();
    let mut missing = Vec::new();
    for c in candidates {
        if let Candidate::Path(p) = c {
            if !p.exists() {
                missing.push(c.display());
                continue;
            }
        }
        let name = c.display();
        // SAFETY: loading a shared library runs its initialisers; cuFile's and the CUDA
        // driver's are meant to run in any process that loads them.
        match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => return Ok((lib, name)),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    Err(match origin {
        Some(origin) if failures.is_empty() => format!(
            "{what} not found at {} (given by {origin})",
            missing.join(", ")
        ),
        Some(origin) => format!(
            "{what} given by {origin} cannot be loaded: {}",
            failures.join("; ")
        ),
        None if failures.is_empty() => {
            format!(
                "{what} not found (searched {} and the dynamic loader's path)",
                summarize_dirs()
            )
        }
        None => format!("{what} cannot be loaded: {}", failures.join("; ")),
    })
}

/// A short list of the directories searched, for messages.
fn summarize_dirs() -> String {
    let dirs = search_dirs();
    let shown: Vec<String> = dirs
        .iter()
        .take(12)
        .map(|d| d.display().to_string())
        .collect();
    if dirs.len() > shown.len() {
        format!("{} and {} more", shown.join(", "), dirs.len() - shown.len())
    } else {
        shown.join(", ")
    }
}

/// Why `libcuda.so.1` could not be found, naming the names tried and where.
pub fn libcuda_missing_reason() -> String {
    let ld = std::env::var("LD_LIBRARY_PATH")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "<unset>".into());
    let mut names: Vec<String> = vec!["libcuda.so.1".into(), "libcuda.so".into()];
    for n in cudarc::get_lib_name_candidates("cuda") {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    format!(
        "libcuda.so.1 not found (the NVIDIA driver library; searched {}, {} and {} other names \
         in LD_LIBRARY_PATH={ld}, ld.so.cache and the default library directories)",
        names[0],
        names[1],
        names.len() - 2
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_path_is_the_only_candidate() {
        let (c, origin) = cufile_candidates(Some(Path::new("/nowhere/libcufile.so.0")));
        assert_eq!(c, vec![Candidate::Path("/nowhere/libcufile.so.0".into())]);
        let err = load_first("cuFile", &c, origin.as_deref()).unwrap_err();
        assert!(err.contains("/nowhere/libcufile.so.0"), "{err}");
        assert!(err.contains("configured"), "{err}");
    }

    #[test]
    fn the_search_ends_with_bare_names_and_tries_so_0_first() {
        let (c, origin) = cufile_candidates(None);
        if origin.is_some() {
            return; // FASTENSOR_CUFILE is set in this environment
        }
        assert_eq!(c.last(), Some(&Candidate::Name("libcufile.so")));
        let first_path = c.iter().find_map(|c| match c {
            Candidate::Path(p) => Some(p.clone()),
            _ => None,
        });
        assert!(first_path.unwrap().ends_with("libcufile.so.0"));
    }

    #[test]
    fn a_missing_library_lists_what_was_searched() {
        let c = vec![Candidate::Path("/nowhere/a/libcufile.so.0".into())];
        let err = load_first("libcufile.so.0", &c, None).unwrap_err();
        assert!(
            err.starts_with("libcufile.so.0 not found (searched"),
            "{err}"
        );
    }
}
