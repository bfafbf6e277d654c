//! Alignment arithmetic shared by every direct-I/O backend: one place that splits a transfer
//! into an unaligned head, an aligned middle and an unaligned tail.

use std::ops::Range;

/// Rounds `x` down to a multiple of `align` (a power of two).
#[inline]
pub const fn align_down(x: u64, align: u64) -> u64 {
    x & !(align - 1)
}

/// Rounds `x` up to a multiple of `align` (a power of two). Saturates near `u64::MAX`.
#[inline]
pub const fn align_up(x: u64, align: u64) -> u64 {
    match x.checked_add(align - 1) {
        Some(v) => v & !(align - 1),
        None => align_down(u64::MAX, align),
    }
}

/// True when `x` is a multiple of `align` (a power of two).
#[inline]
pub const fn is_aligned(x: u64, align: u64) -> bool {
    x & (align - 1) == 0
}

/// The direct-I/O alignment rules of a file: what its buffers' addresses and its offsets and
/// lengths must be multiples of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectAlignment {
    /// Required alignment of memory addresses.
    pub memory: u64,
    /// Required alignment of file offsets and transfer lengths.
    pub offset: u64,
}

impl DirectAlignment {
    /// The conservative rule when the kernel reports none: 4096 for both.
    pub const PAGE: DirectAlignment = DirectAlignment {
        memory: 4096,
        offset: 4096,
    };
}

/// A transfer `[offset, offset + len)` split at `align` boundaries.
///
/// `head` and `tail` are the partial blocks at either end (possibly empty) and `middle` the
/// whole blocks between them. The three ranges are consecutive and cover the transfer
/// exactly. When the transfer lies inside one block, it is all `head`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Unaligned start, `offset .. min(align_up(offset), end)`.
    pub head: Range<u64>,
    /// Whole aligned blocks.
    pub middle: Range<u64>,
    /// Unaligned end, `align_down(end) .. end` when it starts after `head`.
    pub tail: Range<u64>,
}

impl Split {
    /// The lengths of `head`, `middle` and `tail`, in that order: a transfer's buffer cut
    /// at them gives the parts.
    pub fn lens(&self) -> [usize; 3] {
        [&self.head, &self.middle, &self.tail].map(|r| (r.end - r.start) as usize)
    }

    /// The transfer's buffer `buf` cut at [`lens`](Self::lens): its head, middle and tail.
    ///
    /// # Panics
    /// If `buf` is shorter than the head and middle together.
    pub fn cut<'b>(&self, buf: &'b [u8]) -> [&'b [u8]; 3] {
        let [head, middle, _] = self.lens();
        let (head, rest) = buf.split_at(head);
        let (middle, tail) = rest.split_at(middle);
        [head, middle, tail]
    }

    /// [`cut`](Self::cut) for a buffer to fill.
    pub fn cut_mut<'b>(&self, buf: &'b mut [u8]) -> [&'b mut [u8]; 3] {
        let [head, middle, _] = self.lens();
        let (head, rest) = buf.split_at_mut(head);
        let (middle, tail) = rest.split_at_mut(middle);
        [head, middle, tail]
    }
}

/// Splits `[offset, offset + len)` at multiples of `align` (a power of two).
pub fn split(offset: u64, len: u64, align: u64) -> Split {
    let end = offset + len;
    let mid_start = align_up(offset, align).min(end);
    let mid_end = align_down(end, align).max(mid_start);
    Split {
        head: offset..mid_start,
        middle: mid_start..mid_end,
        tail: mid_end..end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(
            split(0, 4097, 4096),
            Split {
                head: 0..0,
                middle: 0..4096,
                tail: 4096..4097
            }
        );
        assert_eq!(
            split(10, 20, 4096),
            Split {
                head: 10..30,
                middle: 30..30,
                tail: 30..30
            }
        );
        assert_eq!(
            split(10, 8192, 4096),
            Split {
                head: 10..4096,
                middle: 4096..8192,
                tail: 8192..8202
            }
        );
        assert_eq!(
            split(4096, 0, 4096),
            Split {
                head: 4096..4096,
                middle: 4096..4096,
                tail: 4096..4096
            }
        );
        assert_eq!(align_up(u64::MAX, 4096), align_down(u64::MAX, 4096));
    }

    #[test]
    fn cut_gives_a_buffer_s_parts() {
        let s = split(10, 8192, 4096);
        let buf: Vec<u8> = (0..8192).map(|i| i as u8).collect();
        let [head, middle, tail] = s.cut(&buf);
        assert_eq!([head.len(), middle.len(), tail.len()], [4086, 4096, 10]);
        assert_eq!(
            [head[0], middle[0], tail[0]],
            [buf[0], buf[4086], buf[8182]]
        );
        let mut out = buf.clone();
        let [head, middle, tail] = s.cut_mut(&mut out);
        assert_eq!([head.len(), middle.len(), tail.len()], s.lens());
        tail.fill(0);
        assert_eq!(out[..8182], buf[..8182]);
        assert!(out[8182..].iter().all(|&b| b == 0));
    }

    proptest! {
        #[test]
        fn split_covers_exactly_and_middle_is_aligned(offset in 0u64..1 << 40, len in 0u64..1 << 24, shift in 9u32..14) {
            let align = 1u64 << shift;
            let s = split(offset, len, align);
            prop_assert_eq!(s.head.start, offset);
            prop_assert_eq!(s.head.end, s.middle.start);
            prop_assert_eq!(s.middle.end, s.tail.start);
            prop_assert_eq!(s.tail.end, offset + len);
            prop_assert!(is_aligned(s.middle.start, align) || s.middle.is_empty());
            prop_assert!(is_aligned(s.middle.end, align) || s.middle.is_empty());
            let [head, middle, tail] = s.lens();
            prop_assert!((head as u64) < align && (tail as u64) < align);
            prop_assert_eq!((head + middle + tail) as u64, len);
            prop_assert_eq!(middle as u64, s.middle.end - s.middle.start);
        }
    }
}
