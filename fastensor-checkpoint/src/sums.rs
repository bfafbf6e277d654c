//! The checksums a file's header stores ([`CHECKSUMS_KEY`] of its `__metadata__`): their
//! encoding, and their lookup by file range to check reads.

use super::header::{corrupt, Header};
use crate::{Error, ErrorKind, MemMut, Result};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::Path;

/// The `__metadata__` key that holds the checksums (a JSON object: name -> 8 hex digits).
pub const CHECKSUMS_KEY: &str = "fastensor.checksums";

/// The checksum of `bytes`: their CRC-32C.
pub fn checksum(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// The value stored under [`CHECKSUMS_KEY`] for `sums`.
pub fn encode(sums: &BTreeMap<String, u32>) -> String {
    let hex: BTreeMap<&str, String> = sums
        .iter()
        .map(|(k, v)| (k.as_str(), format!("{v:08x}")))
        .collect();
    serde_json::to_string(&hex).expect("a map of strings serializes")
}

/// The error of a non-empty tensor `name` of the file at `path` without a stored checksum.
pub(super) fn missing(name: &str, path: &Path) -> Error {
    corrupt(format!(
        "tensor `{name}` has no checksum in `{CHECKSUMS_KEY}`"
    ))
    .with_path(path)
}

/// Parses the value of [`CHECKSUMS_KEY`].
pub(super) fn decode(value: &str) -> Result<HashMap<String, u32>> {
    let hex: HashMap<String, String> = serde_json::from_str(value)
        .map_err(|e| corrupt(format!("`{CHECKSUMS_KEY}` is not a JSON map of names: {e}")))?;
    hex.into_iter()
        .map(|(name, h)| match u32::from_str_radix(&h, 16) {
            Ok(v) if h.len() == 8 => Ok((name, v)),
            _ => Err(corrupt(format!(
                "`{CHECKSUMS_KEY}`: the checksum of `{name}` is `{h}`, not 8 hex digits"
            ))),
        })
        .collect()
}

/// The checksums a file's header stores, keyed by each tensor's absolute file range, so that
/// a read of a whole tensor finds its expected value.
///
/// Only non-empty tensors have an entry: an empty tensor's range is empty, and its start is
/// the start of the tensor after it (or the end of the data), so a lookup by start alone
/// would find another tensor. Every lookup matches the whole range; an empty range matches
/// nothing (an empty tensor has no bytes to check).
#[derive(Debug, Clone)]
pub struct Checksums {
    /// File start of each non-empty tensor -> (file end, name, expected checksum).
    by_start: HashMap<u64, (u64, String, u32)>,
}

impl Checksums {
    /// The checksums of `header` (read from `path`). A header without [`CHECKSUMS_KEY`] is
    /// [`ErrorKind::InvalidInput`] (nothing to verify against: the file was saved without
    /// checksums); a value that does not parse, or a non-empty tensor without a checksum,
    /// [`ErrorKind::Corrupt`].
    pub fn from_header(header: &Header, path: &Path) -> Result<Checksums> {
        let sums = stored(header.metadata(), path)?;
        let mut by_start = HashMap::with_capacity(header.entries().len());
        for e in header.entries().iter().filter(|e| e.byte_len() > 0) {
            let name = &e.desc.name;
            let &sum = sums.get(name).ok_or_else(|| missing(name, path))?;
            let r = header.file_range(e);
            by_start.insert(r.start, (r.end, name.clone(), sum));
        }
        Ok(Checksums { by_start })
    }

    /// Verifies `bytes`, just read from the file range `range` of `path`, when that range is
    /// a whole tensor (part of one cannot be checked: it passes). A mismatch is
    /// [`ErrorKind::Corrupt`] naming the file and the tensor.
    pub fn check(&self, path: &Path, range: &Range<u64>, bytes: &[u8]) -> Result<()> {
        match self.at(range) {
            Some((name, want)) => {
                let got = checksum(bytes);
                if got == want {
                    return Ok(());
                }
                Err(Self::mismatch(path, name, want, got, range.start))
            }
            None => Ok(()),
        }
    }

    /// [`check`](Self::check) of a read destination: host memory is checked; a whole
    /// tensor read into device memory cannot be, and is [`ErrorKind::Unsupported`].
    pub(crate) fn check_dst(
        &self,
        path: &Path,
        range: &Range<u64>,
        dst: &MemMut<'_>,
    ) -> Result<()> {
        match dst {
            MemMut::Host(bytes) => self.check(path, range, bytes),
            MemMut::Device(_) if self.at(range).is_none() => Ok(()),
            MemMut::Device(_) => Err(Error::new(
                ErrorKind::Unsupported,
                "a verified read goes to host memory (checksums are computed there)",
            )
            .with_path(path)),
        }
    }

    /// The non-empty tensor whose bytes are exactly the file range `range`: its name and
    /// stored checksum; `None` for an empty range or one that is not a whole tensor.
    pub(crate) fn at(&self, range: &Range<u64>) -> Option<(&str, u32)> {
        if range.is_empty() {
            return None;
        }
        match self.by_start.get(&range.start) {
            Some((end, name, sum)) if *end == range.end => Some((name.as_str(), *sum)),
            _ => None,
        }
    }

    /// The error of a tensor whose bytes do not match: names the file and the tensor.
    pub(crate) fn mismatch(path: &Path, name: &str, want: u32, got: u32, at: u64) -> Error {
        corrupt(format!(
            "tensor `{name}`: checksum mismatch (stored {want:08x}, read {got:08x}): \
             its bytes changed since the save"
        ))
        .with_path(path)
        .with_offset(at)
    }

    /// How many tensors have a checksum.
    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    /// True when no tensor has one (a file of empty tensors).
    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

/// The checksums `metadata` (of the file at `path`) stores, by tensor name: none is
/// [`ErrorKind::InvalidInput`] (the file was saved without checksums), a value that does
/// not parse [`ErrorKind::Corrupt`].
pub(super) fn stored(
    metadata: &BTreeMap<String, String>,
    path: &Path,
) -> Result<HashMap<String, u32>> {
    let value = metadata.get(CHECKSUMS_KEY).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidInput,
            format!(
                "no checksums to verify against (no `{CHECKSUMS_KEY}` in the metadata): \
                 the file was saved without checksums"
            ),
        )
        .with_path(path)
    })?;
    decode(value).map_err(|e| e.with_path(path))
}
