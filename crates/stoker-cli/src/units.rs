//! Sizes and durations as people type them, one way for every command.

use std::time::Duration;

/// `256MiB`, `1.5GB`, `64K`, `4096`: binary units with `i` (or a bare K/M/G/T), decimal with
/// `B` alone; at least 1 byte.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("`{s}` is not a size; write e.g. 256MiB, 1GB or 4096"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => return Err(format!("unknown unit `{other}` in `{s}`; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB")),
    };
    let bytes = n * mult as f64;
    if !(1.0..=u64::MAX as f64).contains(&bytes) {
        return Err(format!("`{s}` is out of range; a size is at least 1 byte"));
    }
    Ok(bytes as u64)
}

/// `20ms`, `1.5s`, `250us`, `2m`, or a bare number of milliseconds; at most 24 hours.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("`{s}` is not a duration; write it like 20ms, 1.5s or 250us"))?;
    let seconds = match unit.trim() {
        "" | "ms" => value / 1e3,
        "s" => value,
        "us" | "µs" => value / 1e6,
        "ns" => value / 1e9,
        "m" | "min" => value * 60.0,
        other => return Err(format!("unknown unit `{other}` in `{s}`; use ns, us, ms, s or m")),
    };
    if !(0.0..=86_400.0).contains(&seconds) {
        return Err(format!("`{s}` is out of range (0 to 24 h)"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_units() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert!(parse_size("12 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse_size("MiB").is_err() && parse_size("x").is_err());
        assert!(parse_size("0").is_err() && parse_size("99999999999T").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20ms").unwrap(), Duration::from_millis(20));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_millis(7));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("fast").is_err() && parse_duration("3h").is_err() && parse_duration("-1s").is_err());
        assert!(parse_duration("3 parsecs").unwrap_err().contains("parsecs"));
        assert!(parse_duration("25h").is_err(), "bare numbers are ms, but a day is the limit");
    }
}
