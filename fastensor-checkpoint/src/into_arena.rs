//! Loads of a source's tensors into new memory of their own: the file ranges to read, one
//! page-aligned arena laid out so that file and memory alignments match, and the reads as
//! one job per file through the planner.

use super::loaded::Checkpoint;
use super::plan::{congruent_pad, How, Request, ALIGN, READ_WINDOW};
use super::source::CheckpointSource;
use super::Arena;
use crate::{Error, ErrorKind, MemMut, Result};
use fastensor_core::align::align_down;

/// A range of a file read into the arena: the file, its aligned-down start, its end, and
/// the arena offset of that start (aligned).
struct Placed {
    file: usize,
    from: u64,
    end: u64,
    at: u64,
}

/// Loads the tensors `chosen` of `source` (`(file, entry)` pairs in file and offset order)
/// into one new arena. Their file ranges closer than `merge_gap` in one file are read as one
/// span, gap included; each span is placed so that its aligned-down start sits on an
/// aligned arena offset (direct reads fill it with no copy), and read in windows of 8 MiB,
/// each faulted in by the worker that reads it (the page faults of fresh memory overlap
/// other windows' reads). The checkpoint is named by the source's path and carries the
/// first file's metadata; a read that ends early is [`ErrorKind::Corrupt`].
pub(crate) fn load_chosen(
    source: &CheckpointSource,
    chosen: &[(usize, usize)],
    merge_gap: u64,
) -> Result<Checkpoint> {
    let path = source.path();
    let mut spans: Vec<(usize, u64, u64)> = Vec::new();
    for &at in chosen {
        let (_, r) = source.entry(at);
        match spans.last_mut() {
            Some(last) if last.0 == at.0 && r.start <= last.2 + merge_gap => {
                last.2 = last.2.max(r.end)
            }
            _ => spans.push((at.0, r.start, r.end)),
        }
    }
    let mut placed = Vec::with_capacity(spans.len());
    let mut arena_len = 0u64;
    for (file, start, end) in spans {
        let from = align_down(start, ALIGN);
        placed.push(Placed {
            file,
            from,
            end,
            at: arena_len,
        });
        arena_len = (arena_len + (end - from)).div_ceil(ALIGN) * ALIGN;
    }
    let arena_len = usize::try_from(arena_len).map_err(|_| {
        Error::new(
            ErrorKind::OutOfMemory,
            "the checkpoint does not fit in memory",
        )
        .with_path(path)
    })?;
    let mut arena = Arena::new(arena_len).map_err(|e| e.with_path(path))?;
    {
        let mut reqs = Vec::new();
        let mut rest: &mut [u8] = &mut arena;
        let mut at = 0u64;
        for p in &placed {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((p.at - at) as usize);
            let (piece, tail) = tail.split_at_mut((p.end - p.from) as usize);
            let mut offset = p.from;
            for w in piece.chunks_mut(READ_WINDOW) {
                let len = w.len() as u64;
                reqs.push(Request::at(p.file, offset, MemMut::Host(w)));
                offset += len;
            }
            rest = tail;
            at = p.at + (p.end - p.from);
        }
        let how = How {
            fresh: true,
            windows: true,
        };
        source.read(&mut reqs, how)?;
    }
    let mut entries = Vec::with_capacity(chosen.len());
    let mut span = 0;
    for &at in chosen {
        let (e, r) = source.entry(at);
        // Chosen tensors come in file order, as the spans do.
        while !(placed[span].file == at.0
            && placed[span].from <= r.start
            && r.end <= placed[span].end)
        {
            span += 1;
        }
        let p = &placed[span];
        let start = (p.at + r.start - p.from) as usize;
        entries.push((e.desc.clone(), start..start + (r.end - r.start) as usize));
    }
    Checkpoint::from_parts(path, arena, entries, source.metadata())
}

/// The tensors of `source` named `names`, as [`load_chosen`] takes them (file and offset
/// order, each once); a name the source lacks is [`ErrorKind::NotFound`] naming the source.
pub(crate) fn named<S: AsRef<str>>(
    source: &CheckpointSource,
    names: &[S],
) -> Result<Vec<(usize, usize)>> {
    let mut chosen = names
        .iter()
        .map(|n| source.locate(n.as_ref()))
        .collect::<Result<Vec<_>>>()?;
    chosen.sort_unstable();
    chosen.dedup();
    Ok(chosen)
}

impl CheckpointSource {
    /// The tensors `names` (every tensor when `None`), in new memory: one page-aligned
    /// [`Arena`] (huge pages where large, see [`Arena::new`]) in which each tensor whose
    /// file offset is a multiple of its element size is placed so that its address and its
    /// file offset agree modulo 4096 (direct reads fill it with no copy; neighbours in a file
    /// stay neighbours), any other aligned to its element size. Each tensor is read whole, as [`read_into`](Self::read_into) reads it
    /// (checked against its stored checksum where the source verifies). A name the source
    /// lacks is [`ErrorKind::NotFound`]; the checkpoint carries the first file's metadata.
    pub fn read_new(&self, names: Option<&[&str]>) -> Result<Checkpoint> {
        let chosen = match names {
            None => self.tensors(),
            Some(names) => named(self, names)?,
        };
        let mut places = Vec::with_capacity(chosen.len());
        let mut pos = 0u64;
        for &at in &chosen {
            let (e, r) = self.entry(at);
            let item = e.desc.dtype.size().unwrap_or(1) as u64;
            if r.start % item == 0 {
                // Congruent, hence aligned to the element (it divides ALIGN); no gap after
                // a congruent neighbour that ends where this one starts in the file.
                pos += congruent_pad(r.start, pos);
            } else {
                pos = pos.div_ceil(item) * item;
            }
            places.push(pos..pos + (r.end - r.start));
            pos += r.end - r.start;
        }
        let len = usize::try_from(pos).map_err(|_| {
            Error::new(ErrorKind::OutOfMemory, "the tensors do not fit in memory")
                .with_path(self.path())
        })?;
        let mut arena = Arena::new(len).map_err(|e| e.with_path(self.path()))?;
        {
            let mut reqs = Vec::with_capacity(chosen.len());
            let mut rest: &mut [u8] = &mut arena;
            let mut at = 0u64;
            for (&(file, entry), place) in chosen.iter().zip(&places) {
                let (_, r) = self.entry((file, entry));
                let (_, tail) = std::mem::take(&mut rest).split_at_mut((place.start - at) as usize);
                let (piece, tail) = tail.split_at_mut((place.end - place.start) as usize);
                if !piece.is_empty() {
                    reqs.push(Request::at(file, r.start, MemMut::Host(piece)));
                }
                rest = tail;
                at = place.end;
            }
            let how = How {
                fresh: true,
                windows: true,
            };
            self.read(&mut reqs, how)?;
        }
        let entries = chosen
            .iter()
            .zip(places)
            .map(|(&at, place)| {
                let (e, _) = self.entry(at);
                (e.desc.clone(), place.start as usize..place.end as usize)
            })
            .collect();
        Checkpoint::from_parts(self.path(), arena, entries, self.metadata())
    }
}
