//! The safetensors header: parsing (hostile input welcome) and writing (padded so that the
//! data section starts on a [`DATA_ALIGN`] boundary).

mod read;
pub(crate) mod validate;

pub(crate) use read::{read_header, read_header_with};

use crate::{DType, Error, ErrorKind, Result, TensorDesc};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
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
    /// Indices into `entries`, sorted by name (a lookup table with no copy of the names).
    by_name: Vec<u32>,
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
        self.data_start().is_multiple_of(DATA_ALIGN)
    }

    /// The tensors, in the order of their data in the file.
    pub fn entries(&self) -> &[HeaderEntry] {
        &self.entries
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&HeaderEntry> {
        self.position(name).map(|i| &self.entries[i])
    }

    /// Index in [`entries`](Self::entries) of the tensor called `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        lookup(&self.by_name, name, |i| &self.entries[i].desc.name)
    }

    /// The tensors, in file order, and the `__metadata__` map, taken out of the header.
    pub fn into_parts(self) -> (Vec<HeaderEntry>, BTreeMap<String, String>) {
        (self.entries, self.metadata)
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

/// Headers up to this long are read whole and parsed in place (faster); longer ones are
/// parsed as they are read, so that their JSON is never held in memory whole.
pub(crate) const PARSE_WHOLE_MAX: u64 = 8 << 20;

/// The most dimensions a tensor's shape may have (PyTorch allows 64 too).
pub const MAX_RANK: usize = 64;

/// The position (in the items `name_of` names) of `name`, found in `order` (indices sorted
/// by name).
pub(crate) fn lookup<'a>(
    order: &[u32],
    name: &str,
    name_of: impl Fn(usize) -> &'a String,
) -> Option<usize> {
    order
        .binary_search_by(|&i| name_of(i as usize).as_str().cmp(name))
        .ok()
        .map(|k| order[k] as usize)
}

/// An [`ErrorKind::Corrupt`] error: a file's content is not what its format promises.
pub(crate) fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

/// Checks the 8-byte header length of a file of `file_len` bytes: at most
/// [`MAX_HEADER_LEN`] and within the file. Done before anything is allocated for it.
pub(crate) fn check_header_len(header_len: u64, file_len: u64) -> Result<()> {
    if header_len > MAX_HEADER_LEN {
        return Err(corrupt(format!(
            "header length {header_len} is beyond the limit of {MAX_HEADER_LEN} bytes"
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
/// unknown dtype, a shape of more than [`MAX_RANK`] dimensions, a byte length that does not
/// match dtype × shape, overlapping, out-of-order or missing data, a truncated file — is an
/// [`ErrorKind::Corrupt`] error naming the tensor. Never panics. The parsed header holds at
/// most about 3.5 times the JSON's length (a tensor of 64 dimensions, each `1,`, keeps 8
/// bytes per dimension), with no intermediate tree.
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
    let mut de = serde_json::Deserializer::from_slice(json);
    let raw = parse_json(&mut de)?;
    finish(raw, header_len, file_len)
}

/// Parses the JSON header of `header_len` bytes that `reader` yields (the bytes after the
/// 8-byte length), as [`parse_header`] does, without holding the JSON in memory. An error of
/// the reader is returned as it is.
pub(crate) fn parse_header_from(
    reader: impl std::io::Read,
    header_len: u64,
    file_len: u64,
) -> Result<Header> {
    check_header_len(header_len, file_len)?;
    let mut failed = None;
    let raw = {
        let reader = KeepError {
            inner: std::io::Read::take(reader, header_len),
            error: &mut failed,
        };
        // The parser reads a byte at a time: through a buffer.
        let reader = std::io::BufReader::with_capacity(64 << 10, reader);
        let mut de = serde_json::Deserializer::from_reader(reader);
        parse_json(&mut de)
    };
    if let Some(e) = failed {
        return Err(e);
    }
    finish(raw?, header_len, file_len)
}

/// A reader that keeps the first error of the one it wraps, so that a failed read is not
/// reported as bad JSON.
struct KeepError<'a, R> {
    inner: R,
    error: &'a mut Option<Error>,
}

impl<R: std::io::Read> std::io::Read for KeepError<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            if self.error.is_none() {
                *self.error = Some(Error::io(
                    std::io::Error::new(e.kind(), e.to_string()),
                    "cannot read the header",
                ));
            }
        })
    }
}

fn finish(raw: RawHeader, header_len: u64, file_len: u64) -> Result<Header> {
    let data_len = file_len - 8 - header_len;
    let (entries, by_name) = validate::entries(raw.tensors, data_len)?;
    Ok(Header {
        header_len,
        file_len,
        entries,
        by_name,
        metadata: raw.metadata,
    })
}

#[derive(Debug, Default)]
struct RawHeader {
    /// Offsets as the JSON gives them (validated later).
    tensors: Vec<HeaderEntry>,
    metadata: BTreeMap<String, String>,
}

fn parse_json<'de, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
) -> Result<RawHeader> {
    let raw = RawHeaderSeed
        .deserialize(&mut *de)
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
            let [start, end] = info.data_offsets;
            out.tensors.push(HeaderEntry {
                desc: TensorDesc::new(name, dtype, info.shape.0),
                offsets: start..end,
            });
        }
        // Large vectors shrink in place (`mremap`), without a copy.
        out.tensors.shrink_to_fit();
        Ok(out)
    }
}

