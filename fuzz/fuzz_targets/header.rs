//! Fuzzes the safetensors header parser: it must never panic, and whatever it accepts must be
//! a consistent table. Run with `cargo +nightly fuzz run header` from the repository root.
#![no_main]

use fastensor::checkpoint::parse_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for file_len in [data.len() as u64, u64::MAX] {
        if let Ok(h) = parse_header(data, file_len) {
            let mut pos = 0;
            for e in h.entries() {
                assert_eq!(e.offsets.start, pos);
                assert_eq!(Some(e.byte_len()), e.desc.byte_len().ok());
                pos = e.offsets.end;
            }
            assert_eq!(h.data_start() + pos, file_len);
        }
    }
});
