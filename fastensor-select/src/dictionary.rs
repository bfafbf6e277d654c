//! The dictionary: what the selector learned, saved as TOML and loaded on the next run.

use crate::key::cache_str;
use crate::{
    CandidateState, ContextKey, Fingerprint, KeyState, Objective, Phase, Sample, Samples, Selector,
    SelectorConfig, Status,
};
use fastensor_core::{CacheState, Direction, Error, ErrorKind, MemoryKind, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// The saved form of a [`Selector`]: format version, machine fingerprint, and per context the
/// candidates' samples and the choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dictionary {
    /// Format version ([`FORMAT_VERSION`]).
    pub version: u32,
    /// The objective the choices were made for (`time`, `cpu`, `weighted:T,C`).
    pub objective: String,
    /// The machine the measurements belong to.
    pub fingerprint: Fingerprint,
    /// One entry per context.
    #[serde(default, rename = "context")]
    pub contexts: Vec<ContextRecord>,
    /// Tuned knob settings per backend (`[knobs.posix-direct] threads = "2"`), applied by the
    /// engine when it loads the dictionary. Absent in older files.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub knobs: BTreeMap<String, BTreeMap<String, String>>,
}

/// One context of a [`Dictionary`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextRecord {
    /// `read` or `write`.
    pub direction: String,
    /// `host` or `device:N`.
    pub memory: String,
    /// Size class: transfers of `2^size_class` bytes up to twice that.
    pub size_class: u8,
    /// In-flight class (see [`ContextKey::in_flight`]).
    pub in_flight: u8,
    /// File system type.
    #[serde(default)]
    pub fs_type: String,
    /// Block device `major:minor`.
    #[serde(default)]
    pub device: String,
    /// `cached`, `cold` or `unknown`.
    pub cache: String,
    /// A durable write's context (see [`ContextKey::durable`]); absent means false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub durable: bool,
    /// The chosen backend, absent while exploring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<String>,
    /// Times drift restarted the exploration.
    #[serde(default)]
    pub reexplorations: u32,
    /// The candidates.
    #[serde(default, rename = "candidate")]
    pub candidates: Vec<CandidateRecord>,
}

/// One candidate of a [`ContextRecord`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateRecord {
    /// Backend name.
    pub name: String,
    /// Dropped from exploration.
    #[serde(default)]
    pub eliminated: bool,
    /// Wall-clock nanoseconds per byte of the recent samples, oldest first.
    #[serde(default)]
    pub time_ns_per_byte: Vec<f64>,
    /// CPU nanoseconds per byte of the same samples.
    #[serde(default)]
    pub cpu_ns_per_byte: Vec<f64>,
    /// For a candidate ruled out without samples by the other size classes: the cost per
    /// byte they predicted (in the objective's units), which decides whether it gets a second
    /// look (see the selector's re-look schedule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prior: Option<f64>,
}

fn corrupt(what: impl fmt::Display) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        format!("not a valid fastensor dictionary: {what}"),
    )
}

impl Dictionary {
    /// Parses the TOML text of a dictionary. Text that is not a dictionary is
    /// [`ErrorKind::Corrupt`] (so is one with an unknown objective, a sample that is NaN,
    /// infinite or negative, or a context given twice); a dictionary of another format
    /// version is [`ErrorKind::Unsupported`]. The errors name no file: reading one by path
    /// (and saving) is the `fastensor` facade's `profile` module.
    pub fn parse(text: &str) -> Result<Dictionary> {
        let table: toml::Table = toml::from_str(text).map_err(corrupt)?;
        let version = match table.get("version") {
            Some(toml::Value::Integer(v)) => *v,
            _ => return Err(corrupt("no integer `version`")),
        };
        if version != i64::from(FORMAT_VERSION) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "dictionary format version {version}; this build reads version {FORMAT_VERSION}"
                ),
            ));
        }
        let dict: Dictionary = table.try_into().map_err(corrupt)?;
        dict.objective
            .parse::<Objective>()
            .map_err(|e| corrupt(format!("objective: {}", e.message())))?;
        let mut keys = std::collections::BTreeSet::new();
        for c in &dict.contexts {
            let key = c.key().map_err(corrupt)?;
            for cand in &c.candidates {
                if cand.time_ns_per_byte.len() != cand.cpu_ns_per_byte.len() {
                    return Err(corrupt(format!(
                        "candidate `{}` has unpaired samples",
                        cand.name
                    )));
                }
                let samples = cand.time_ns_per_byte.iter().chain(&cand.cpu_ns_per_byte);
                if let Some(bad) = samples
                    .chain(&cand.prior)
                    .find(|v| !v.is_finite() || **v < 0.0)
                {
                    return Err(corrupt(format!(
                        "candidate `{}` has a sample of {bad} (costs are finite, not negative)",
                        cand.name
                    )));
                }
            }
            if !keys.insert(key) {
                return Err(corrupt(format!(
                    "the context {} {} size class {} cache {} appears twice",
                    c.direction, c.memory, c.size_class, c.cache
                )));
            }
        }
        Ok(dict)
    }

    /// The TOML text ([`Dictionary::parse`] reads it back to an equal dictionary).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a dictionary always serialises")
    }

    /// The objective the dictionary was made for (`Time` when unreadable).
    pub fn objective(&self) -> Objective {
        self.objective.parse().unwrap_or_default()
    }
}

