//! Durations the way Go's `time.ParseDuration` reads them (`300ms`, `1.5h`, `2h45m`, `500us`),
//! since stakater/Reloader's `pause-period` annotation and flags are Go durations.
//!
//! Hand-written rather than `kube::core::Duration`'s `FromStr`: that one computes with
//! `Duration::mul_f64` and `+=`, which panic on values like `18446744073709551615s1s` that any
//! tenant can write into an annotation. This parser does Go's integer arithmetic with checked
//! operations, so every input either parses or is an error, and callers bound the result.

use std::time::Duration;

/// The longest duration read from an annotation or a ReloadPolicy: a year.
pub const MAX_ANNOTATION_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why a duration text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?}: expected a number followed by ns, us, ms, s, m or h")]
    Syntax(String),
    #[error("invalid duration {0:?}: unknown unit {1:?} (ns, us, ms, s, m or h)")]
    Unit(String, String),
    #[error("invalid duration {0:?}: out of range")]
    Overflow(String),
    #[error("invalid duration {0:?}: must not be negative")]
    Negative(String),
    #[error("duration {text:?} is longer than the limit of {limit}")]
    TooLong { text: String, limit: String },
}

/// Go's `time.ParseDuration`, refusing negative values.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let (negative, nanos) = parse_signed(text)?;
    if negative && nanos > 0 {
        return Err(DurationError::Negative(text.into()));
    }
    Ok(Duration::from_nanos(nanos))
}

/// [`parse`], and at most `limit` long.
pub fn parse_at_most(text: &str, limit: Duration) -> Result<Duration, DurationError> {
    let d = parse(text)?;
    if d > limit {
        return Err(DurationError::TooLong { text: text.into(), limit: format_duration(limit) });
    }
    Ok(d)
}

/// `1y` style is not Go's; limits are printed in the largest whole unit.
fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s.is_multiple_of(3600) { format!("{}h", s / 3600) } else { format!("{d:?}") }
}

/// The largest magnitude in nanoseconds: Go's `int64`, whose negative side is one longer.
const MAX: u64 = 1 << 63;

/// Returns the sign and the magnitude in nanoseconds, which Go keeps in an `int64`.
fn parse_signed(orig: &str) -> Result<(bool, u64), DurationError> {
    let syntax = || DurationError::Syntax(orig.into());
    let overflow = || DurationError::Overflow(orig.into());
    let mut s = orig;
    let mut negative = false;
    if let Some(c) = s.chars().next()
        && (c == '-' || c == '+')
    {
        negative = c == '-';
        s = &s[1..];
    }
    if s == "0" {
        return Ok((negative, 0));
    }
    if s.is_empty() {
        return Err(syntax());
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        let first = s.as_bytes()[0];
        if !(first == b'.' || first.is_ascii_digit()) {
            return Err(syntax());
        }
        let (number, rest) = leading_number(s, orig)?;
        let (unit, rest) = leading_unit(rest, orig)?;
        s = rest;
        let part = number.nanos(unit).ok_or_else(overflow)?;
        total = total.checked_add(part).filter(|v| *v <= MAX).ok_or_else(overflow)?;
    }
    if !negative && total > MAX - 1 {
        return Err(overflow());
    }
    Ok((negative, total))
}

/// A number of a duration: its integer part, and its fraction as `fraction / scale`.
struct Number {
    value: u64,
    fraction: u64,
    scale: u64,
}

impl Number {
    /// The number times `unit` nanoseconds; `None` past [`MAX`].
    fn nanos(&self, unit: u64) -> Option<u64> {
        let part = self.value.checked_mul(unit).filter(|v| *v <= MAX)?;
        if self.fraction == 0 {
            return Some(part);
        }
        // float64 as in Go: the fraction is at most 19 digits, exactness is not promised.
        let extra = (self.fraction as f64) * (unit as f64 / self.scale as f64);
        if !extra.is_finite() || extra >= MAX as f64 {
            return None;
        }
        part.checked_add(extra as u64).filter(|v| *v <= MAX)
    }
}

/// The number `[0-9]*(\.[0-9]*)?` at the start of `s` (at least one digit), and the rest.
fn leading_number<'a>(s: &'a str, orig: &str) -> Result<(Number, &'a str), DurationError> {
    // The integer part: [0-9]*
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let mut value: u64 = 0;
    for b in s[..digits].bytes() {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .filter(|v| *v <= MAX)
            .ok_or_else(|| DurationError::Overflow(orig.into()))?;
    }
    let had_integer = digits > 0;
    let mut s = &s[digits..];
    // The fraction: (\.[0-9]*)? — digits past what fits are read and dropped, as Go does.
    let (mut fraction, mut scale, mut had_fraction) = (0u64, 1u64, false);
    if let Some(rest) = s.strip_prefix('.') {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        had_fraction = digits > 0;
        for b in rest[..digits].bytes() {
            match fraction
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(b - b'0')))
                .filter(|v| *v <= MAX)
                .zip(scale.checked_mul(10))
            {
                Some((f, sc)) => (fraction, scale) = (f, sc),
                None => break,
            }
        }
        s = &rest[digits..];
    }
    if !had_integer && !had_fraction {
        return Err(DurationError::Syntax(orig.into()));
    }
    Ok((Number { value, fraction, scale }, s))
}

