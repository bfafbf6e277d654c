//! What is measured: backends at their default settings or at knob settings from `--knobs`
//! or `--sweep-knobs`, and the `raw` reference loop.

use fastensor::core::{KnobSpec, Knobs, SharedBackend};
use fastensor::{Error, ErrorKind, Result};
use std::collections::BTreeMap;

/// The name of the reference row.
pub const RAW: &str = "raw";

/// A measured path: a backend (maybe with knob settings), or the raw reference loop.
#[derive(Clone)]
pub struct Subject {
    /// The backend; `None` for `raw`.
    pub backend: Option<SharedBackend>,
    /// Knob settings applied (empty: the backend's defaults).
    pub knobs: Knobs,
}

impl Subject {
    /// The raw reference.
    pub fn raw() -> Self {
        Subject {
            backend: None,
            knobs: Knobs::new(),
        }
    }

    /// The backend's (or `raw`'s) name.
    pub fn name(&self) -> &str {
        self.backend.as_ref().map_or(RAW, |b| b.name())
    }

    /// `posix-direct`, or `posix-direct[chunk=1M,threads=2]` with knobs.
    pub fn label(&self) -> String {
        label(self.name(), &self.knobs)
    }

    /// True when it can write.
    pub fn writes(&self) -> bool {
        self.backend.as_ref().is_none_or(|b| b.capabilities().write)
    }
}

/// `name` or `name[k=v,...]`.
pub fn label(name: &str, knobs: &Knobs) -> String {
    if knobs.is_empty() {
        name.to_string()
    } else {
        format!("{name}[{knobs}]")
    }
}

/// Knob values to sweep per backend: backend -> knob -> values.
pub type KnobGrid = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// Parses `--knobs` values: `posix-direct:threads=1,2,4,8;chunk=1M,4M` (repeat the flag for
/// other backends).
pub fn parse_knob_args(args: &[String]) -> Result<KnobGrid> {
    let bad = |a: &str, why: &str| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("--knobs `{a}`: {why} (example: posix-direct:threads=1,2,4;chunk=1M,4M)"),
        )
    };
    let mut grid = KnobGrid::new();
    for a in args {
        let (backend, rest) = a
            .split_once(':')
            .ok_or_else(|| bad(a, "no `backend:` prefix"))?;
        let entry = grid.entry(backend.trim().to_string()).or_default();
        for part in rest.split(';').filter(|p| !p.trim().is_empty()) {
            let (name, values) = part
                .split_once('=')
                .ok_or_else(|| bad(a, "a knob needs `name=value,...`"))?;
            let values: Vec<String> = values
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            if values.is_empty() {
                return Err(bad(a, "a knob needs at least one value"));
            }
            entry.insert(name.trim().to_string(), values);
        }
    }
    Ok(grid)
}

/// The grid of `--sweep-knobs` for one backend: every knob with more than one candidate.
pub fn candidate_grid(specs: &[KnobSpec]) -> BTreeMap<String, Vec<String>> {
    specs
        .iter()
        .filter(|s| s.candidates.len() > 1)
        .map(|s| (s.name.clone(), s.candidates.clone()))
        .collect()
}

/// Every combination of the grid's values (one empty setting for an empty grid).
pub fn combinations(grid: &BTreeMap<String, Vec<String>>) -> Vec<Knobs> {
    let mut out = vec![Knobs::new()];
    for (name, values) in grid {
        out = out
            .into_iter()
            .flat_map(|k| {
                values.iter().map(move |v| {
                    let mut k = k.clone();
                    k.set(name.clone(), v.clone());
                    k
                })
            })
            .collect();
    }
    out
}

/// The subjects of one backend: its defaults without a grid, else one per combination.
pub fn expand(
    backend: &SharedBackend,
    grid: Option<&BTreeMap<String, Vec<String>>>,
) -> Result<Vec<Subject>> {
    let Some(grid) = grid.filter(|g| !g.is_empty()) else {
        return Ok(vec![Subject {
            backend: Some(backend.clone()),
            knobs: Knobs::new(),
        }]);
    };
    combinations(grid)
        .into_iter()
        .map(|knobs| {
            let tuned = backend.with_knobs(&knobs)?;
            Ok(Subject {
                backend: Some(tuned),
                knobs,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knob_args_parse_and_combine() {
        let g = parse_knob_args(&["posix-direct:threads=1,2,4;chunk=1M,4M".to_string()]).unwrap();
        let pd = &g["posix-direct"];
        assert_eq!(pd["threads"], ["1", "2", "4"]);
        let all = combinations(pd);
        assert_eq!(all.len(), 6);
        assert_eq!(
            label("posix-direct", &all[0]),
            "posix-direct[chunk=1M,threads=1]"
        );
        assert!(parse_knob_args(&["threads=1".to_string()]).is_err());
        assert!(parse_knob_args(&["x:threads".to_string()]).is_err());
        assert_eq!(combinations(&BTreeMap::new()), vec![Knobs::new()]);
    }
}
