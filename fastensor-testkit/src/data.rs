//! Deterministic pseudo-random test data.

/// Fills `buf` with pseudo-random bytes derived from `seed` (xorshift64*), fast enough for
/// hundreds of MiB.
pub fn fill(buf: &mut [u8], seed: u64) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        c.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    state ^= state >> 12;
    let tail = state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
    rest.copy_from_slice(&tail[..rest.len()]);
}

/// A new vector of `len` pseudo-random bytes.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0; len];
    fill(&mut v, seed);
    v
}

/// The index of the first differing byte, if any (or the shorter length).
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    Some(
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len())),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn seeds_differ_and_repeat() {
        assert_eq!(super::bytes(100, 1), super::bytes(100, 1));
        assert_ne!(super::bytes(100, 1), super::bytes(100, 2));
        assert_eq!(super::first_difference(&[1, 2, 3], &[1, 9, 3]), Some(1));
    }
}
