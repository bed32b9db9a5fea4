//! Human-friendly units in TOML: byte sizes ("64MiB") and lists of durations; a single
//! duration is read by `humantime-serde`, and the command line parses one with
//! [`parse_duration`].

use serde::{Deserialize, Deserializer, de};
use std::time::Duration;

/// Parses a byte size such as `512`, `64KiB`, `64MiB`, `1GiB` (also `KB`/`MB`/`GB`, decimal).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size; write e.g. `64MiB` or `1048576`"))?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{text}`; use B, KiB, MiB or GiB"
            ));
        }
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("size `{text}` is too large"))
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
