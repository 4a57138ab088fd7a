//! Byte counts as people write them: `4096`, `64KiB`, `512MiB`, `2G`,
//! `1.5GiB`. Every unit is binary, as in memory flags: `K`, `KB` and `KiB`
//! are all 1024 bytes. The one parser of sizes: configuration keys, budgets
//! and command-line flags all go through it. Durations likewise:
//! [`parse_duration`] reads every duration key (`peer_timeout`,
//! `stall_timeout`) and flag.

use std::time::Duration;

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

/// Parses a duration: `"30s"`, `"500ms"`, `"2m"`, or plain seconds
/// (`"1.5"`); more than 0 and at most 10^9 seconds. The error says what was
/// expected, for messages that name the key.
pub fn parse_duration(s: &str) -> Result<Duration, &'static str> {
    const EXPECTED: &str = "expected e.g. \"30s\", \"500ms\", \"2m\" or a number of seconds";
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| EXPECTED)?;
    seconds(v * scale).ok_or(EXPECTED)
}

/// `secs` seconds as a duration: more than 0 and at most 10^9, else None.
pub fn seconds(secs: f64) -> Option<Duration> {
    (secs.is_finite() && secs > 0.0 && secs <= 1e9).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, parse_duration};
    use std::time::Duration;

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

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration(" 1.5 "), Ok(Duration::from_millis(1500)));
        for bad in ["0s", "-1s", "soon", "", "1h", "nan", "inf", "1e10"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
