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

/// Writes a legal safetensors file at `path` whose JSON header is about `mb` MB: one-byte
/// `U8` tensors `t0`, `t1`, ... of `rank` dimensions of 1 (`[1,1,...]`), the kind of header
/// a hostile file uses to make a reader spend memory. Returns the header's length.
pub fn hostile_header(path: &std::path::Path, mb: f64, rank: usize) -> u64 {
    use std::io::Write;
    let target = (mb * 1e6) as usize;
    let shape = vec!["1"; rank].join(",");
    let mut json = String::with_capacity(target + 256);
    json.push('{');
    let mut n = 0u64;
    while json.len() < target {
        if n > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            "\"t{n}\":{{\"dtype\":\"U8\",\"shape\":[{shape}],\"data_offsets\":[{n},{}]}}",
            n + 1
        ));
        n += 1;
    }
    json.push('}');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&(json.len() as u64).to_le_bytes()).unwrap();
    f.write_all(json.as_bytes()).unwrap();
    f.write_all(&vec![7u8; n as usize]).unwrap();
    f.flush().unwrap();
    json.len() as u64
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