impl ContextRecord {
    /// The context key (an error message when a field is not understood).
    pub fn key(&self) -> std::result::Result<ContextKey, String> {
        let direction = match self.direction.as_str() {
            "read" => Direction::Read,
            "write" => Direction::Write,
            other => return Err(format!("unknown direction `{other}`")),
        };
        let memory = match self.memory.as_str() {
            "host" => MemoryKind::Host,
            other => other
                .strip_prefix("device:")
                .and_then(|n| n.parse().ok())
                .map(|ordinal| MemoryKind::Device { ordinal })
                .ok_or_else(|| format!("unknown memory kind `{other}`"))?,
        };
        let cache = match self.cache.as_str() {
            "cached" => CacheState::Cached,
            "cold" => CacheState::Cold,
            "unknown" | "-" => CacheState::Unknown,
            other => return Err(format!("unknown cache state `{other}`")),
        };
        if self.size_class > 63 || self.in_flight > ContextKey::MAX_IN_FLIGHT_CLASS {
            return Err(format!(
                "size class {} or in-flight class {} out of range",
                self.size_class, self.in_flight
            ));
        }
        Ok(ContextKey {
            direction,
            memory,
            size_class: self.size_class,
            in_flight: self.in_flight,
            fs_type: self.fs_type.clone(),
            device: self.device.clone(),
            cache,
            durable: self.durable && direction == Direction::Write,
        })
    }

    fn from_state(key: &ContextKey, state: &KeyState) -> Self {
        ContextRecord {
            direction: key.direction.to_string(),
            memory: key.memory.to_string(),
            size_class: key.size_class,
            in_flight: key.in_flight,
            fs_type: key.fs_type.clone(),
            device: key.device.clone(),
            cache: match key.cache {
                CacheState::Unknown => "unknown",
                other => cache_str(other),
            }
            .into(),
            durable: key.durable,
            choice: state.choice().map(str::to_owned),
            reexplorations: state.reexplorations,
            candidates: state
                .candidates
                .iter()
                .map(|(name, c)| {
                    let samples = c.samples.as_slice().iter();
                    let (time_ns_per_byte, cpu_ns_per_byte) = samples
                        .map(|s| (s.time_ns_per_byte, s.cpu_ns_per_byte))
                        .unzip();
                    CandidateRecord {
                        name: name.clone(),
                        eliminated: c.is_dropped(),
                        prior: c.status.prior().filter(|_| c.samples.is_empty()),
                        time_ns_per_byte,
                        cpu_ns_per_byte,
                    }
                })
                .collect(),
        }
    }

    /// What the selector knows of this context: its candidates' samples and statuses, and
    /// its phase (exploiting the saved choice, or exploring).
    pub fn state(&self) -> KeyState {
        KeyState {
            candidates: self
                .candidates
                .iter()
                .map(|c| {
                    let samples: Vec<Sample> = c
                        .time_ns_per_byte
                        .iter()
                        .zip(&c.cpu_ns_per_byte)
                        .map(|(t, p)| Sample {
                            time_ns_per_byte: *t,
                            cpu_ns_per_byte: *p,
                        })
                        .collect();
                    (
                        c.name.clone(),
                        CandidateState {
                            status: status_of(&samples, c),
                            samples: Samples::from_vec(samples),
                        },
                    )
                })
                .collect(),
            phase: match &self.choice {
                Some(choice) => Phase::Exploiting {
                    choice: choice.clone(),
                    since: 0,
                    slow: Samples::default(),
                },
                None => Phase::Exploring,
            },
            reexplorations: self.reexplorations,
            ..KeyState::default()
        }
    }
}

/// A loaded candidate's status: without samples, a prior is a seed from the other size
/// classes (revised while exploring); dropped with samples, dropped here.
fn status_of(samples: &[Sample], c: &CandidateRecord) -> Status {
    match (samples.is_empty(), c.eliminated, c.prior) {
        (true, true, Some(prior)) => Status::RuledOut { prior },
        (true, false, Some(prior)) => Status::Unmeasured {
            prior,
            seeded: true,
        },
        (_, true, _) => Status::Dropped { prior: None },
        (_, false, _) => Status::Alive,
    }
}

impl Selector {
    /// The dictionary of what the selector learned.
    pub fn dictionary(&self) -> Dictionary {
        Dictionary {
            version: FORMAT_VERSION,
            objective: self.config().objective.to_string(),
            fingerprint: self.fingerprint().clone(),
            contexts: self
                .keys()
                .iter()
                .map(|(k, s)| ContextRecord::from_state(k, s))
                .collect(),
            knobs: self.knobs().clone(),
        }
    }

    /// A selector continuing from `dictionary` (whose machine is not checked).
    pub fn from_dictionary(dictionary: &Dictionary, config: SelectorConfig) -> Result<Selector> {
        let mut keys = BTreeMap::new();
        for c in &dictionary.contexts {
            let key = c.key().map_err(corrupt)?;
            keys.insert(key, c.state());
        }
        let mut selector =
            Selector::from_parts(config.clone(), keys, dictionary.fingerprint.clone());
        selector.set_knobs(dictionary.knobs.clone());
        // The saved choices were made for the saved objective; settle them for this one.
        selector.set_objective(config.objective);
        Ok(selector)
    }
}
