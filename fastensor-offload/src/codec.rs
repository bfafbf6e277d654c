//! Lossless packing of one chunk of a tensor's bytes for the swap file.
//!
//! Training activations are often mostly zeros or two-valued: a dropout mask kept as a float
//! tensor holds only 0 and `1/(1-p)`, a boolean mask only 0 and 1, and a ReLU's output is
//! about half zeros. Such a chunk goes to the swap file as a bitmap (one bit a word), and
//! for the mostly-zero kind the nonzero words after it, instead of byte for byte: fewer
//! bytes cross to the disk and back, and the bytes come back bit for bit (words are
//! compared as bits: `-0.0` and every NaN stay what they were).
//!
//! A chunk is tried in a few words first and packed only when that wins; anything else is
//! stored as it is ([`Codec::Raw`]), so data that does not pack costs a glance, not a pass.

/// Bytes of a tensor packed as one unit (the last chunk may be shorter).
pub(crate) const CHUNK: usize = 1 << 20;

/// Chunks shorter than this are stored as they are.
pub(crate) const MIN_PACKED: usize = 64 << 10;

/// How many leading bytes of a chunk decide whether it is worth packing.
const SAMPLE: usize = 4096;

/// How one chunk is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    /// Byte for byte.
    Raw,
    /// Every word of `word` bytes (1, 2 or 4) is 0 or `value`: a bitmap, bit `i` (of byte
    /// `i / 8`, least significant first) set where word `i` is `value`.
    TwoValued { word: u8, value: u32 },
    /// 4-byte words, `nonzero` of them not 0: the bitmap of the nonzero words, then those
    /// words in order.
    Sparse { nonzero: u32 },
}

impl Codec {
    /// Bytes the chunk of `len` bytes takes in the swap file, stored this way (before the
    /// page rounding every stored chunk gets).
    #[cfg(test)]
    pub(crate) fn stored_len(self, len: usize) -> usize {
        match self {
            Codec::Raw => len,
            Codec::TwoValued { word, .. } => (len / word as usize).div_ceil(8),
            Codec::Sparse { nonzero } => (len / 4).div_ceil(8) + 4 * nonzero as usize,
        }
    }
}

/// Packs `src` into `out` where that stores it in fewer pages than as it is: the codec and
/// the bytes written to `out`, or `(Codec::Raw, 0)` (nothing written). `out` must hold
/// `src.len()` bytes; only the packed bytes are written.
pub(crate) fn encode(src: &[u8], out: &mut [u8]) -> (Codec, usize) {
    debug_assert!(out.len() >= src.len());
    if src.len() < MIN_PACKED {
        return (Codec::Raw, 0);
    }
    let sample = &src[..SAMPLE.min(src.len())];
    // The widest word that holds only 0 and one other value in the sample: bool masks are
    // two-valued as bytes, half-precision ones as 2-byte words, float32 ones as 4-byte words.
    for word in [4usize, 2, 1] {
        if !src.len().is_multiple_of(word) {
            continue;
        }
        let packed = match word {
            4 => try_two_valued::<4>(src, sample, out),
            2 => try_two_valued::<2>(src, sample, out),
            _ => try_two_valued::<1>(src, sample, out),
        };
        if let Some(packed) = packed {
            return packed;
        }
    }
    if src.len().is_multiple_of(4) && zero_words(sample) * 8 >= sample.len() / 4 * 7 {
        // Mostly zeros (seven eighths of the sample): packed when that stores it in an
        // eighth of its size. Packing costs about a nanosecond a word each way, more than
        // moving the bytes of a chunk with fewer zeros (a ReLU's output, about half zeros,
        // stays raw).
        let limit = src.len() / 8;
        if let Some(n) = encode_sparse(src, &mut out[..limit]) {
            let nonzero = (n - (src.len() / 4).div_ceil(8)) / 4;
            return (
                Codec::Sparse {
                    nonzero: nonzero as u32,
                },
                n,
            );
        }
    }
    (Codec::Raw, 0)
}

/// Writes the `out.len()` bytes that `stored` (packed with `codec`) stands for.
pub(crate) fn decode(codec: Codec, stored: &[u8], out: &mut [u8]) {
    match codec {
        Codec::Raw => out.copy_from_slice(&stored[..out.len()]),
        Codec::TwoValued { word: 4, value } => decode_two_valued::<4>(value, stored, out),
        Codec::TwoValued { word: 2, value } => decode_two_valued::<2>(value, stored, out),
        Codec::TwoValued { value, .. } => decode_two_valued::<1>(value, stored, out),
        Codec::Sparse { .. } => decode_sparse(stored, out),
    }
}

