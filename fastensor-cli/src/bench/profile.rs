//! `--write-profile`: the best knob settings of a sweep, stored in a selection profile.

use fastensor::select::{Dictionary, Fingerprint, FORMAT_VERSION};
use fastensor::{ErrorKind, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Sets `best` as the knobs of its backends in the profile at `path` (created when missing;
/// other backends' knobs and the learned contexts are kept).
pub fn write(path: &Path, best: &BTreeMap<String, BTreeMap<String, String>>) -> Result<()> {
    let mut dict = match fastensor::profile::read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == ErrorKind::NotFound => Dictionary {
            version: FORMAT_VERSION,
            objective: "time".to_string(),
            fingerprint: Fingerprint::of_machine(&fastensor::profile::ThisMachine),
            contexts: Vec::new(),
            knobs: BTreeMap::new(),
        },
        Err(e) => return Err(e),
    };
    for (backend, knobs) in best {
        dict.knobs.insert(backend.clone(), knobs.clone());
    }
    crate::tune::save_profile(&dict, path)
}
