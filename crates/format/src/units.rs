//! Byte counts as people write them: `4096`, `64KiB`, `512MiB`, `2G`,
//! `1.5GiB`. Every unit is binary, as in memory flags: `K`, `KB` and `KiB`
//! are all 1024 bytes. The one parser of sizes: configuration keys, budgets
//! and command-line flags all go through it.

/// Suffixes, longest first so `kib` is not read as `b`.
const UNITS: [(&str, u64); 13] = [
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("kb", 1 << 10),
    ("mb", 1 << 20),
    ("gb", 1 << 30),
    ("tb", 1 << 40),
    ("k", 1 << 10),
    ("m", 1 << 20),
    ("g", 1 << 30),
    ("t", 1 << 40),
    ("b", 1),
];

/// Parses a byte count. Whole numbers are exact; fractions (`1.5GiB`) are
/// rounded to the nearest byte. The error says why, for messages that name
/// the key.
pub fn parse_bytes(s: &str) -> Result<u64, &'static str> {
    let lower = s.trim().to_ascii_lowercase();
    let (number, unit) = UNITS
        .iter()
        .find_map(|&(suffix, unit)| lower.strip_suffix(suffix).map(|n| (n.trim(), unit)))
        .unwrap_or((lower.as_str(), 1));
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err("not a byte count (e.g. 4096, 64KiB, 512MiB, 2G)");
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(unit).ok_or("too large");
    }
    let x: f64 = number.parse().map_err(|_| "not a number")?;
    let bytes = (x * unit as f64).round();
    if !(bytes.is_finite() && bytes < u64::MAX as f64) {
        return Err("too large");
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("1.5g"), Ok(3 << 29));
        assert_eq!(parse_bytes("2 MiB"), Ok(2 << 20));
        assert_eq!(parse_bytes("16384T"), Ok(1 << 54));
        assert_eq!(parse_bytes(" 7b "), Ok(7));
        assert_eq!(parse_bytes("0.5k"), Ok(512));
        assert!(parse_bytes("10%").is_err());
        assert!(parse_bytes("x").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("1e3").is_err());
        assert!(parse_bytes("kib").is_err());
        assert_eq!(parse_bytes("99999999999T"), Err("too large"));
        assert_eq!(parse_bytes("1.0.0"), Err("not a number"));
    }
}
