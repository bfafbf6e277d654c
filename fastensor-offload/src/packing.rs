//! A host tensor's bytes through the swap file chunk by chunk, each chunk packed where that
//! wins ([`codec`](super::codec)): the write that records how the chunks lie, and the read
//! that undoes it.
//!
//! Chunk `i` holds bytes `i * CHUNK..` of the tensor. In the file the chunks follow one
//! another from the start of the tensor's extent, each on a page of its own: a raw chunk
//! takes its length, a packed one its packed bytes rounded up to a page, never more than
//! the raw chunk, so the tensor fits its extent either way. Consecutive raw chunks move in
//! one transfer straight from (or into) the tensor's memory; consecutive packed ones in one
//! transfer through a scratch buffer.

use super::allocator::round_up;
use super::codec::{self, Codec, CHUNK};
use super::swap::SwapFile;
use fastensor_core::{Error, ErrorKind, Result};
use std::ops::Range;
use std::path::Path;

/// The most bytes of scratch a packed transfer uses (see [`write_scratch`], [`Layout::read_scratch`]).
pub(crate) const SCRATCH: usize = 4 * CHUNK;

/// Scratch bytes a write of a `len`-byte tensor uses: room to pack one chunk, up to
/// [`SCRATCH`] (a tensor smaller than that needs no more than its own length).
pub(crate) fn write_scratch(len: usize) -> usize {
    (round_up(len as u64) as usize).min(SCRATCH)
}

/// What a write of a tensor did: how it lies in its extent (None: as it is), and the
/// bytes that crossed to the file.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) layout: Option<Layout>,
    pub(crate) file_bytes: u64,
}

impl Written {
    /// A tensor of `len` bytes written as it is.
    pub(crate) fn raw(len: u64) -> Written {
        Written {
            layout: None,
            file_bytes: len,
        }
    }
}

/// How a tensor written packed lies in its extent: its chunks' codecs and packed lengths.
#[derive(Debug)]
pub(crate) struct Layout {
    chunks: Vec<(Codec, usize)>,
}

impl Layout {
    /// Scratch bytes a read of the `len`-byte tensor laid out so uses: its packed chunks'
    /// stored bytes, up to [`SCRATCH`] (a mask of 1 MiB reads 32 KiB, not 4 MiB).
    pub(crate) fn read_scratch(&self, len: usize) -> usize {
        let packed: usize = self
            .pieces(len)
            .filter(|p| p.codec != Codec::Raw)
            .map(|p| p.disk.len())
            .sum();
        packed.min(SCRATCH)
    }

    /// Each chunk: its codec, its bytes in the tensor, its bytes in the extent (relative).
    fn pieces(&self, len: usize) -> impl Iterator<Item = Piece> + '_ {
        let mut disk = 0usize;
        self.chunks.iter().enumerate().map(move |(i, &(codec, n))| {
            let tensor = i * CHUNK..((i + 1) * CHUNK).min(len);
            let stored = match codec {
                Codec::Raw => tensor.len(),
                _ => round_up(n as u64) as usize,
            };
            let piece = Piece {
                codec,
                packed: n,
                tensor,
                disk: disk..disk + stored,
            };
            disk += stored;
            piece
        })
    }
}

struct Piece {
    codec: Codec,
    packed: usize,
    tensor: Range<usize>,
    disk: Range<usize>,
}

/// The transfer being gathered: consecutive raw chunks, or consecutive packed ones.
enum Run {
    None,
    /// Tensor bytes `tensor`, at `disk` in the extent.
    Raw {
        tensor: Range<usize>,
        disk: usize,
    },
    /// Scratch bytes `..used`, at `disk` in the extent.
    Packed {
        disk: usize,
        used: usize,
    },
}

