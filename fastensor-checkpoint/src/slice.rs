//! Reads of part of a tensor (`safe_open(...).get_slice(name)[...]` in Python): a selection
//! per dimension becomes the byte runs it covers, and only those are read, through the
//! file's read planner (small runs close together are read as one staged request).

use super::load::CheckpointFile;
use super::plan::{How, Request};
use super::source::wrong_len;
use crate::{Error, ErrorKind, MemMut, Result, TensorDesc};
use std::ops::Range;

/// What one dimension of a slice keeps: `count` indices from `start`, `step` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DimSelection {
    /// The first index kept.
    pub start: u64,
    /// How many indices are kept (0: the slice is empty).
    pub count: u64,
    /// The distance between kept indices (at least 1).
    pub step: u64,
}

impl DimSelection {
    /// The whole of a dimension of `size`.
    pub fn all(size: u64) -> DimSelection {
        DimSelection {
            start: 0,
            count: size,
            step: 1,
        }
    }
}

/// `(start, count, step)`.
impl From<(u64, u64, u64)> for DimSelection {
    fn from((start, count, step): (u64, u64, u64)) -> DimSelection {
        DimSelection { start, count, step }
    }
}

fn invalid(desc: &TensorDesc, msg: String) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("tensor `{}` (shape {:?}): {msg}", desc.name, desc.shape),
    )
}

/// The byte ranges of `desc`'s data (relative to its first byte) that the selection
/// `sel` (one per dimension) covers, in row-major order, adjacent ones merged; their
/// bytes one after another are the slice's, row-major. A selection past a dimension's end,
/// a step of 0, a rank that differs, or (for the packed dtypes) a run that does not start
/// and end on a byte is [`ErrorKind::InvalidInput`].
pub fn slice_runs(desc: &TensorDesc, sel: &[DimSelection]) -> Result<Vec<Range<u64>>> {
    let shape = &desc.shape;
    if sel.len() != shape.len() {
        return Err(invalid(
            desc,
            format!("{} selections for {} dimensions", sel.len(), shape.len()),
        ));
    }
    for (dim, (s, &size)) in sel.iter().zip(shape).enumerate() {
        let last = s
            .count
            .checked_sub(1)
            .map(|n| n.checked_mul(s.step).and_then(|n| n.checked_add(s.start)));
        let fits = match last {
            None => s.start <= size,
            Some(Some(last)) => last < size,
            Some(None) => false,
        };
        if s.step == 0 || !fits {
            return Err(invalid(
                desc,
                format!("the selection {s:?} of dimension {dim} (size {size}) does not fit"),
            ));
        }
    }
    if sel.iter().any(|s| s.count == 0) {
        return Ok(Vec::new());
    }
    let bits = desc.dtype.bits() as u64;
    // The innermost dimension not kept whole: everything inside it is one block of bits.
    let Some(k) = (0..sel.len())
        .rev()
        .find(|&i| sel[i] != DimSelection::all(shape[i]))
    else {
        return Ok(std::iter::once(0..desc.byte_len()?).collect());
    };
    // (fits in u64: a sub-product of the tensor's element count, checked by `byte_len`)
    desc.byte_len()?;
    let inner: u64 = shape[k + 1..].iter().product::<u64>() * bits;
    // Dimension k's kept indices are one run when they are consecutive.
    let (outer, run_bits) = if sel[k].step == 1 {
        (k, sel[k].count * inner)
    } else {
        (k + 1, inner)
    };
    let strides: Vec<u64> = (0..outer)
        .map(|i| shape[i + 1..].iter().product::<u64>() * bits)
        .collect();
    let base = if outer == k { sel[k].start * inner } else { 0 };
    let to_bytes = |b: u64, what: &str| -> Result<u64> {
        if b.is_multiple_of(8) {
            Ok(b / 8)
        } else {
            Err(invalid(
                desc,
                format!(
                    "the slice {what} inside a byte of {} (misaligned)",
                    desc.dtype
                ),
            ))
        }
    };
    let run_len = to_bytes(run_bits, "ends")?;
    let mut runs: Vec<Range<u64>> = Vec::new();
    let mut index = vec![0u64; outer];
    loop {
        let at: u64 = base
            + (0..outer)
                .map(|i| (sel[i].start + index[i] * sel[i].step) * strides[i])
                .sum::<u64>();
        let start = to_bytes(at, "starts")?;
        match runs.last_mut() {
            Some(last) if last.end == start => last.end += run_len,
            _ => runs.push(start..start + run_len),
        }
        // The next index, odometer style (the last dimension fastest).
        let mut i = outer;
        loop {
            if i == 0 {
                return Ok(runs);
            }
            i -= 1;
            index[i] += 1;
            if index[i] < sel[i].count {
                break;
            }
            index[i] = 0;
        }
    }
}

