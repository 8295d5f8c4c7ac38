//! Parsing of fio-style sizes (`4k`, `1.5g`) and durations (`30`, `250ms`, `2m`).
//!
//! These are the rules of the fio job-file parser. (The TOML configuration takes plain
//! integers in the unit its key names, such as `capacity_bytes`.)
//!
//! Numbers are decimal, optionally with a fractional part (`1.5m`), or hexadecimal with a
//! `0x` prefix (no fraction). Arithmetic is exact: a value that does not come out as a
//! whole number of bytes (or nanoseconds) is refused instead of being silently rounded.
//! Errors are plain strings describing the problem, so that callers can wrap them in their
//! own context (the job-file parser turns them into [`crate::WorkloadError::BadValue`]).

/// A parsed non-negative number before a unit is applied, kept as an exact fraction
/// `whole + fraction_numerator / fraction_denominator`.
struct ExactNumber {
    whole: u128,
    fraction_numerator: u128,
    fraction_denominator: u128,
}

impl ExactNumber {
    /// Multiplies by `unit` and returns the exact integer result, or an error when it is
    /// fractional or does not fit in a `u64`. `what` names the unit in messages.
    fn scale(&self, unit: u64, what: &str) -> Result<u64, String> {
        let unit = u128::from(unit);
        let whole = self
            .whole
            .checked_mul(unit)
            .ok_or_else(|| "value is too large".to_string())?;
        let fraction_scaled = self
            .fraction_numerator
            .checked_mul(unit)
            .ok_or_else(|| "value is too large".to_string())?;
        if fraction_scaled % self.fraction_denominator != 0 {
            return Err(format!("value is not a whole number of {what}"));
        }
        let total = whole
            .checked_add(fraction_scaled / self.fraction_denominator)
            .ok_or_else(|| "value is too large".to_string())?;
        u64::try_from(total).map_err(|_| "value is too large".to_string())
    }
}

/// Splits `text` into its numeric part and its (possibly empty) alphabetic suffix and
/// parses the numeric part exactly.
fn split_number(text: &str) -> Result<(ExactNumber, &str), String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty value".to_string());
    }
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        let digits_end = hex
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(hex.len());
        let (digits, suffix) = hex.split_at(digits_end);
        if digits.is_empty() {
            return Err(format!("'{text}' is not a number"));
        }
        let whole = u128::from_str_radix(digits, 16).map_err(|_| "value is too large")?;
        let number = ExactNumber {
            whole,
            fraction_numerator: 0,
            fraction_denominator: 1,
        };
        return Ok((number, suffix));
    }
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number_text, suffix) = text.split_at(number_end);
    let (whole_text, fraction_text) = match number_text.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (number_text, ""),
    };
    if whole_text.is_empty() && fraction_text.is_empty() {
        return Err(format!("'{text}' does not start with a number"));
    }
    if fraction_text.contains('.') {
        return Err(format!("'{text}' has more than one decimal point"));
    }
    // More than 30 fractional digits cannot change a 64-bit result and would overflow the
    // exact denominator, so refuse them rather than rounding silently.
    if fraction_text.len() > 30 {
        return Err(format!("'{text}' has too many fractional digits"));
    }
    let whole = if whole_text.is_empty() {
        0
    } else {
        whole_text
            .parse::<u128>()
            .map_err(|_| "value is too large".to_string())?
    };
    let (fraction_numerator, fraction_denominator) = if fraction_text.is_empty() {
        (0, 1)
    } else {
        let numerator = fraction_text
            .parse::<u128>()
            .map_err(|_| "value is too large".to_string())?;
        // The length check above keeps this power within u128.
        let denominator = 10u128.pow(fraction_text.len() as u32);
        (numerator, denominator)
    };
    let number = ExactNumber {
        whole,
        fraction_numerator,
        fraction_denominator,
    };
    Ok((number, suffix))
}

/// Parses a byte count the way fio does with its default `kb_base=1024`.
///
/// Accepted: a plain integer (bytes), optionally followed by `b`; or a number followed by
/// one of the suffixes `k`, `m`, `g`, `t`, `p`, each optionally followed by `b` or `ib`
/// (`4k`, `4kb`, `4KiB`), case-insensitively. Every suffix is a power of 1024.
///
/// Note: fio in its default compatibility mode reads the IEC forms (`KiB`) as powers of
/// 1000; this parser deliberately treats every spelling as a power of 1024, because users
/// writing `KiB` almost always mean 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
    parse_size_with_kb_base(text, 1024)
}

/// Parses a byte count under fio's `kb_base`: with 1024 as [`parse_size`] does; with 1000,
/// fio's SI mode, the SI spellings (`k`, `kb`, `m`, ...) are powers of 1000 and the IEC ones
/// (`kib`, `mib`, ...) powers of 1024. Any other base is refused.
pub fn parse_size_with_kb_base(text: &str, kb_base: u64) -> Result<u64, String> {
    if kb_base != 1000 && kb_base != 1024 {
        return Err(format!("kb_base {kb_base} is neither 1000 nor 1024"));
    }
    let (number, suffix) = split_number(text)?;
    let suffix = suffix.to_ascii_lowercase();
    let (prefix, iec) = match suffix.strip_suffix("ib") {
        Some(prefix) => (prefix, true),
        None => (suffix.strip_suffix('b').unwrap_or(&suffix), false),
    };
    let power: u32 = match prefix {
        "" if !iec => 0,
        "k" => 1,
        "m" => 2,
        "g" => 3,
        "t" => 4,
        "p" => 5,
        _ => {
            return Err(format!(
                "unknown size suffix '{suffix}' (expected k, m, g, t or p)"
            ))
        }
    };
    let base: u64 = if kb_base == 1000 && !iec { 1000 } else { 1024 };
    number.scale(base.pow(power), "bytes")
}

