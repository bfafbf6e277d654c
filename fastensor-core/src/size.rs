//! Byte sizes written by people: the one parser of every place that reads one (backend
//! knobs, the `fastensor` command's options, the CUDA stand-in's settings, and Python's
//! `max_shard_size`, through the native module).
//!
//! A size is a number, optionally with a fraction (rounded down to a whole byte), and an
//! optional unit (any case, a space allowed before it):
//!
//! | unit | means |
//! |---|---|
//! | none, `B` | bytes |
//! | `K`, `M`, `G`, `T` and `KiB`, `MiB`, `GiB`, `TiB` | powers of 1024: `4K` = 4096 |
//! | `KB`, `MB`, `GB`, `TB` | powers of 1000, as Hugging Face's `max_shard_size` reads them: `5GB` = 5 000 000 000 |
//!
//! [`format_size`] writes the binary short form (`512K`, `4M`, `1G`), which reads back as
//! the same number.

/// The bytes `text` names (see the module), or why it names none.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("`{text}` is not a size (examples: 4096, 4K, 512MiB, 5GB)");
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit = unit.trim_start().to_ascii_uppercase();
    let mult: u64 = match unit.as_str() {
        "" | "B" => 1,
        "K" | "KIB" => 1 << 10,
        "M" | "MIB" => 1 << 20,
        "G" | "GIB" => 1 << 30,
        "T" | "TIB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "`{text}`: unknown unit `{unit}` (K, M, G, T or KiB, ...: powers of 1024; \
                 KB, MB, GB, TB: powers of 1000)"
            ))
        }
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(bad());
    }
    let digits = |s: &str| -> Result<u128, String> {
        if s.is_empty() {
            return Ok(0);
        }
        s.parse::<u128>().map_err(|_| bad())
    };
    // Exact: (whole + fraction / 10^k) * mult, rounded down.
    let scale = 10u128
        .checked_pow(u32::try_from(fraction.len()).map_err(|_| bad())?)
        .ok_or_else(bad)?;
    let n = digits(whole)?
        .checked_mul(scale)
        .and_then(|w| w.checked_add(digits(fraction).ok()?))
        .and_then(|v| v.checked_mul(u128::from(mult)))
        .map(|v| v / scale)
        .ok_or_else(|| format!("`{text}` is too large"))?;
    u64::try_from(n).map_err(|_| format!("`{text}` is too large"))
}

/// `bytes` as [`parse_size`] reads it back, in the largest binary unit that divides it:
/// `512K`, `4M`, `1G`, or plain bytes.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_units_read_as_the_module_says() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size(" 4K "), Ok(4096));
        assert_eq!(parse_size("4kib"), Ok(4096));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("5 gb"), Ok(5_000_000_000));
        assert_eq!(parse_size("40KB"), Ok(40_000));
        assert_eq!(parse_size("1.5kb"), Ok(1500));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("0.3B"), Ok(0));
        assert_eq!(parse_size("2TB"), Ok(2_000_000_000_000));
    }

    #[test]
    fn anything_else_is_refused_with_the_text() {
        for bad in [
            "",
            "lots",
            "-1GB",
            "4X",
            "1.2.3K",
            ".",
            "GB",
            "99999999999999999999T",
        ] {
            let err = parse_size(bad).unwrap_err();
            assert!(err.contains(&format!("`{bad}`")), "{bad}: {err}");
        }
    }

    #[test]
    fn formatted_sizes_read_back() {
        for n in [1000, 4096, 512 << 10, 4 << 20, 3 << 30, 1 << 40, 4097] {
            assert_eq!(parse_size(&format_size(n)), Ok(n));
        }
        assert_eq!(format_size(4 << 20), "4M");
        assert_eq!(format_size(1000), "1000");
    }
}
