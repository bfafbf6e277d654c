//! What the command line needs: a header listing and a re-save through the fast path.

use super::header::{
    check_header_len, header_len_of, parse_header, parse_header_from, Header, PARSE_WHOLE_MAX,
};
use super::save::save_tensors;
use super::{load, FileOpener};
use crate::{Error, Result};
use std::io::{Read, Write};
use std::path::Path;

/// Reads and validates only the header of the safetensors file at `path` (a small read
/// through the page cache; no backend needed).
pub fn inspect(path: &Path) -> Result<Header> {
    let ctx = |e: Error| e.with_path(path);
    let mut file = fastensor_sys::atomic::open_regular(path)?;
    let file_len = file
        .metadata()
        .map_err(|e| ctx(Error::io(e, "cannot stat")))?
        .len();
    let mut len_bytes = Vec::with_capacity(8);
    (&mut file)
        .take(8)
        .read_to_end(&mut len_bytes)
        .map_err(|e| ctx(Error::io(e, "cannot read the header")))?;
    let header_len = header_len_of(&len_bytes).map_err(ctx)?;
    check_header_len(header_len, file_len).map_err(ctx)?;
    if header_len > PARSE_WHOLE_MAX {
        // Parsed as it is read: the JSON is never held whole.
        return parse_header_from(file, header_len, file_len).map_err(ctx);
    }
    let mut bytes = len_bytes;
    (&mut file)
        .take(header_len)
        .read_to_end(&mut bytes)
        .map_err(|e| ctx(Error::io(e, "cannot read the header")))?;
    parse_header(&bytes, file_len).map_err(ctx)
}

/// One line of a checkpoint listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectRow {
    /// Tensor name.
    pub name: String,
    /// Safetensors dtype name, e.g. `F32`.
    pub dtype: String,
    /// Shape, e.g. `[1024, 3072]`.
    pub shape: Vec<u64>,
    /// Bytes of data.
    pub bytes: u64,
    /// Absolute file offset of the data.
    pub offset: u64,
}

/// The rows of a listing of `header`, in file order.
pub fn rows(header: &Header) -> Vec<InspectRow> {
    header
        .entries()
        .iter()
        .map(|e| InspectRow {
            name: e.desc.name.clone(),
            dtype: e.desc.dtype.name().to_string(),
            shape: e.desc.shape.clone(),
            bytes: e.byte_len(),
            offset: header.file_range(e).start,
        })
        .collect()
}

/// A plain-text table of `header`: one line per tensor, then a summary line.
pub fn format_table(header: &Header) -> String {
    let mut out = Vec::new();
    write_table(header, &mut out).expect("writing to memory never fails");
    String::from_utf8(out).expect("the table is UTF-8")
}

/// Writes the table of [`format_table`] to `out`, a line at a time (nothing is built whole).
pub fn write_table(header: &Header, out: &mut dyn Write) -> std::io::Result<()> {
    let entries = header.entries();
    let name_w = entries
        .iter()
        .map(|e| e.desc.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        out,
        "{:<name_w$}  {:<11} {:<24} {:>14}",
        "name", "dtype", "shape", "bytes"
    )?;
    for e in entries {
        writeln!(
            out,
            "{:<name_w$}  {:<11} {:<24} {:>14}",
            e.desc.name,
            e.desc.dtype.name(),
            format!("{:?}", e.desc.shape),
            e.byte_len()
        )?;
    }
    writeln!(
        out,
        "{} tensors, {} data bytes, header {} bytes, data {}aligned, {} metadata keys",
        entries.len(),
        header.data_len(),
        header.header_len(),
        if header.is_aligned() { "" } else { "not " },
        header.metadata().len()
    )
}

/// Copies the checkpoint at `src` to `dst` (metadata included), reading and re-saving it
/// through the fast path, so `dst` gets an aligned data section. Returns the data bytes.
pub fn copy<O: FileOpener + ?Sized>(opener: &O, src: &Path, dst: &Path) -> Result<u64> {
    let ckpt = load(opener, src)?;
    save_tensors(opener, dst, &&ckpt, ckpt.metadata(), false)?;
    Ok(ckpt.data_bytes())
}
