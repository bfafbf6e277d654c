//! A safetensors file in memory, laid out as the `safetensors` crate lays one out (what its
//! `serialize` returns), byte for byte: the 8-byte little-endian header length, the compact
//! JSON header (`__metadata__` first where given, then the tensors in data order) padded
//! with spaces to a multiple of [`SERIALIZED_ALIGN`], then the tensors' bytes, the widest
//! dtypes first ([`DType`]'s order, descending), then by name.
//!
//! Files saved by [`save`](super::save) differ only in where their data section starts (a
//! multiple of [`DATA_ALIGN`](super::DATA_ALIGN), for direct I/O); both are the same format.

use super::header;
use super::header::validate;
use super::TensorView;
use crate::{Error, ErrorKind, MemRef, Result, TensorDesc};
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::ops::Range;

/// The JSON header of a file in memory is padded to a multiple of this many bytes.
pub const SERIALIZED_ALIGN: usize = 8;

/// Tensors laid out as a safetensors file in memory: its length, and [`write_into`]
/// fills a buffer of that length.
///
/// [`write_into`]: Serialized::write_into
#[derive(Debug)]
pub struct Serialized<'t, 'a> {
    /// The length prefix, the JSON and its padding.
    header: Vec<u8>,
    /// The tensors in data order, each with its range of the data section.
    order: Vec<(&'t TensorView<'a>, Range<u64>)>,
}

/// Lays out `tensors` (host memory) and `metadata` as [`serialize`] does, without copying
/// their bytes yet. A descriptor whose byte length differs from its data's, a duplicate
/// name, the name `__metadata__` or device memory is [`ErrorKind::InvalidInput`].
pub fn serialized<'t, 'a>(
    tensors: &'t [TensorView<'a>],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<Serialized<'t, 'a>> {
    let mut sorted: Vec<&TensorView<'a>> = tensors.iter().collect();
    sorted.sort_by(|a, b| {
        (Reverse(a.desc.dtype), &a.desc.name).cmp(&(Reverse(b.desc.dtype), &b.desc.name))
    });
    let mut order = Vec::with_capacity(sorted.len());
    let mut at = 0u64;
    for t in sorted {
        let name = &t.desc.name;
        validate::tensor_name(name)?;
        let len = t.desc.byte_len()?;
        let data_len = match t.data {
            MemRef::Host(bytes) => bytes.len() as u64,
            MemRef::Device(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("tensor `{name}`: only host memory is serialized in memory"),
                ))
            }
        };
        if len != data_len {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "tensor `{name}`: {} × {:?} is {len} bytes but its data holds {data_len}",
                    t.desc.dtype, t.desc.shape
                ),
            ));
        }
        order.push((t, at..at + len));
        at += len;
    }
    let descs: Vec<&TensorDesc> = order.iter().map(|(t, _)| &t.desc).collect();
    validate::by_name(&descs, |d| &d.name).map_err(|name| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("tensor `{name}` is given twice"),
        )
    })?;
    let mut json = Vec::new();
    header::write_json_with(
        &mut json,
        order.len(),
        |i| (&order[i].0.desc, order[i].1.clone()),
        metadata,
    )
    .map_err(|e| Error::io(e, "cannot encode the header"))?;
    json.resize(
        json.len().div_ceil(SERIALIZED_ALIGN) * SERIALIZED_ALIGN,
        b' ',
    );
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(Serialized { header: out, order })
}

impl Serialized<'_, '_> {
    /// The length of the whole file in bytes.
    pub fn len(&self) -> usize {
        self.header.len() + self.order.last().map_or(0, |(_, r)| r.end as usize)
    }

    /// Whether the file has no bytes (never: the header has at least 8).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the file into `out`, which holds exactly [`len`](Self::len) bytes, else
    /// [`ErrorKind::InvalidInput`].
    pub fn write_into(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.len() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("the file is {} bytes, its buffer {}", self.len(), out.len()),
            ));
        }
        let (head, data) = out.split_at_mut(self.header.len());
        head.copy_from_slice(&self.header);
        for (t, r) in &self.order {
            if let MemRef::Host(bytes) = t.data {
                data[r.start as usize..r.end as usize].copy_from_slice(bytes);
            }
        }
        Ok(())
    }
}

/// The bytes of a safetensors file holding `tensors` (host memory) and `metadata` (written
/// whenever given, even empty), laid out as the `safetensors` crate lays them out (see the
/// module). Errors as [`serialized`].
pub fn serialize(
    tensors: &[TensorView<'_>],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<Vec<u8>> {
    let layout = serialized(tensors, metadata)?;
    let mut out = vec![0; layout.len()];
    layout.write_into(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn widest_dtypes_first_then_by_name_and_the_header_padded_to_eight() {
        let (a, b, c) = ([1u8; 2], [2u8; 8], [3u8; 4]);
        let tensors = [
            TensorView::new(TensorDesc::new("z", DType::U8, vec![2]), &a[..]),
            TensorView::new(TensorDesc::new("y", DType::F64, vec![1]), &b[..]),
            TensorView::new(TensorDesc::new("x", DType::F32, vec![1]), &c[..]),
        ];
        let meta = BTreeMap::from([("k".to_string(), "v".to_string())]);
        let out = serialize(&tensors, Some(&meta)).unwrap();
        let n = u64::from_le_bytes(out[..8].try_into().unwrap()) as usize;
        assert_eq!(n % SERIALIZED_ALIGN, 0);
        let json = std::str::from_utf8(&out[8..8 + n]).unwrap();
        assert_eq!(
            json.trim_end(),
            r#"{"__metadata__":{"k":"v"},"y":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},"x":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"z":{"dtype":"U8","shape":[2],"data_offsets":[12,14]}}"#
        );
        assert_eq!(&out[8 + n..], [&b[..], &c[..], &a[..]].concat());
        let header = super::super::parse_header(&out, out.len() as u64).unwrap();
        assert_eq!(header.entries().len(), 3);
    }

    #[test]
    fn metadata_given_empty_is_written_and_nothing_is_a_small_file() {
        assert_eq!(serialize(&[], None).unwrap(), b"\x08\0\0\0\0\0\0\0{}      ");
        let empty = BTreeMap::new();
        let out = serialize(&[], Some(&empty)).unwrap();
        assert!(std::str::from_utf8(&out[8..])
            .unwrap()
            .starts_with(r#"{"__metadata__":{}}"#));
    }

    #[test]
    fn a_length_that_does_not_match_is_refused() {
        let data = [0u8; 3];
        let t = [TensorView::new(
            TensorDesc::new("t", DType::F32, vec![1]),
            &data[..],
        )];
        assert_eq!(
            serialize(&t, None).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }
}
