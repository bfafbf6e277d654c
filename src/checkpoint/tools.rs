//! What the command line needs: a header listing and a re-save through the fast path.

use super::header::{check_header_len, header_len_of, parse_header, Header};
use super::{load, save_with_metadata, FileOpener};
use crate::{Error, Result};
use std::io::Read;
use std::path::Path;

/// Reads and validates only the header of the safetensors file at `path` (a small read
/// through the page cache; no backend needed).
pub fn inspect(path: &Path) -> Result<Header> {
    let ctx = |e: Error| e.with_path(path);
    let mut file = crate::atomic::open_regular(path)?;
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
    let rows = rows(header);
    let name_w = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let mut out = format!(
        "{:<name_w$}  {:<8} {:<24} {:>14}\n",
        "name", "dtype", "shape", "bytes"
    );
    for r in &rows {
        out.push_str(&format!(
            "{:<name_w$}  {:<8} {:<24} {:>14}\n",
            r.name,
            r.dtype,
            format!("{:?}", r.shape),
            r.bytes
        ));
    }
    out.push_str(&format!(
        "{} tensors, {} data bytes, header {} bytes, data {}aligned, {} metadata keys\n",
        rows.len(),
        header.data_len(),
        header.header_len(),
        if header.is_aligned() { "" } else { "not " },
        header.metadata().len()
    ));
    out
}

/// Copies the checkpoint at `src` to `dst` (metadata included), reading and re-saving it
/// through the fast path, so `dst` gets an aligned data section. Returns the data bytes.
pub fn copy<O: FileOpener + ?Sized>(opener: &O, src: &Path, dst: &Path) -> Result<u64> {
    let ckpt = load(opener, src)?;
    save_with_metadata(opener, dst, &ckpt.views(), ckpt.metadata())?;
    Ok(ckpt.data_bytes())
}