impl CheckpointFile {
    /// Reads the part of tensor `name` that `sel` (one selection per dimension) keeps into
    /// `dst` (host memory of exactly the slice's bytes), row-major: only the byte runs the
    /// slice covers are read (see [`slice_runs`]). A name the file lacks is
    /// [`ErrorKind::NotFound`]; a bad selection, or `dst` of another length or in device
    /// memory, [`ErrorKind::InvalidInput`].
    pub fn read_slice(&self, name: &str, sel: &[DimSelection], dst: MemMut<'_>) -> Result<()> {
        let path = self.path();
        let header = self.header();
        let entry = header.get(name).ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("no tensor `{name}` in the checkpoint"),
            )
            .with_path(path)
        })?;
        let runs = slice_runs(&entry.desc, sel).map_err(|e| e.with_path(path))?;
        let MemMut::Host(mut rest) = dst else {
            return Err(
                Error::new(ErrorKind::InvalidInput, "a slice is read into host memory")
                    .with_path(path),
            );
        };
        let want: u64 = runs.iter().map(|r| r.end - r.start).sum();
        if want != rest.len() as u64 {
            let what = format!("the slice of `{name}`");
            return Err(wrong_len(&what, want, rest.len()).with_path(path));
        }
        let start = header.file_range(entry).start;
        let mut reqs = Vec::with_capacity(runs.len());
        for r in runs {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut((r.end - r.start) as usize);
            reqs.push(Request::at(0, start + r.start, MemMut::Host(piece)));
            rest = tail;
        }
        let how = How {
            fresh: false,
            windows: false,
        };
        self.source().read(&mut reqs, how)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    /// The runs of `sel` over `d`, as `(start, end)` pairs.
    fn runs(d: &TensorDesc, sel: &[DimSelection]) -> Vec<(u64, u64)> {
        slice_runs(d, sel)
            .unwrap()
            .into_iter()
            .map(|r| (r.start, r.end))
            .collect()
    }

    fn sel(v: &[(u64, u64, u64)]) -> Vec<DimSelection> {
        v.iter().copied().map(DimSelection::from).collect()
    }

    #[test]
    fn runs_cover_exactly_the_selection() {
        let d = TensorDesc::new("a", DType::F32, [10, 5]);
        // Everything: one run.
        assert_eq!(runs(&d, &sel(&[(0, 10, 1), (0, 5, 1)])), [(0, 200)]);
        // Rows 2..4: one run.
        assert_eq!(runs(&d, &sel(&[(2, 2, 1), (0, 5, 1)])), [(40, 80)]);
        // Columns 0..2 of rows 0..2: one run a row.
        assert_eq!(runs(&d, &sel(&[(0, 2, 1), (0, 2, 1)])), [(0, 8), (20, 28)]);
        // Column 4, every other row from 1: one element each.
        assert_eq!(
            runs(&d, &sel(&[(1, 3, 3), (4, 1, 1)])),
            [(36, 40), (96, 100), (156, 160)]
        );
        // Every other whole row: one run a row, none merged.
        assert_eq!(runs(&d, &sel(&[(0, 2, 2), (0, 5, 1)])), [(0, 20), (40, 60)]);
        // Nothing.
        assert!(slice_runs(&d, &sel(&[(3, 0, 1), (0, 5, 1)]))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn bad_selections_are_refused() {
        let d = TensorDesc::new("a", DType::F32, [10, 5]);
        for bad in [
            sel(&[(0, 11, 1), (0, 5, 1)]),
            sel(&[(9, 2, 1), (0, 5, 1)]),
            sel(&[(0, 1, 0), (0, 5, 1)]),
            sel(&[(0, 10, 1)]),
            sel(&[(0, 3, u64::MAX), (0, 5, 1)]),
        ] {
            let e = slice_runs(&d, &bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad:?}");
        }
        // F4: two elements a byte; a slice that starts inside a byte is refused.
        let f4 = TensorDesc::new("q", DType::F4, [4, 4]);
        assert_eq!(runs(&f4, &sel(&[(1, 2, 1), (0, 4, 1)])), [(2, 6)]);
        assert_eq!(runs(&f4, &sel(&[(0, 2, 1), (2, 2, 1)])), [(1, 2), (3, 4)]);
        let e = slice_runs(&f4, &sel(&[(0, 4, 1), (1, 2, 1)])).unwrap_err();
        assert!(e.to_string().contains("misaligned"), "{e}");
    }
}
