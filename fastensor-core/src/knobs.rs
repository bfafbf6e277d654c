//! Tuning knobs: named settings a backend exposes (threads, queue depth, chunk size, ...) so
//! benchmarks can sweep them and profiles can store the best values, without knowing any
//! backend's configuration type.
//!
//! A backend lists its knobs with [`Backend::knobs`](crate::Backend::knobs) and builds a
//! configured copy of itself with [`Backend::with_knobs`](crate::Backend::with_knobs). Values
//! are strings (`"4"`, `"1M"`, `"true"`); [`Knobs`] has parsers for the common kinds.

use crate::{Error, ErrorKind, Result};
use std::collections::BTreeMap;
use std::fmt;

mod table;

pub use table::{apply, specs, Knob, KnobField};

/// One knob of a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnobSpec {
    /// Name, e.g. `"threads"`, `"chunk"`, `"qd"`.
    pub name: String,
    /// The value the backend uses when the knob is not set.
    pub default: String,
    /// Values worth trying in a sweep (the default among them).
    pub candidates: Vec<String>,
    /// One line saying what the knob does.
    pub help: String,
}

impl KnobSpec {
    /// A knob with these values.
    pub fn new(name: &str, default: &str, candidates: &[&str], help: &str) -> Self {
        KnobSpec {
            name: name.to_string(),
            default: default.to_string(),
            candidates: candidates.iter().map(|s| s.to_string()).collect(),
            help: help.to_string(),
        }
    }
}

/// Knob settings: name to value, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Knobs(pub BTreeMap<String, String>);

impl Knobs {
    /// No settings.
    pub fn new() -> Self {
        Knobs::default()
    }

    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets `name` to `value`.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.0.insert(name.into(), value.into());
        self
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Fails with [`ErrorKind::InvalidInput`] naming the backend and its knobs when a set
    /// name is not among `specs`.
    pub fn check_names(&self, backend: &str, specs: &[KnobSpec]) -> Result<()> {
        for name in self.0.keys() {
            if !specs.iter().any(|s| &s.name == name) {
                let known: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "backend `{backend}` has no knob `{name}`; its knobs: {}",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                )
                .with_backend(backend));
            }
        }
        Ok(())
    }

    /// The value of `name` as a count (`4`; at least 1), if set.
    pub fn count(&self, name: &str) -> Result<Option<usize>> {
        self.parsed(
            name,
            |v| v.parse::<usize>().ok().filter(|&n| n > 0),
            "a count of at least 1, such as 4",
        )
    }

    /// The value of `name` as a byte size (`4096`, `512K`, `4M`, `1G`; at least 1; units as
    /// [`crate::size`] reads them), if set.
    pub fn size(&self, name: &str) -> Result<Option<usize>> {
        self.parsed(
            name,
            |v| {
                let n = crate::size::parse_size(v).ok()?;
                usize::try_from(n).ok().filter(|&n| n > 0)
            },
            "a size of at least 1 byte, such as 512K or 4M",
        )
    }

    /// The value of `name` as a flag (`true`/`false`, `on`/`off`, `1`/`0`), if set.
    pub fn flag(&self, name: &str) -> Result<Option<bool>> {
        self.parsed(name, parse_flag, "true or false")
    }

    fn parsed<T>(
        &self,
        name: &str,
        parse: impl Fn(&str) -> Option<T>,
        expected: &str,
    ) -> Result<Option<T>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => parse(v.trim()).map(Some).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!("knob `{name}`: `{v}` is not {expected}"),
                )
            }),
        }
    }
}

impl fmt::Display for Knobs {
    /// `chunk=4M,threads=2` (empty when nothing is set).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

impl From<BTreeMap<String, String>> for Knobs {
    fn from(map: BTreeMap<String, String>) -> Self {
        Knobs(map)
    }
}

/// `value` as an on/off switch: `true`/`on`/`1`/`yes` or `false`/`off`/`0`/`no`, in any
/// case; `None` for anything else. Every switch of fastensor (knobs and environment
/// variables, in Rust and in Python) is read by this one rule.
pub fn parse_flag(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "on" | "1" | "yes" => Some(true),
        "false" | "off" | "0" | "no" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::{format_size, parse_size};

    #[test]
    fn values_parse_and_names_are_checked() {
        let mut k = Knobs::new();
        k.set("threads", "8")
            .set("chunk", "1M")
            .set("prealloc", "off");
        assert_eq!(k.count("threads").unwrap(), Some(8));
        assert_eq!(k.size("chunk").unwrap(), Some(1 << 20));
        assert_eq!(k.flag("prealloc").unwrap(), Some(false));
        assert_eq!(k.count("missing").unwrap(), None);
        assert!(k.count("chunk").is_err());
        assert_eq!(k.to_string(), "chunk=1M,prealloc=off,threads=8");
        let specs = [KnobSpec::new("threads", "4", &["1", "4"], "threads")];
        let err = k.check_names("x", &specs).unwrap_err();
        assert!(err.to_string().contains("no knob `chunk`"), "{err}");
        assert_eq!(format_size(4 << 20), "4M");
        assert_eq!(format_size(512 << 10), "512K");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(parse_size("2G"), Ok(2 << 30));
    }

    #[test]
    fn zero_threads_or_chunk_is_invalid_input() {
        let mut k = Knobs::new();
        k.set("threads", "0").set("chunk", "0");
        for err in [
            k.count("threads").unwrap_err(),
            k.size("chunk").unwrap_err(),
        ] {
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
            assert!(err.to_string().contains("at least 1"), "{err}");
        }
    }
}
