//! Byte sizes written as `4K`, `256M`, `1G`.

/// Parses `4096`, `4K`, `4KiB`, `16M`, `1G` (binary units).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size (examples: 4096, 4K, 16M, 1G)"))?;
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => return Err(format!("`{text}`: unknown unit `{unit}` (use K, M or G)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{text}` is too large"))
}

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