/// The word of `W` bytes at the start of `b`, as a `u32`.
#[inline(always)]
fn word<const W: usize>(b: &[u8]) -> u32 {
    match W {
        4 => u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        2 => u16::from_ne_bytes([b[0], b[1]]) as u32,
        _ => b[0] as u32,
    }
}

/// Writes the low `W` bytes of `v` at the start of `b`.
#[inline(always)]
fn put_word<const W: usize>(b: &mut [u8], v: u32) {
    match W {
        4 => b[..4].copy_from_slice(&v.to_ne_bytes()),
        2 => b[..2].copy_from_slice(&(v as u16).to_ne_bytes()),
        _ => b[0] = v as u8,
    }
}

/// Packs `src` as two-valued words of `W` bytes when `sample` (its start) says it is; None
/// when the sample or the whole chunk holds a third value.
fn try_two_valued<const W: usize>(
    src: &[u8],
    sample: &[u8],
    out: &mut [u8],
) -> Option<(Codec, usize)> {
    let mut value = 0u32;
    for w in sample.chunks_exact(W).map(word::<W>) {
        if w != 0 {
            if value != 0 && w != value {
                return None;
            }
            value = w;
        }
    }
    if value == 0 {
        // All zeros so far: the first nonzero word, if any (an all-zero chunk packs too).
        value = src
            .chunks_exact(W)
            .map(word::<W>)
            .find(|&w| w != 0)
            .unwrap_or(0);
    }
    let n = (src.len() / W).div_ceil(8);
    encode_two_valued::<W>(src, value, &mut out[..n]).then_some((
        Codec::TwoValued {
            word: W as u8,
            value,
        },
        n,
    ))
}

/// The bitmap of `src`'s words of `W` bytes equal to `value` into `bitmap`; false where a
/// word is neither 0 nor `value`.
fn encode_two_valued<const W: usize>(src: &[u8], value: u32, bitmap: &mut [u8]) -> bool {
    let mut groups = src.chunks_exact(8 * W);
    let mut bad = 0u32;
    for (g, b) in (&mut groups).zip(bitmap.iter_mut()) {
        let mut bits = 0u8;
        for i in 0..8 {
            let w = word::<W>(&g[i * W..]);
            bits |= ((w == value) as u8) << i;
            bad |= ((w != 0) & (w != value)) as u32;
        }
        *b = bits;
        if bad != 0 {
            return false;
        }
    }
    let rest = groups.remainder();
    if !rest.is_empty() {
        let mut bits = 0u8;
        for (i, w) in rest.chunks_exact(W).map(word::<W>).enumerate() {
            if w != 0 && w != value {
                return false;
            }
            bits |= ((w == value) as u8) << i;
        }
        bitmap[bitmap.len() - 1] = bits;
    }
    true
}

fn decode_two_valued<const W: usize>(value: u32, bitmap: &[u8], out: &mut [u8]) {
    let mut groups = out.chunks_exact_mut(8 * W);
    for (g, &bits) in (&mut groups).zip(bitmap) {
        for i in 0..8 {
            let v = value & 0u32.wrapping_sub(((bits >> i) & 1) as u32);
            put_word::<W>(&mut g[i * W..], v);
        }
    }
    let rest = groups.into_remainder();
    if !rest.is_empty() {
        let bits = bitmap[bitmap.len() - 1];
        for (i, w) in rest.chunks_exact_mut(W).enumerate() {
            let v = value & 0u32.wrapping_sub(((bits >> i) & 1) as u32);
            put_word::<W>(w, v);
        }
    }
}

/// The 4-byte words of `b` that are 0.
fn zero_words(b: &[u8]) -> usize {
    b.chunks_exact(4).filter(|w| word::<4>(w) == 0).count()
}

