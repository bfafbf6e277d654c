//! The safetensors header: parsing (hostile input welcome) and writing (padded so that the
//! data section starts on a [`DATA_ALIGN`] boundary).

use super::validate;
use crate::{DType, Error, ErrorKind, Result, TensorDesc};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;

/// The largest header accepted, in bytes (the limit the `safetensors` crate uses too).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Where our writer starts the data section: a multiple of this many bytes, so that direct
/// I/O moves the data with no copy.
pub const DATA_ALIGN: u64 = 4096;

/// The key of the optional string-to-string metadata map in a header.
pub const METADATA_KEY: &str = "__metadata__";

/// One tensor as a header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderEntry {
    /// Name, dtype and shape.
    pub desc: TensorDesc,
    /// Byte range of the data, relative to the start of the data section.
    pub offsets: Range<u64>,
}

impl HeaderEntry {
    /// Length of the tensor's data in bytes.
    pub fn byte_len(&self) -> u64 {
        self.offsets.end - self.offsets.start
    }
}

/// A parsed and validated safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    header_len: u64,
    file_len: u64,
    entries: Vec<HeaderEntry>,
    by_name: HashMap<String, usize>,
    metadata: BTreeMap<String, String>,
}

impl Header {
    /// Length of the JSON header in bytes (the number the file's first 8 bytes hold).
    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// File offset of the data section: `8 + header_len`.
    pub fn data_start(&self) -> u64 {
        8 + self.header_len
    }

    /// Length of the data section in bytes.
    pub fn data_len(&self) -> u64 {
        self.file_len - self.data_start()
    }

    /// Length of the whole file.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// True when the data section starts on a [`DATA_ALIGN`] boundary (files we write).
    pub fn is_aligned(&self) -> bool {
        self.data_start() % DATA_ALIGN == 0
    }

    /// The tensors, in the order of their data in the file.
    pub fn entries(&self) -> &[HeaderEntry] {
        &self.entries
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&HeaderEntry> {
        self.by_name.get(name).map(|&i| &self.entries[i])
    }

    /// Index in [`entries`](Self::entries) of the tensor called `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The `__metadata__` map (empty when the file has none).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Absolute file range of a tensor's data.
    pub fn file_range(&self, entry: &HeaderEntry) -> Range<u64> {
        self.data_start() + entry.offsets.start..self.data_start() + entry.offsets.end
    }
}

fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

/// Checks the 8-byte header length of a file of `file_len` bytes: at most
/// [`MAX_HEADER_LEN`] and within the file. Done before anything is allocated for it.
pub(crate) fn check_header_len(header_len: u64, file_len: u64) -> Result<()> {
    if header_len > MAX_HEADER_LEN {
        return Err(corrupt(format!(
            "header length {header_len} exceeds the limit of {MAX_HEADER_LEN} bytes"
        )));
    }
    match header_len.checked_add(8) {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(corrupt(format!(
            "header length {header_len} runs past the end of the file ({file_len} bytes): truncated?"
        ))),
    }
}

/// Reads the little-endian header length from a file's first 8 bytes.
pub(crate) fn header_len_of(prefix: &[u8]) -> Result<u64> {
    let bytes: [u8; 8] = prefix
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            corrupt(format!(
                "file too short for a safetensors header ({} bytes, needs at least 8)",
                prefix.len()
            ))
        })?;
    Ok(u64::from_le_bytes(bytes))
}

