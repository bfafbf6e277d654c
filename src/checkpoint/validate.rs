//! Checks of a header's tensor table against the file: lengths, order, overlaps and gaps.

use super::header::{HeaderEntry, RawEntry, METADATA_KEY};
use crate::{Error, ErrorKind, Result, TensorDesc};
use std::collections::HashSet;

fn corrupt(msg: String) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

/// Validates raw entries against a data section of `data_len` bytes and returns them sorted
/// by offset. The data must be covered exactly: no overlap, no gap, nothing after the last
/// tensor, and each tensor's byte length must be dtype size × number of elements.
pub(crate) fn entries(raw: Vec<RawEntry>, data_len: u64) -> Result<Vec<HeaderEntry>> {
    let mut names = HashSet::with_capacity(raw.len());
    let mut out = Vec::with_capacity(raw.len());
    for r in raw {
        if !names.insert(r.name.clone()) {
            return Err(corrupt(format!(
                "tensor `{}` appears twice in the header",
                r.name
            )));
        }
        let [start, end] = r.offsets;
        let desc = TensorDesc::new(r.name, r.dtype, r.shape);
        if end < start {
            return Err(corrupt(format!(
                "tensor `{}`: data_offsets [{start}, {end}] end before they start",
                desc.name
            )));
        }
        let want = desc.byte_len().map_err(|_| {
            corrupt(format!(
                "tensor `{}`: shape {:?} overflows a 64-bit byte count",
                desc.name, desc.shape
            ))
        })?;
        if want != end - start {
            return Err(corrupt(format!(
                "tensor `{}`: {} × {:?} is {want} bytes but data_offsets [{start}, {end}] hold {}",
                desc.name,
                desc.dtype,
                desc.shape,
                end - start
            )));
        }
        if end > data_len {
            return Err(corrupt(format!(
                "tensor `{}`: data_offsets [{start}, {end}] run past the end of the data \
                 section ({data_len} bytes): the file is truncated or the offsets are wrong",
                desc.name
            )));
        }
        out.push(HeaderEntry {
            desc,
            offsets: start..end,
        });
    }
    out.sort_by(|a, b| {
        (a.offsets.start, a.offsets.end, &a.desc.name).cmp(&(
            b.offsets.start,
            b.offsets.end,
            &b.desc.name,
        ))
    });
    let mut pos = 0u64;
    let mut prev: Option<&str> = None;
    for e in &out {
        if e.offsets.start != pos {
            let after = prev.map_or("the start of the data section".to_string(), |p| {
                format!("tensor `{p}`")
            });
            let what = if e.offsets.start > pos {
                "gap"
            } else {
                "overlap"
            };
            return Err(corrupt(format!(
                "tensor `{}`: data starts at {} but {after} ends at {pos} ({what})",
                e.desc.name, e.offsets.start
            )));
        }
        pos = e.offsets.end;
        prev = Some(&e.desc.name);
    }
    if pos != data_len {
        let last = prev.map_or("no tensor".to_string(), |p| {
            format!("the last tensor `{p}`")
        });
        return Err(corrupt(format!(
            "the data section is {data_len} bytes but {last} ends at {pos} (trailing bytes)"
        )));
    }
    Ok(out)
}

/// Checks a tensor name given for saving.
pub(crate) fn tensor_name(name: &str) -> Result<()> {
    if name == METADATA_KEY {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("`{METADATA_KEY}` is reserved and cannot name a tensor"),
        ));
    }
    Ok(())
}