/// Writes `src` (a tensor of `src.len()` bytes) into its extent at `offset`, packing the
/// chunks that pack ([`codec::encode`]) through `scratch` (page-aligned, at least
/// [`write_scratch`] bytes).
/// The layout is None when every chunk went raw (the tensor lies as it is).
pub(crate) fn write(
    file: &SwapFile,
    offset: u64,
    src: &[u8],
    scratch: &mut [u8],
) -> Result<Written> {
    debug_assert!(scratch.len() >= write_scratch(src.len()));
    let mut chunks = Vec::with_capacity(src.len().div_ceil(CHUNK));
    let mut run = Run::None;
    let mut disk = 0usize;
    let mut written = 0u64;
    let mut flush = |run: &mut Run, scratch: &[u8]| -> Result<()> {
        match std::mem::replace(run, Run::None) {
            Run::None => {}
            Run::Raw { tensor, disk } => {
                written += tensor.len() as u64;
                file.write_at(offset + disk as u64, &src[tensor])?;
            }
            Run::Packed { disk, used } => {
                written += used as u64;
                file.write_at(offset + disk as u64, &scratch[..used])?;
            }
        }
        Ok(())
    };
    for (i, chunk) in src.chunks(CHUNK).enumerate() {
        let start = i * CHUNK;
        let at = match run {
            Run::Packed { used, .. } if used + chunk.len() <= scratch.len() => used,
            Run::Packed { .. } => {
                flush(&mut run, scratch)?;
                0
            }
            _ => 0,
        };
        let (codec, n) = codec::encode(chunk, &mut scratch[at..at + chunk.len()]);
        chunks.push((codec, n));
        if codec == Codec::Raw {
            match &mut run {
                Run::Raw { tensor, .. } => tensor.end = start + chunk.len(),
                _ => {
                    flush(&mut run, scratch)?;
                    run = Run::Raw {
                        tensor: start..start + chunk.len(),
                        disk,
                    };
                }
            }
            disk += chunk.len();
        } else {
            let stored = round_up(n as u64) as usize;
            match &mut run {
                Run::Packed { used, .. } => *used += stored,
                _ => {
                    // A raw run before it leaves the scratch as it was: the chunk was packed
                    // at its start.
                    flush(&mut run, scratch)?;
                    run = Run::Packed { disk, used: stored };
                }
            }
            disk += stored;
        }
    }
    flush(&mut run, scratch)?;
    let packed = chunks.iter().any(|&(c, _)| c != Codec::Raw);
    Ok(Written {
        layout: packed.then_some(Layout { chunks }),
        file_bytes: written,
    })
}

/// Reads the tensor written with `layout` at `offset` into `dst` (its `len` bytes, in a
/// buffer that may hold up to a page more: raw bytes are read to whole pages where it
/// does), through `scratch` (page-aligned, at least [`Layout::read_scratch`] bytes).
/// Returns the bytes read from the file.
pub(crate) fn read(
    file: &SwapFile,
    path: &Path,
    offset: u64,
    layout: &Layout,
    len: usize,
    dst: &mut [u8],
    scratch: &mut [u8],
) -> Result<u64> {
    let mut read = 0u64;
    let mut run = Run::None;
    // Packed chunks read into the scratch and not yet unpacked: (codec, packed bytes,
    // where in the scratch, where in the tensor).
    let mut pending: Vec<(Codec, usize, usize, Range<usize>)> = Vec::new();
    let mut flush = |run: &mut Run,
                     pending: &mut Vec<(Codec, usize, usize, Range<usize>)>,
                     dst: &mut [u8],
                     scratch: &mut [u8]|
     -> Result<()> {
        match std::mem::replace(run, Run::None) {
            Run::None => {}
            Run::Raw { tensor, disk } => {
                // The last raw bytes are read to the end of their page where `dst` holds it.
                let want = tensor.len();
                let end = (tensor.start + round_up(want as u64) as usize).min(dst.len());
                let got = file.read_at(offset + disk as u64, &mut dst[tensor.start..end])?;
                read += got as u64;
                complete(path, offset + disk as u64, want, got)?;
            }
            Run::Packed { disk, used } => {
                let got = file.read_at(offset + disk as u64, &mut scratch[..used])?;
                read += got as u64;
                let need = pending.last().map_or(0, |&(_, n, at, _)| at + n);
                complete(path, offset + disk as u64, need, got)?;
                for (codec, n, at, tensor) in pending.drain(..) {
                    codec::decode(codec, &scratch[at..at + n], &mut dst[tensor]);
                }
            }
        }
        Ok(())
    };
    for piece in layout.pieces(len) {
        if piece.codec == Codec::Raw {
            match &mut run {
                Run::Raw { tensor, .. } => tensor.end = piece.tensor.end,
                _ => {
                    flush(&mut run, &mut pending, dst, scratch)?;
                    run = Run::Raw {
                        tensor: piece.tensor,
                        disk: piece.disk.start,
                    };
                }
            }
            continue;
        }
        let stored = piece.disk.len();
        let at = match run {
            Run::Packed { used, .. } if used + stored <= scratch.len() => used,
            _ => {
                flush(&mut run, &mut pending, dst, scratch)?;
                run = Run::Packed {
                    disk: piece.disk.start,
                    used: 0,
                };
                0
            }
        };
        if let Run::Packed { used, .. } = &mut run {
            *used = at + stored;
        }
        pending.push((piece.codec, piece.packed, at, piece.tensor));
    }
    flush(&mut run, &mut pending, dst, scratch)?;
    Ok(read)
}

/// An error unless `got` bytes read at `offset` of the swap file at `path` cover the `want`
/// asked for.
pub(crate) fn complete(path: &Path, offset: u64, want: usize, got: usize) -> Result<()> {
    if got >= want {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::UnexpectedEof,
        format!("wanted {want} bytes, the swap file ended after {got}"),
    )
    .with_path(path)
    .with_offset(offset))
}