/// The unit at the start of `s` (everything up to the next digit or dot) in nanoseconds, and
/// the rest.
fn leading_unit<'a>(s: &'a str, orig: &str) -> Result<(u64, &'a str), DurationError> {
    let unit_len = s.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(s.len());
    if unit_len == 0 {
        return Err(DurationError::Syntax(orig.into()));
    }
    let unit_text = &s[..unit_len];
    let unit: u64 = match unit_text {
        "ns" => 1,
        "us" | "\u{00b5}s" | "\u{03bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(DurationError::Unit(orig.into(), unit_text.into())),
    };
    Ok((unit, &s[unit_len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Cases from Go's own table (time_test.go, parseDurationTests).
    #[test]
    fn reads_what_go_reads() {
        let cases: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("+0", Duration::ZERO),
            ("5s", ms(5000)),
            ("30s", ms(30_000)),
            ("1478s", ms(1_478_000)),
            ("+5s", ms(5000)),
            ("5.0s", ms(5000)),
            ("5.6s", ms(5600)),
            ("5.s", ms(5000)),
            (".5s", ms(500)),
            ("1.004s", ms(1004)),
            ("100.00100s", ms(100_001)),
            ("10ns", Duration::from_nanos(10)),
            ("11us", Duration::from_micros(11)),
            ("12µs", Duration::from_micros(12)),
            ("12μs", Duration::from_micros(12)),
            ("13ms", ms(13)),
            ("15m", Duration::from_secs(900)),
            ("16h", Duration::from_secs(16 * 3600)),
            ("3h30m", Duration::from_secs(3 * 3600 + 1800)),
            ("10.5s4m", ms(250_500)),
            ("1h2m3s4ms5us6ns", Duration::from_nanos(3_723_004_005_006)),
            ("39h9m14.425s", ms(140_954_425)),
            ("52763797000ns", Duration::from_nanos(52_763_797_000)),
            ("0.3333333333333333333h", Duration::from_secs(1200)),
            ("9007199254740993ns", Duration::from_nanos((1 << 53) + 1)),
            ("9223372036854775807ns", Duration::from_nanos(i64::MAX as u64)),
            ("9223372036854775.807us", Duration::from_nanos(i64::MAX as u64)),
            ("9223372036s854ms775us807ns", Duration::from_nanos(i64::MAX as u64)),
            ("1.5m", Duration::from_secs(90)),
            ("500us", Duration::from_micros(500)),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text).as_ref(), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_what_go_refuses() {
        for text in ["", "3", "-", "s", ".", "-.", ".s", "+.s", "1d", "\u{FFFD}", "1 s", "1s "] {
            assert!(parse(text).is_err(), "{text:?} should be refused");
        }
        // Go: "overflow" for values past int64 nanoseconds.
        for text in [
            "9223372036854775810ns",
            "9223372036854775808ns",
            "9223372036854775.808us",
            "3000000h",
            "18446744073709551615s1s",
            "18446744073709551615s",
            "1s18446744073709551615h",
        ] {
            assert_eq!(parse(text), Err(DurationError::Overflow(text.into())), "{text}");
        }
        assert_eq!(parse("-5s"), Err(DurationError::Negative("-5s".into())));
    }

    #[test]
    fn bounded_parse_names_the_limit() {
        assert_eq!(parse_at_most("8760h", MAX_ANNOTATION_DURATION), Ok(MAX_ANNOTATION_DURATION));
        let err = parse_at_most("8761h", MAX_ANNOTATION_DURATION).unwrap_err();
        assert_eq!(err.to_string(), "duration \"8761h\" is longer than the limit of 8760h");
    }

    proptest::proptest! {
        /// Any text parses or is refused: never a panic, never more than Go's range.
        #[test]
        fn any_text_parses_or_is_refused(text in ".{0,40}") {
            if let Ok(d) = parse(&text) {
                proptest::prop_assert!(d.as_nanos() <= i64::MAX as u128);
            }
        }

        /// Digits and units in any mix, huge numbers included.
        #[test]
        fn number_and_unit_soup_never_panics(
            parts in proptest::collection::vec(("[0-9]{1,25}(\\.[0-9]{0,25})?", "ns|us|µs|ms|s|m|h|d"), 1..6)
        ) {
            let text: String = parts.iter().map(|(n, u)| format!("{n}{u}")).collect();
            let _ = parse(&text);
            if let Ok(d) = parse_at_most(&text, MAX_ANNOTATION_DURATION) {
                proptest::prop_assert!(d <= MAX_ANNOTATION_DURATION);
            }
        }

        /// Whole seconds, minutes and hours add up exactly.
        #[test]
        fn whole_units_add_up(h in 0u64..1000, m in 0u64..1000, s in 0u64..100_000) {
            let text = format!("{h}h{m}m{s}s");
            proptest::prop_assert_eq!(parse(&text), Ok(Duration::from_secs(h * 3600 + m * 60 + s)));
        }
    }
}