#[derive(Deserialize)]
struct TensorInfo {
    dtype: String,
    shape: Shape,
    data_offsets: [u64; 2],
}

/// A shape of at most [`MAX_RANK`] dimensions, held in a vector of exactly its length.
struct Shape(Vec<u64>);

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Shape, D::Error> {
        struct ShapeVisitor;
        impl<'de> Visitor<'de> for ShapeVisitor {
            type Value = Shape;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of at most {MAX_RANK} dimensions")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Shape, A::Error> {
                let mut dims = [0u64; MAX_RANK];
                let mut n = 0;
                while let Some(d) = seq.next_element::<u64>()? {
                    if n == MAX_RANK {
                        return Err(de::Error::custom(format!(
                            "the shape has more than {MAX_RANK} dimensions"
                        )));
                    }
                    dims[n] = d;
                    n += 1;
                }
                Ok(Shape(dims[..n].to_vec()))
            }
        }
        d.deserialize_seq(ShapeVisitor)
    }
}

/// Writes the JSON of a header: `metadata` (where not empty), then each tensor `tensor(i)`
/// gives for `i` in `0..count` (descriptor and offsets relative to the data section), with
/// no padding.
pub(crate) fn write_json<'a, W: std::io::Write>(
    out: &mut W,
    count: usize,
    tensor: impl Fn(usize) -> (&'a TensorDesc, Range<u64>),
    metadata: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    write_json_with(out, count, tensor, Some(metadata).filter(|m| !m.is_empty()))
}

/// [`write_json`] with `metadata` written whenever it is given, empty or not (as the
/// `safetensors` crate writes a map it is given).
pub(crate) fn write_json_with<'a, W: std::io::Write>(
    out: &mut W,
    count: usize,
    tensor: impl Fn(usize) -> (&'a TensorDesc, Range<u64>),
    metadata: Option<&BTreeMap<String, String>>,
) -> std::io::Result<()> {
    out.write_all(b"{")?;
    let mut first = true;
    if let Some(metadata) = metadata {
        first = false;
        serde_json::to_writer(&mut *out, METADATA_KEY)?;
        out.write_all(b":")?;
        serde_json::to_writer(&mut *out, metadata)?;
    }
    for i in 0..count {
        if !first {
            out.write_all(b",")?;
        }
        first = false;
        let (desc, offsets) = tensor(i);
        serde_json::to_writer(&mut *out, &desc.name)?;
        write!(out, ":{{\"dtype\":\"{}\",\"shape\":[", desc.dtype.name())?;
        for (k, d) in desc.shape.iter().enumerate() {
            if k > 0 {
                out.write_all(b",")?;
            }
            write!(out, "{d}")?;
        }
        write!(
            out,
            "],\"data_offsets\":[{},{}]}}",
            offsets.start, offsets.end
        )?;
    }
    out.write_all(b"}")
}

/// The length of the bytes before the data section for a JSON of `json_len` bytes: the
/// 8-byte length, the JSON and the spaces up to the next multiple of [`DATA_ALIGN`].
pub(crate) fn padded_len(json_len: u64) -> u64 {
    (8 + json_len).div_ceil(DATA_ALIGN) * DATA_ALIGN
}

/// Counts the bytes written to it.
#[derive(Default)]
pub(crate) struct Counter(pub u64);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str) -> Vec<u8> {
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(json.as_bytes());
        out
    }

    #[test]
    fn parsing_as_read_gives_what_parsing_in_place_gives() {
        let json = r#"{"__metadata__":{"k":"v"},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
        let mut bytes = file(json);
        bytes.extend_from_slice(&[0u8; 12]);
        let len = bytes.len() as u64;
        let whole = parse_header(&bytes, len).unwrap();
        let read = parse_header_from(&bytes[8..], json.len() as u64, len).unwrap();
        assert_eq!(whole, read);
        assert_eq!(read.position("a"), Some(0));
        assert_eq!(read.get("b").unwrap().offsets, 4..12);
        assert_eq!(read.get("c"), None);
        // A reader that ends early is a truncated header, not a panic.
        let short = parse_header_from(&bytes[8..20], json.len() as u64, len).unwrap_err();
        assert_eq!(short.kind(), ErrorKind::Corrupt);
    }

    #[test]
    fn shapes_hold_at_most_max_rank_dimensions() {
        let shape = |n: usize| vec!["1"; n].join(",");
        for (n, ok) in [(MAX_RANK, true), (MAX_RANK + 1, false)] {
            let json = format!(
                r#"{{"t":{{"dtype":"U8","shape":[{}],"data_offsets":[0,1]}}}}"#,
                shape(n)
            );
            let mut bytes = file(&json);
            bytes.push(0);
            let got = parse_header(&bytes, bytes.len() as u64);
            assert_eq!(got.is_ok(), ok, "{n} dims: {got:?}");
            if let Err(e) = got {
                assert!(e.to_string().contains("more than 64 dimensions"), "{e}");
            }
        }
    }

    #[test]
    fn a_duplicate_name_is_corrupt() {
        let json = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        let mut bytes = file(json);
        bytes.extend_from_slice(&[0u8; 2]);
        let e = parse_header(&bytes, bytes.len() as u64).unwrap_err();
        assert!(e.to_string().contains("appears twice"), "{e}");
    }
}