/// One nanosecond, the unit all durations are returned in.
pub const NS_PER_NS: u64 = 1;
/// Nanoseconds per microsecond.
pub const NS_PER_US: u64 = 1_000;
/// Nanoseconds per millisecond.
pub const NS_PER_MS: u64 = 1_000_000;
/// Nanoseconds per second.
pub const NS_PER_S: u64 = 1_000_000_000;

/// Parses a fio time value whose bare numbers are seconds (as for `runtime` and
/// `ramp_time`) and returns nanoseconds. See [`parse_duration_ns_default_unit`].
pub fn parse_duration_ns(text: &str) -> Result<u64, String> {
    parse_duration_ns_default_unit(text, NS_PER_S)
}

/// Parses a fio time value and returns nanoseconds.
///
/// A bare number is in units of `default_unit_ns` (fio reads `runtime=30` as seconds but
/// `thinktime=30` as microseconds, so the caller says which). Accepted suffixes,
/// case-insensitively: `ns`/`nsec`, `us`/`usec`, `ms`/`msec`, `s`/`sec`, `m`/`min`
/// (minutes, not milliseconds), `h`/`hour`, `d`/`day`.
pub fn parse_duration_ns_default_unit(text: &str, default_unit_ns: u64) -> Result<u64, String> {
    let (number, suffix) = split_number(text)?;
    let unit_ns: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" => default_unit_ns,
        "ns" | "nsec" => NS_PER_NS,
        "us" | "usec" => NS_PER_US,
        "ms" | "msec" => NS_PER_MS,
        "s" | "sec" => NS_PER_S,
        "m" | "min" => 60 * NS_PER_S,
        "h" | "hour" => 3_600 * NS_PER_S,
        "d" | "day" => 86_400 * NS_PER_S,
        _ => {
            return Err(format!(
                "unknown time suffix '{suffix}' (expected us, ms, s, m or h)"
            ))
        }
    };
    number.scale(unit_ns, "nanoseconds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_integers_are_bytes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size(" 512 "), Ok(512));
        assert_eq!(parse_size("512b"), Ok(512));
    }

    #[test]
    fn all_suffix_spellings_are_powers_of_1024() {
        for text in ["4k", "4K", "4kb", "4KB", "4KiB", "4kib"] {
            assert_eq!(parse_size(text), Ok(4096), "{text}");
        }
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("3g"), Ok(3 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("1p"), Ok(1 << 50));
    }

    #[test]
    fn fractions_and_hex_are_exact() {
        assert_eq!(parse_size("1.5k"), Ok(1536));
        assert_eq!(parse_size(".5m"), Ok(512 << 10));
        assert_eq!(parse_size("0x1000"), Ok(4096));
        assert_eq!(parse_size("0x10k"), Ok(16 << 10));
        assert!(parse_size("1.5").is_err(), "half a byte is not a size");
    }

    #[test]
    fn malformed_sizes_are_errors() {
        for text in [
            "",
            "k",
            "-4k",
            "4x",
            "4 k",
            "1.2.3",
            "0x",
            "99999999999999999999p",
        ] {
            assert!(parse_size(text).is_err(), "{text:?} should be refused");
        }
        assert!(parse_size("16384p").is_err(), "2^64 bytes overflows");
    }

    #[test]
    fn durations_default_to_the_given_unit() {
        assert_eq!(parse_duration_ns("30"), Ok(30 * NS_PER_S));
        assert_eq!(
            parse_duration_ns_default_unit("30", NS_PER_US),
            Ok(30 * NS_PER_US)
        );
    }

    #[test]
    fn duration_suffixes() {
        assert_eq!(parse_duration_ns("5us"), Ok(5_000));
        assert_eq!(parse_duration_ns("5usec"), Ok(5_000));
        assert_eq!(parse_duration_ns("5ms"), Ok(5_000_000));
        assert_eq!(parse_duration_ns("5MSEC"), Ok(5_000_000));
        assert_eq!(parse_duration_ns("5s"), Ok(5 * NS_PER_S));
        assert_eq!(parse_duration_ns("2m"), Ok(120 * NS_PER_S));
        assert_eq!(parse_duration_ns("1h"), Ok(3_600 * NS_PER_S));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration_ns("7ns"), Ok(7));
    }

    #[test]
    fn malformed_durations_are_errors() {
        for text in ["", "s", "5 parsecs", "5y", "-1", "0.5ns"] {
            assert!(
                parse_duration_ns(text).is_err(),
                "{text:?} should be refused"
            );
        }
    }
}
