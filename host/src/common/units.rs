//! Human-friendly units in TOML: byte sizes ("64MiB", read by `bytesize`) and lists of
//! durations; a single duration is read by `humantime-serde`, and the command line parses
//! one with [`parse_duration`].

use serde::{Deserialize, Deserializer, de};
use std::time::Duration;

/// Parses a byte size such as `512`, `64KiB`, `64MiB`, `1 GiB` (also `KB`/`MB`/`GB`,
/// decimal, and the other spellings `bytesize` reads: any case, `1.5GiB`). A plain number is
/// bytes, exactly.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let size = text.parse::<bytesize::ByteSize>().map_err(|_| {
        // `bytesize` says the number or the unit was wrong in its own words; say which here.
        let unit = text.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
        if unit.len() == text.len() || unit.trim().is_empty() {
            format!("`{text}` is not a size; write e.g. `64MiB` or `1048576`")
        } else {
            let unit = unit.trim();
            format!("unknown size unit `{unit}` in `{text}`; use B, KiB, MiB or GiB")
        }
    })?;
    // `bytesize` saturates a number times its unit at `u64::MAX`.
    match size.as_u64() {
        u64::MAX if text != u64::MAX.to_string() => Err(format!("size `{text}` is too large")),
        bytes => Ok(bytes),
    }
}

/// Serde adapter for sizes: accepts an integer (bytes) or a string with a unit.
pub mod size {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => Ok(n),
            Raw::Text(t) => parse_size(&t).map_err(de::Error::custom),
        }
    }
}

/// Serde adapter for a list of durations (retry backoff tiers); a single duration is
/// `with = "humantime_serde"`.
pub mod duration_list {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
        let tiers = Vec::<humantime_serde::Serde<Duration>>::deserialize(d)?;
        Ok(tiers
            .into_iter()
            .map(humantime_serde::Serde::into_inner)
            .collect())
    }
}

/// What a valid duration looks like, added to the config error that humantime-serde gives.
pub const DURATION_HINT: &str = "write e.g. `500ms`, `5s`, `2m`";

/// Parses a duration; the error says what a valid one looks like.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("`{text}` is not a duration ({e}); {DURATION_HINT}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2KB"), Ok(2000));
        assert!(
            parse_size("12 parsecs")
                .unwrap_err()
                .contains("unknown size unit")
        );
        assert!(parse_size("lots").is_err());
    }

    /// Every spelling the hand-written parser took before `bytesize`, with its value.
    #[test]
    fn every_earlier_spelling_keeps_its_value() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("7B", 7),
            ("7 B", 7),
            ("  64MiB  ", 64 << 20),
            ("64KiB", 64 << 10),
            ("16 MiB", 16 << 20),
            ("2GiB", 2 << 30),
            ("2kB", 2_000),
            ("3MB", 3_000_000),
            ("1GB", 1_000_000_000),
            // A plain number is exact, even past what an f64 holds exactly.
            ("9007199254740993", 9_007_199_254_740_993),
            ("18446744073709551615", u64::MAX),
        ];
        for (text, bytes) in cases {
            assert_eq!(parse_size(text), Ok(*bytes), "{text}");
        }
    }

    #[test]
    fn size_errors_say_what_is_wrong() {
        let error = |text: &str| parse_size(text).unwrap_err();
        assert_eq!(
            error("lots"),
            "`lots` is not a size; write e.g. `64MiB` or `1048576`"
        );
        assert_eq!(
            error("-5MiB"),
            "`-5MiB` is not a size; write e.g. `64MiB` or `1048576`"
        );
        assert_eq!(
            error("12 parsecs"),
            "unknown size unit `parsecs` in `12 parsecs`; use B, KiB, MiB or GiB"
        );
        assert_eq!(
            error("99999999999999GiB"),
            "size `99999999999999GiB` is too large"
        );
    }

    #[test]
    fn durations_parse_and_explain_errors() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("not a duration")
        );
    }
}