/// Packs `src` (a multiple of 4 bytes) as the bitmap of its nonzero words followed by those
/// words, into `out`; the bytes written, or None when they would not fit in `out`.
fn encode_sparse(src: &[u8], out: &mut [u8]) -> Option<usize> {
    let words = src.len() / 4;
    let map_len = words.div_ceil(8);
    if out.len() < map_len {
        return None;
    }
    let (bitmap, values) = out.split_at_mut(map_len);
    // Each group of 8 words writes up to 8 values, always at `j` (advanced past nonzero
    // ones only): it needs room for all 8.
    let room = values.len() / 4;
    let mut j = 0usize;
    let mut groups = src.chunks_exact(32);
    for (g, b) in (&mut groups).zip(bitmap.iter_mut()) {
        if j + 8 > room {
            return None;
        }
        let dst: &mut [u8; 32] = (&mut values[j * 4..j * 4 + 32])
            .try_into()
            .expect("32 bytes");
        let mut bits = 0u8;
        let mut k = 0usize;
        for i in 0..8 {
            let w = word::<4>(&g[i * 4..]);
            dst[(k & 7) * 4..(k & 7) * 4 + 4].copy_from_slice(&w.to_ne_bytes());
            let nz = (w != 0) as usize;
            bits |= (nz as u8) << i;
            k += nz;
        }
        j += k;
        *b = bits;
    }
    let rest = groups.remainder();
    if !rest.is_empty() {
        if j + 8 > room {
            return None;
        }
        let mut bits = 0u8;
        for (i, w) in rest.chunks_exact(4).map(word::<4>).enumerate() {
            if w != 0 {
                values[j * 4..j * 4 + 4].copy_from_slice(&w.to_ne_bytes());
                bits |= 1 << i;
                j += 1;
            }
        }
        bitmap[map_len - 1] = bits;
    }
    Some(map_len + 4 * j)
}

