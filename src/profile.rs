//! The selection profile on disk: a [`Dictionary`] read from and saved to a file, the
//! selector loaded from it when it applies to this machine, and the machine facts its
//! [`Fingerprint`] records (kernel release, block device models). `fastensor-select` does no
//! I/O; this module is where its dictionary meets the file system.

use crate::{Error, ErrorKind, Result};
use fastensor_select::{Dictionary, Fingerprint, MachineFacts, Selector, SelectorConfig};
use std::fmt;
use std::path::Path;

mod table;
pub use table::Table;

/// Something the caller may want to print: the dictionary could not be used and the selector
/// starts afresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// What happened, naming the file.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// This machine's facts, read from `/proc` and sysfs at each call.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThisMachine;

impl MachineFacts for ThisMachine {
    fn kernel_release(&self) -> String {
        kernel_release()
    }

    fn device_model(&self, device: &str) -> String {
        device_model(device)
    }
}

/// The kernel release (`/proc/sys/kernel/osrelease`), empty when unknown.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The model of block device `major:minor` from sysfs (a partition reports its disk's model);
/// empty when unknown.
pub fn device_model(device: &str) -> String {
    let base = Path::new("/sys/dev/block").join(device);
    for candidate in [base.join("device/model"), base.join("../device/model")] {
        if let Ok(model) = std::fs::read_to_string(&candidate) {
            return model.trim().to_string();
        }
    }
    String::new()
}

/// Reads the dictionary at `path`. A missing file is [`ErrorKind::NotFound`], one that is not
/// a regular file (a FIFO, a device) [`ErrorKind::InvalidInput`]; otherwise the errors of
/// [`Dictionary::parse`] (a file that is not a dictionary is [`ErrorKind::Corrupt`], another
/// format version [`ErrorKind::Unsupported`]), every error naming the file.
pub fn read(path: &Path) -> Result<Dictionary> {
    // A FIFO would block the read; a device is no dictionary.
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file").with_path(path));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(e, "cannot read the dictionary").with_path(path))?;
    Dictionary::parse(&text).map_err(|e| e.with_path(path))
}

/// Writes `dictionary` to `path` atomically and durably ([`crate::atomic::write`]): a crash
/// leaves the old or the new dictionary, never a torn one, and no temporary file; a target
/// that is not a regular file is refused.
pub fn save(dictionary: &Dictionary, path: &Path) -> Result<()> {
    crate::atomic::write(path, dictionary.to_toml().as_bytes())
}

/// A selector with no measurements, fingerprinted as this machine.
pub fn fresh(config: SelectorConfig) -> Selector {
    let mut selector = Selector::new(config);
    selector.set_fingerprint(Fingerprint::of_machine(&ThisMachine));
    selector
}

/// The selector continuing from the profile at `path` if it applies to this machine and this
/// build:
///
/// * no path, or a missing file: a [`fresh`] selector, no warning;
/// * another format version, or measured on another machine (kernel, device model): a fresh
///   selector and a [`Warning`] naming the file and saying why;
/// * not a dictionary, or not a regular file: the error of [`read`], naming the file.
pub fn load(path: Option<&Path>, config: SelectorConfig) -> Result<(Selector, Option<Warning>)> {
    let Some(path) = path else {
        return Ok((fresh(config), None));
    };
    let ignored = |why: String| Warning {
        message: format!(
            "ignoring dictionary {}: {why}; starting afresh",
            path.display()
        ),
    };
    let dict = match read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok((fresh(config), None)),
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            return Ok((fresh(config), Some(ignored(e.message().to_string()))));
        }
        Err(e) => return Err(e),
    };
    if let Some(diff) = other_machine(&dict) {
        let warning = ignored(format!("measured on another machine ({diff})"));
        return Ok((fresh(config), Some(warning)));
    }
    let selector = Selector::from_dictionary(&dict, config).map_err(|e| e.with_path(path))?;
    Ok((selector, None))
}

/// How the machine `dictionary` was measured on differs from this one (kernel, the model of
/// a device it names); `None` when it is this one.
pub fn other_machine(dictionary: &Dictionary) -> Option<String> {
    let fingerprint = &dictionary.fingerprint;
    fingerprint.mismatch(&fingerprint.current(&ThisMachine))
}

#[cfg(test)]
mod tests;
