//! Checks of a header's tensor table against the file: lengths, order, overlaps and gaps.

use super::{corrupt, HeaderEntry, METADATA_KEY};
use crate::{Error, ErrorKind, Result};

/// Validates entries as a header gives them (offsets unchecked) against a data section of
/// `data_len` bytes and returns them sorted by offset, with their indices sorted by name.
/// The data must be covered exactly: no overlap, no gap, nothing after the last tensor, and
/// each tensor's byte length must be dtype size × number of elements; names are unique.
pub(crate) fn entries(
    mut out: Vec<HeaderEntry>,
    data_len: u64,
) -> Result<(Vec<HeaderEntry>, Vec<u32>)> {
    for e in &out {
        let (start, end) = (e.offsets.start, e.offsets.end);
        let desc = &e.desc;
        if end < start {
            return Err(corrupt(format!(
                "tensor `{}`: data_offsets [{start}, {end}] end before they start",
                desc.name
            )));
        }
        let want = desc
            .byte_len()
            .map_err(|e| corrupt(e.message().to_string()))?;
        if want != end - start {
            return Err(corrupt(format!(
                "tensor `{}`: {} × {:?} is {want} bytes, which does not match the {} bytes of \
                 data_offsets [{start}, {end}]",
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
    }
    out.sort_unstable_by(|a, b| {
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
    let by_name = by_name(&out, |e| &e.desc.name)
        .map_err(|name| corrupt(format!("tensor `{name}` appears twice in the header")))?;
    Ok((out, by_name))
}

/// The indices of `items` sorted by their names; a name given twice is returned as the
/// error.
pub(crate) fn by_name<T>(
    items: &[T],
    name_of: impl Fn(&T) -> &String,
) -> std::result::Result<Vec<u32>, String> {
    let n = u32::try_from(items.len()).map_err(|_| "(more than 2^32 tensors)".to_string())?;
    let mut order: Vec<u32> = (0..n).collect();
    order.sort_unstable_by(|&a, &b| name_of(&items[a as usize]).cmp(name_of(&items[b as usize])));
    for w in order.windows(2) {
        let name = name_of(&items[w[0] as usize]);
        if name == name_of(&items[w[1] as usize]) {
            return Err(name.clone());
        }
    }
    Ok(order)
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
