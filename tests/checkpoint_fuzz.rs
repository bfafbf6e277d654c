//! A fuzz test of the header parser that runs on stable Rust in every `cargo test`: 100,000
//! random and mutated headers. The parser must never panic; whatever it accepts must be a
//! consistent table that the reference `safetensors` crate accepts too; well-formed headers
//! must be accepted. (`fuzz/` holds the cargo-fuzz target for longer, coverage-guided runs.)

use fastensor::checkpoint::parse_header;
use fastensor::DType;
use safetensors::SafeTensors;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A well-formed header for a few random tensors, and its data length.
fn valid_json(rng: &mut Rng) -> (String, u64) {
    let n = rng.below(6);
    let mut parts = Vec::new();
    if rng.below(3) == 0 {
        parts.push(r#""__metadata__":{"format":"pt","k\"":"v"}"#.to_string());
    }
    let mut pos = 0;
    for i in 0..n {
        let d = DType::ALL[rng.below(DType::ALL.len() as u64) as usize];
        let rank = rng.below(4);
        let mut shape: Vec<u64> = (0..rank).map(|_| rng.below(5)).collect();
        if d.size().is_none() {
            shape.push(4); // packed dtypes: whole bytes
        }
        let len = shape.iter().product::<u64>() * d.bits() as u64 / 8;
        let shape_s: Vec<String> = shape.iter().map(u64::to_string).collect();
        parts.push(format!(
            r#""t{i}":{{"dtype":"{}","shape":[{}],"data_offsets":[{pos},{}]}}"#,
            d.name(),
            shape_s.join(","),
            pos + len
        ));
        pos += len;
    }
    (format!("{{{}}}", parts.join(",")), pos)
}

fn file_of(json: &[u8], data_len: u64) -> Vec<u8> {
    let mut f = (json.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(json);
    f.resize(f.len() + data_len as usize, 0);
    f
}

fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    const TOKENS: [&[u8]; 12] = [
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b"\"",
        b"0",
        b"18446744073709551615",
        b"-1",
        b"\"data_offsets\"",
        b"\"__metadata__\"",
    ];
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len() as u64 + 1) as usize;
        match rng.below(6) {
            0 if at < bytes.len() => bytes[at] = rng.next() as u8,
            1 if at < bytes.len() => {
                bytes.remove(at);
            }
            2 => bytes
                .splice(at..at, TOKENS[rng.below(12) as usize].iter().copied())
                .for_each(drop),
            3 => bytes.truncate(at),
            4 if at < bytes.len() && bytes[at].is_ascii_digit() => {
                bytes[at] = b'0' + rng.below(10) as u8
            }
            _ => bytes.insert(at, b"0123456789,:{}[]\" "[rng.below(18) as usize]),
        }
    }
}

fn check(bytes: &[u8], file_len: u64, must_accept: bool) {
    let res = parse_header(bytes, file_len);
    if must_accept {
        assert!(
            res.is_ok(),
            "{:?}: {}",
            String::from_utf8_lossy(bytes),
            res.unwrap_err()
        );
    }
    let Ok(h) = res else { return };
    // Accepted: a consistent table covering the data section exactly.
    let mut pos = 0;
    for e in h.entries() {
        assert_eq!(e.offsets.start, pos);
        assert_eq!(e.byte_len(), e.desc.byte_len().unwrap());
        pos = e.offsets.end;
    }
    assert_eq!(pos, h.data_len());
    assert_eq!(h.data_start() + h.data_len(), file_len);
    // The reference crate accepts it too (when the file is small enough to build).
    if file_len <= 1 << 16 {
        let mut file = bytes[..h.data_start() as usize].to_vec();
        file.resize(file_len as usize, 0);
        let st = SafeTensors::deserialize(&file).unwrap_or_else(|e| {
            panic!(
                "we accept but safetensors refuses ({e}): {:?}",
                String::from_utf8_lossy(bytes)
            )
        });
        assert_eq!(st.len(), h.entries().len());
    }
}

#[test]
fn hostile_headers_never_panic() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let iterations = 100_000;
    let mut accepted = 0;
    for i in 0..iterations {
        let (json, data_len) = valid_json(&mut rng);
        match i % 4 {
            // Well-formed: must be accepted.
            0 => {
                let f = file_of(json.as_bytes(), data_len);
                check(&f, f.len() as u64, true);
                accepted += 1;
            }
            // Mutated JSON, honest length prefix.
            1 => {
                let mut j = json.into_bytes();
                mutate(&mut rng, &mut j);
                let f = file_of(&j, data_len + rng.below(3));
                let file_len = f.len() as u64 - rng.below(2);
                if parse_header(&f, file_len).is_ok() {
                    accepted += 1;
                }
                check(&f, file_len, false);
            }
            // Mutated whole file, length prefix included.
            2 => {
                let mut f = file_of(json.as_bytes(), data_len);
                mutate(&mut rng, &mut f);
                check(&f, f.len() as u64, false);
                check(&f, rng.next(), false);
            }
            // Random bytes, random claimed file length.
            _ => {
                let len = rng.below(64) as usize;
                let f: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                check(&f, rng.next() >> rng.below(64), false);
                let mut g = rng.below(200).to_le_bytes().to_vec();
                g.extend(f);
                check(&g, g.len() as u64, false);
            }
        }
    }
    assert!(accepted >= iterations / 4);
}

#[test]
fn huge_claims_allocate_nothing() {
    // A header length near u64::MAX, and one that fits the limit but not the file.
    for n in [u64::MAX, u64::MAX - 7, 100_000_001, 99_999_999] {
        let mut f = n.to_le_bytes().to_vec();
        f.extend_from_slice(b"{}");
        assert!(parse_header(&f, f.len() as u64).is_err());
        assert!(parse_header(&f, u64::MAX).is_err());
    }
    // A shape claiming exabytes within a tiny file.
    let json = br#"{"a":{"dtype":"F64","shape":[1000000000,1000000000],"data_offsets":[0,8000000000000000000]}}"#;
    let f = file_of(json, 0);
    assert!(parse_header(&f, f.len() as u64).is_err());
    // Deep nesting is refused by the JSON parser's recursion limit, not a stack overflow.
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let f = file_of(deep.as_bytes(), 0);
    assert!(parse_header(&f, f.len() as u64).is_err());
}