/// Parses and validates the header of a safetensors file.
///
/// `bytes` is the start of the file: the 8-byte length and at least the JSON header after it
/// (more is ignored); `file_len` is the whole file's length, against which the header length
/// and every data offset are checked. Any defect — header length out of bounds, bad JSON,
/// unknown dtype, a byte length that does not match dtype × shape, overlapping, out-of-order
/// or missing data, a truncated file — is an [`ErrorKind::Corrupt`] error naming the tensor.
/// Never panics, and allocates at most a small multiple of the header's length.
pub fn parse_header(bytes: &[u8], file_len: u64) -> Result<Header> {
    let header_len = header_len_of(bytes)?;
    check_header_len(header_len, file_len)?;
    // header_len <= MAX_HEADER_LEN, so it fits usize.
    let end = 8 + header_len as usize;
    let json = bytes.get(8..end).ok_or_else(|| {
        corrupt(format!(
            "header of {header_len} bytes announced, only {} available",
            bytes.len().saturating_sub(8)
        ))
    })?;
    let raw = parse_json(json)?;
    let data_len = file_len - 8 - header_len;
    let entries = validate::entries(raw.tensors, data_len)?;
    let by_name = entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.desc.name.clone(), i))
        .collect();
    Ok(Header {
        header_len,
        file_len,
        entries,
        by_name,
        metadata: raw.metadata,
    })
}

/// A tensor entry as the JSON holds it, before validation.
#[derive(Debug)]
pub(crate) struct RawEntry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub offsets: [u64; 2],
}

#[derive(Debug, Default)]
struct RawHeader {
    tensors: Vec<RawEntry>,
    metadata: BTreeMap<String, String>,
}

fn parse_json(json: &[u8]) -> Result<RawHeader> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let raw = RawHeaderSeed
        .deserialize(&mut de)
        .and_then(|raw| de.end().map(|()| raw))
        .map_err(|e| corrupt(format!("invalid JSON header: {e}")))?;
    Ok(raw)
}

struct RawHeaderSeed;

impl<'de> DeserializeSeed<'de> for RawHeaderSeed {
    type Value = RawHeader;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<RawHeader, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RawHeaderSeed {
    type Value = RawHeader;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map from tensor names to {dtype, shape, data_offsets}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<RawHeader, A::Error> {
        let mut out = RawHeader::default();
        let mut seen_metadata = false;
        while let Some(name) = map.next_key::<String>()? {
            if name == METADATA_KEY {
                if seen_metadata {
                    return Err(de::Error::custom("`__metadata__` appears twice"));
                }
                seen_metadata = true;
                let m: Option<BTreeMap<String, String>> = map.next_value().map_err(|e| {
                    de::Error::custom(format!("`__metadata__` must map strings to strings: {e}"))
                })?;
                out.metadata = m.unwrap_or_default();
                continue;
            }
            let info: TensorInfo = map
                .next_value()
                .map_err(|e| de::Error::custom(format!("tensor `{name}`: {e}")))?;
            let dtype = info
                .dtype
                .parse::<DType>()
                .map_err(|e| de::Error::custom(format!("tensor `{name}`: {}", e.message())))?;
            out.tensors.push(RawEntry {
                name,
                dtype,
                shape: info.shape,
                offsets: info.data_offsets,
            });
        }
        Ok(out)
    }
}

#[derive(Deserialize)]
struct TensorInfo {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Encodes a header for tensors laid out in `entries` (relative offsets) with `metadata`:
/// the 8-byte length, the JSON, and spaces so that the data section starts at a multiple of
/// [`DATA_ALIGN`]. Returns the bytes before the data section.
pub(crate) fn encode(entries: &[HeaderEntry], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    let mut json = String::with_capacity(64 + entries.len() * 96);
    json.push('{');
    let mut first = true;
    let mut sep = |json: &mut String| {
        if !first {
            json.push(',');
        }
        first = false;
    };
    if !metadata.is_empty() {
        sep(&mut json);
        json.push_str(&quote(METADATA_KEY));
        json.push(':');
        json.push_str(&serde_json::to_string(metadata).expect("a string map always serializes"));
    }
    for e in entries {
        sep(&mut json);
        let shape: Vec<String> = e.desc.shape.iter().map(u64::to_string).collect();
        json.push_str(&format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            quote(&e.desc.name),
            e.desc.dtype.name(),
            shape.join(","),
            e.offsets.start,
            e.offsets.end
        ));
    }
    json.push('}');
    let total = (8 + json.len() as u64).div_ceil(DATA_ALIGN) * DATA_ALIGN;
    let header_len = total - 8;
    let mut out = Vec::with_capacity(total as usize);
    out.extend_from_slice(&header_len.to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    out.resize(total as usize, b' ');
    out
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}