fn decode_sparse(stored: &[u8], out: &mut [u8]) {
    let words = out.len() / 4;
    let (bitmap, values) = stored.split_at(words.div_ceil(8));
    let mut j = 0usize;
    let mut groups = out.chunks_exact_mut(32);
    for (g, &bits) in (&mut groups).zip(bitmap) {
        let count = bits.count_ones() as usize;
        // The group's values, padded with zeros to 8 words where the end is near.
        let mut tail = [0u8; 32];
        let src: &[u8] = match values.get(j * 4..j * 4 + 32) {
            Some(v) => v,
            None => {
                tail[..count * 4].copy_from_slice(&values[j * 4..j * 4 + count * 4]);
                &tail
            }
        };
        let mut k = 0usize;
        for i in 0..8 {
            let nz = ((bits >> i) & 1) as usize;
            // A zero word reads the next value and writes 0.
            let at = (k & 7) * 4;
            let v = u32::from_ne_bytes([src[at], src[at + 1], src[at + 2], src[at + 3]]);
            let v = v & 0u32.wrapping_sub(nz as u32);
            g[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
            k += nz;
        }
        j += count;
    }
    let rest = groups.into_remainder();
    if !rest.is_empty() {
        let bits = bitmap[bitmap.len() - 1];
        for (i, w) in rest.chunks_exact_mut(4).enumerate() {
            let v = if (bits >> i) & 1 == 1 {
                let v = &values[j * 4..j * 4 + 4];
                j += 1;
                u32::from_ne_bytes([v[0], v[1], v[2], v[3]])
            } else {
                0
            };
            w.copy_from_slice(&v.to_ne_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(src: &[u8]) -> Codec {
        let mut packed = vec![0u8; src.len()];
        let (codec, n) = encode(src, &mut packed);
        let stored = if codec == Codec::Raw {
            src.to_vec()
        } else {
            assert_eq!(n, codec.stored_len(src.len()));
            packed[..n].to_vec()
        };
        let mut back = vec![0xAAu8; src.len()];
        decode(codec, &stored, &mut back);
        assert!(back == src, "{codec:?} changed the bytes");
        codec
    }

    fn floats(v: impl Iterator<Item = f32>) -> Vec<u8> {
        v.flat_map(f32::to_ne_bytes).collect()
    }

    /// A xorshift stream (deterministic, no dependency).
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn a_float_dropout_mask_packs_to_a_bit_a_word() {
        let mut r = rng(1);
        let scale = 1.0f32 / 0.9;
        let src =
            floats((0..(CHUNK / 4) + 3).map(|_| if r().is_multiple_of(10) { 0.0 } else { scale }));
        let codec = round_trip(&src);
        assert_eq!(
            codec,
            Codec::TwoValued {
                word: 4,
                value: scale.to_bits()
            }
        );
        assert_eq!(codec.stored_len(src.len()), (src.len() / 4).div_ceil(8));
    }

    #[test]
    fn bool_and_half_masks_pack_by_their_own_word() {
        let mut r = rng(2);
        let bools: Vec<u8> = (0..100_001).map(|_| (r() % 2) as u8).collect();
        assert!(matches!(
            round_trip(&bools),
            Codec::TwoValued { word: 1, value: 1 }
        ));
        let half: Vec<u8> = (0..70_001)
            .flat_map(|_| if r().is_multiple_of(3) { 0u16 } else { 0x3C00 }.to_ne_bytes())
            .collect();
        assert!(matches!(
            round_trip(&half),
            Codec::TwoValued {
                word: 2,
                value: 0x3C00
            }
        ));
    }

    #[test]
    fn mostly_zero_chunks_pack_their_zeros_away_and_half_zero_ones_stay_raw() {
        let mut r = rng(3);
        let sparse = floats((0..CHUNK / 4 - 5).map(|_| {
            if r().is_multiple_of(20) {
                (r() % 1000) as f32 + 0.5
            } else {
                0.0
            }
        }));
        let codec = round_trip(&sparse);
        assert!(matches!(codec, Codec::Sparse { .. }), "{codec:?}");
        assert!(codec.stored_len(sparse.len()) <= sparse.len() / 8);
        let relu = floats((0..CHUNK / 4).map(|_| ((r() % 2000) as f32 / 1000.0 - 1.0).max(0.0)));
        assert_eq!(round_trip(&relu), Codec::Raw);
    }

    #[test]
    fn dense_random_and_short_chunks_stay_raw() {
        let mut r = rng(4);
        let dense = floats((0..CHUNK / 4).map(|_| (r() % 1000) as f32 + 1.0));
        assert_eq!(round_trip(&dense), Codec::Raw);
        let zeros = vec![0u8; MIN_PACKED - 4];
        assert_eq!(round_trip(&zeros), Codec::Raw);
    }

    #[test]
    fn signs_of_zero_and_nans_come_back_bit_for_bit() {
        let mut r = rng(5);
        let odd = [f32::NAN, -0.0, f32::from_bits(0x7FC0_0001), f32::INFINITY];
        let src = floats((0..CHUNK / 4).map(|_| match r() % 16 {
            0 => odd[(r() % 4) as usize],
            _ => 0.0,
        }));
        assert!(matches!(round_trip(&src), Codec::Sparse { .. }));
        // Two-valued with -0.0 as the value: 0.0 and -0.0 differ as words.
        let signs = floats((0..CHUNK / 4).map(|_| if r().is_multiple_of(2) { 0.0 } else { -0.0 }));
        assert!(matches!(
            round_trip(&signs),
            Codec::TwoValued { word: 4, .. }
        ));
    }

    #[test]
    fn a_third_value_late_in_the_chunk_falls_back() {
        // The sample is two-valued, the chunk is not: sparse (mostly zeros) or raw.
        let mut words: Vec<f32> = vec![0.0; CHUNK / 4];
        for (i, w) in words.iter_mut().enumerate() {
            if i % 16 == 0 {
                *w = 2.0;
            }
        }
        *words.last_mut().unwrap() = 7.0;
        assert!(matches!(
            round_trip(&floats(words.iter().copied())),
            Codec::Sparse { .. }
        ));
        let mut dense: Vec<f32> = vec![1.0; CHUNK / 4];
        dense[CHUNK / 4 - 2] = 3.0;
        assert_eq!(round_trip(&floats(dense.into_iter())), Codec::Raw);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Chunks drawn from a few word values (so that every codec gets its turn), with a
        /// stray byte anywhere: each comes back bit for bit, never stored larger.
        #[test]
        fn any_chunk_comes_back_bit_for_bit(
            len in MIN_PACKED..MIN_PACKED * 3,
            palette in proptest::collection::vec(proptest::prelude::any::<u32>(), 1..4),
            zeros in 0u64..16,
            seed in proptest::prelude::any::<u64>(),
            stray in proptest::prelude::any::<Option<(usize, u8)>>(),
        ) {
            let mut r = rng(seed);
            let mut src: Vec<u8> = (0..len.div_ceil(4))
                .flat_map(|_| {
                    let w = if r() % 16 < zeros { 0 } else { palette[(r() % palette.len() as u64) as usize] };
                    w.to_ne_bytes()
                })
                .take(len)
                .collect();
            if let Some((at, b)) = stray {
                let n = src.len();
                src[at % n] = b;
            }
            let codec = round_trip(&src);
            proptest::prop_assert!(codec == Codec::Raw || codec.stored_len(len) < len);
        }
    }

    #[test]
    fn all_zeros_and_every_length_round_trip() {
        let mut r = rng(6);
        for len in [
            MIN_PACKED,
            MIN_PACKED + 1,
            MIN_PACKED + 3,
            MIN_PACKED + 37,
            CHUNK,
        ] {
            assert!(matches!(
                round_trip(&vec![0u8; len]),
                Codec::TwoValued { .. }
            ));
            let sparse: Vec<u8> = (0..len)
                .map(|_| if r().is_multiple_of(40) { r() as u8 } else { 0 })
                .collect();
            round_trip(&sparse);
            let mask: Vec<u8> = (0..len)
                .map(|_| if r().is_multiple_of(5) { 0 } else { 0x5A })
                .collect();
            round_trip(&mask);
        }
    }
}
