//! Byte sizes of the command's options: read by [`fastensor::core::size::parse_size`]
//! (`4K`, `16M`, `1G`, `4KiB`: powers of 1024; `4KB`, `5GB`: powers of 1000), and written
//! for people with a binary unit.

pub use fastensor::core::size::parse_size;

/// Formats a byte count with a binary unit: `4 KiB`, `256 MiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 && (v / 1024.0).fract() == 0.0 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_format() {
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("4097").unwrap(), 4097);
        assert!(parse_size("4X").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(256 << 20), "256 MiB");
        assert_eq!(format_size(4097), "4097 B");
    }
}
