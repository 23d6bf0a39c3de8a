//! Durations (`7d`, `12h`, `1d12h`), sizes (`50G`, `512M`, `1.5T`) and their
//! human forms.

use std::time::Duration;

const UNITS_S: [(char, u64); 5] = [
    ('w', 7 * 86_400),
    ('d', 86_400),
    ('h', 3_600),
    ('m', 60),
    ('s', 1),
];

/// One or more `<integer><unit>` groups, unit one of s, m, h, d, w:
/// `30m`, `12h`, `7d`, `1d12h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || {
        format!("{s:?} is not a duration: use a number and a unit (s, m, h, d, w), e.g. 30m, 12h, 7d, 1d12h")
    };
    if s.is_empty() {
        return Err(err());
    }
    let mut total: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
        if digits == 0 {
            return Err(err());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| err())?;
        let unit = rest[digits..].chars().next().ok_or_else(err)?;
        let (_, mult) = UNITS_S.iter().find(|(u, _)| *u == unit).ok_or_else(err)?;
        total = n
            .checked_mul(*mult)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(err)?;
        rest = &rest[digits + unit.len_utf8()..];
    }
    Ok(Duration::from_secs(total))
}

/// Exact, in the form [`parse_duration`] reads: `1d12h`, `7d`, `0s`.
pub fn format_duration(d: Duration) -> String {
    let mut secs = d.as_secs();
    if secs == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    // Weeks are shown as days: "14d" reads better than "2w".
    for (unit, mult) in &UNITS_S[1..] {
        if secs >= *mult {
            out.push_str(&format!("{}{unit}", secs / mult));
            secs %= mult;
        }
    }
    out
}

/// The largest whole unit: `10d`, `3h`, `5m`, `42s`.
pub fn human_age(d: Duration) -> String {
    let secs = d.as_secs();
    for (unit, mult) in &UNITS_S[1..] {
        if secs >= *mult {
            return format!("{}{unit}", secs / mult);
        }
    }
    "0s".into()
}

/// Bytes, or a number with a binary multiplier K, M, G, T (1G = 1024^3;
/// `Ki`/`KiB`/`KB` spellings and lower case are accepted, as are fractions:
/// `1.5G`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let err = || {
        format!("{s:?} is not a size: use bytes or a number with K, M, G or T (powers of 1024), e.g. 512M, 50G")
    };
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "ki" | "kb" | "kib" => 10,
        "m" | "mi" | "mb" | "mib" => 20,
        "g" | "gi" | "gb" | "gib" => 30,
        "t" | "ti" | "tb" | "tib" => 40,
        _ => return Err(err()),
    };
    let mult = 1u64 << shift;
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') {
        return Err(err());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(err);
    }
    let f: f64 = num.parse().map_err(|_| err())?;
    let bytes = f * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes.round() as u64)
}

/// Binary units with one decimal, as `ctr` shows sizes: `512 B`, `1.5 KiB`,
/// `2.0 GiB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `1.5 KiB (1536 bytes)`, or `512 bytes` below a KiB.
pub fn size_and_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes} bytes")
    } else {
        format!("{} ({bytes} bytes)", human_size(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_every_unit_and_in_groups() {
        let s = |n| Ok(Duration::from_secs(n));
        assert_eq!(parse_duration("45s"), s(45));
        assert_eq!(parse_duration("30m"), s(30 * 60));
        assert_eq!(parse_duration("12h"), s(12 * 3600));
        assert_eq!(parse_duration("7d"), s(7 * 86_400));
        assert_eq!(parse_duration("2w"), s(14 * 86_400));
        assert_eq!(parse_duration("1d12h"), s(86_400 + 12 * 3600));
        assert_eq!(parse_duration("0s"), s(0));
    }

    #[test]
    fn bad_durations_are_refused_with_the_input_named() {
        for bad in [
            "", "7", "d", "7x", "7 d", "-1d", "1.5d", "7dd", "1d2", " 7d",
        ] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
        assert!(parse_duration("99999999999999999999w").is_err(), "overflow");
        assert!(parse_duration("40000000000000w").is_err(), "overflow");
    }

    #[test]
    fn durations_format_back_exactly() {
        for text in ["0s", "45s", "30m", "12h", "7d", "1d12h", "1d0h1s"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d, "{text}");
        }
        assert_eq!(
            format_duration(Duration::from_secs(86_400 + 43_200)),
            "1d12h"
        );
        assert_eq!(format_duration(Duration::from_secs(14 * 86_400)), "14d");
        assert_eq!(format_duration(Duration::from_secs(3_601)), "1h1s");
    }

    #[test]
    fn ages_show_the_largest_unit() {
        assert_eq!(human_age(Duration::from_secs(0)), "0s");
        assert_eq!(human_age(Duration::from_secs(59)), "59s");
        assert_eq!(human_age(Duration::from_secs(60)), "1m");
        assert_eq!(human_age(Duration::from_secs(2 * 3600 + 59)), "2h");
        assert_eq!(human_age(Duration::from_secs(10 * 86_400 + 5)), "10d");
    }

    #[test]
    fn sizes_parse_with_binary_multipliers() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512MB"), Ok(512 << 20));
        assert_eq!(parse_size("50G"), Ok(50 << 30));
        assert_eq!(parse_size("50Gi"), Ok(50 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("0.5K"), Ok(512));
    }

    #[test]
    fn bad_sizes_are_refused_with_the_input_named() {
        for bad in [
            "", "G", "50X", "50 G", "-1G", "1.G", ".5G", "1..5G", "5GG", "1e3",
        ] {
            let err = parse_size(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
        assert!(parse_size("99999999999T").is_err(), "overflow");
        assert!(parse_size("18446744073709551616").is_err(), "overflow");
    }

    #[test]
    fn sizes_read_like_ctr() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1024), "1.0 KiB");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(52 << 20), "52.0 MiB");
        assert_eq!(human_size(3 << 29), "1.5 GiB");
        assert_eq!(human_size(u64::MAX), "16.0 EiB");
        assert_eq!(size_and_bytes(1000), "1000 bytes");
        assert_eq!(size_and_bytes(1536), "1.5 KiB (1536 bytes)");
    }
}
