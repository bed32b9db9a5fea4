//! AMQP headers as text pairs, and back.
//!
//! Handlers see headers as `(name, value)` strings (the WIT `message.headers`), and
//! publishers from other languages put numbers as any integer width or as strings, so
//! reading is lenient and writing is explicit.

use std::time::{Duration, SystemTime};

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde_json::Value as Json;

/// A header name longer than AMQP's 255-byte short-string limit.
#[derive(Debug, thiserror::Error)]
#[error("header name is {len} bytes long; AMQP allows at most 255: {preview}...")]
pub struct HeaderNameTooLong {
    /// Length in bytes.
    pub len: usize,
    /// The first characters, to find it.
    pub preview: String,
}

/// All headers as text pairs, in name order. See [`value_to_text`] for the rendering.
pub fn to_text_pairs(table: &FieldTable) -> Vec<(String, String)> {
    table
        .into_iter()
        .map(|(k, v)| (k.as_str().to_owned(), value_to_text(v)))
        .collect()
}

/// One value as text: strings as they are (invalid UTF-8 replaced), numbers in decimal,
/// booleans as `true`/`false`, timestamps in RFC 3339 (UTC), byte arrays in hex, void as
/// the empty string, nested arrays and tables as JSON.
pub fn value_to_text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::Timestamp(t) => rfc3339(*t),
        AMQPValue::ByteArray(b) => hex::encode(b.as_slice()),
        AMQPValue::Void => String::new(),
        AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_) => to_json(value).to_string(),
        other => match to_json(other) {
            Json::String(s) => s,
            json => json.to_string(),
        },
    }
}

/// A value as JSON, for nested arrays and tables (e.g. RabbitMQ's `x-death`).
pub fn to_json(value: &AMQPValue) -> Json {
    match value {
        AMQPValue::Boolean(b) => Json::Bool(*b),
        AMQPValue::ShortShortInt(n) => Json::from(*n),
        AMQPValue::ShortShortUInt(n) => Json::from(*n),
        AMQPValue::ShortInt(n) => Json::from(*n),
        AMQPValue::ShortUInt(n) => Json::from(*n),
        AMQPValue::LongInt(n) => Json::from(*n),
        AMQPValue::LongUInt(n) => Json::from(*n),
        AMQPValue::LongLongInt(n) => Json::from(*n),
        AMQPValue::Float(f) => Json::from(*f),
        AMQPValue::Double(f) => Json::from(*f),
        AMQPValue::DecimalValue(d) => Json::String(decimal(d.value, d.scale)),
        AMQPValue::ShortString(_)
        | AMQPValue::LongString(_)
        | AMQPValue::Timestamp(_)
        | AMQPValue::ByteArray(_) => Json::String(value_to_text(value)),
        AMQPValue::FieldArray(a) => Json::Array(a.as_slice().iter().map(to_json).collect()),
        AMQPValue::FieldTable(t) => Json::Object(
            t.into_iter()
                .map(|(k, v)| (k.as_str().to_owned(), to_json(v)))
                .collect(),
        ),
        AMQPValue::Void => Json::Null,
    }
}

/// A table of long-string headers from text pairs (later duplicates win).
pub fn table_from_text<K, V>(
    pairs: impl IntoIterator<Item = (K, V)>,
) -> Result<FieldTable, HeaderNameTooLong>
where
    K: AsRef<str>,
    V: AsRef<str>,
{
    let mut table = FieldTable::default();
    for (k, v) in pairs {
        insert(
            &mut table,
            k.as_ref(),
            AMQPValue::LongString(LongString::from(v.as_ref())),
        )?;
    }
    Ok(table)
}

/// Sets one header. Fails instead of panicking (as lapin's `From<&str>` would) on a name
/// over 255 bytes, since names can come from plugins.
pub fn insert(
    table: &mut FieldTable,
    name: &str,
    value: AMQPValue,
) -> Result<(), HeaderNameTooLong> {
    let key = ShortString::try_new(name).map_err(|_| HeaderNameTooLong {
        len: name.len(),
        preview: name.chars().take(40).collect(),
    })?;
    table.insert(key, value);
    Ok(())
}

/// Reads an integer header whatever the sender's encoding: any integer width, an integral
/// float, or a decimal string (surrounding spaces allowed). `None` when absent or not an
/// integer that fits in `i64`.
pub fn header_int(table: Option<&FieldTable>, name: &str) -> Option<i64> {
    match table?.inner().get(name)? {
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        AMQPValue::Float(f) => integral(f64::from(*f)),
        AMQPValue::Double(f) => integral(*f),
        AMQPValue::ShortString(s) => s.as_str().trim().parse().ok(),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.trim().parse().ok(),
        _ => None,
    }
}

/// Reads a header as text (see [`value_to_text`]); `None` when absent.
pub fn header_text(table: Option<&FieldTable>, name: &str) -> Option<String> {
    table?.inner().get(name).map(value_to_text)
}

fn integral(f: f64) -> Option<i64> {
    // i64::MAX as f64 rounds up to 2^63, so the upper bound is exclusive.
    (f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64).then_some(f as i64)
}

fn decimal(value: u32, scale: u8) -> String {
    let digits = value.to_string();
    let scale = usize::from(scale);
    if scale == 0 {
        return digits;
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{int}.{frac}")
}

fn rfc3339(secs: u64) -> String {
    match SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs)) {
        Some(t) => humantime::format_rfc3339_seconds(t).to_string(),
        None => secs.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{ByteArray, DecimalValue, FieldArray};

    fn table(pairs: Vec<(&str, AMQPValue)>) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert(k.into(), v);
        }
        t
    }

    #[test]
    fn renders_every_kind_as_text() {
        let nested = table(vec![
            ("count", AMQPValue::LongLongInt(2)),
            ("queue", AMQPValue::LongString("q".into())),
        ]);
        let t = table(vec![
            ("b", AMQPValue::Boolean(true)),
            ("i", AMQPValue::ShortShortInt(-3)),
            ("u", AMQPValue::LongUInt(7)),
            ("d", AMQPValue::Double(1.5)),
            (
                "dec",
                AMQPValue::DecimalValue(DecimalValue {
                    scale: 3,
                    value: 1234,
                }),
            ),
            (
                "dec0",
                AMQPValue::DecimalValue(DecimalValue { scale: 2, value: 5 }),
            ),
            ("s", AMQPValue::ShortString("short".into())),
            ("l", AMQPValue::LongString(b"caf\xc3\xa9".to_vec().into())),
            ("ts", AMQPValue::Timestamp(1_700_000_000)),
            ("x", AMQPValue::ByteArray(ByteArray::from(vec![0xde, 0xad]))),
            ("v", AMQPValue::Void),
            (
                "a",
                AMQPValue::FieldArray(FieldArray::from(vec![
                    AMQPValue::LongInt(1),
                    AMQPValue::FieldTable(nested.clone()),
                ])),
            ),
            ("t", AMQPValue::FieldTable(nested)),
        ]);
        let got: std::collections::HashMap<_, _> = to_text_pairs(&t).into_iter().collect();
        let want = [
            ("b", "true"),
            ("i", "-3"),
            ("u", "7"),
            ("d", "1.5"),
            ("dec", "1.234"),
            ("dec0", "0.05"),
            ("s", "short"),
            ("l", "café"),
            ("ts", "2023-11-14T22:13:20Z"),
            ("x", "dead"),
            ("v", ""),
            ("a", r#"[1,{"count":2,"queue":"q"}]"#),
            ("t", r#"{"count":2,"queue":"q"}"#),
        ];
        for (k, v) in want {
            assert_eq!(got.get(k).map(String::as_str), Some(v), "header {k}");
        }
    }

    #[test]
    fn reads_integers_in_any_encoding() {
        let t = table(vec![
            ("a", AMQPValue::ShortShortUInt(3)),
            ("b", AMQPValue::LongLongInt(-9)),
            ("c", AMQPValue::LongString(" 42 ".into())),
            ("d", AMQPValue::ShortString("7".into())),
            ("e", AMQPValue::Double(5.0)),
            ("f", AMQPValue::Double(5.5)),
            ("g", AMQPValue::LongString("x1".into())),
            ("h", AMQPValue::Boolean(true)),
        ]);
        let got: Vec<_> = ["a", "b", "c", "d", "e", "f", "g", "h", "missing"]
            .iter()
            .map(|k| header_int(Some(&t), k))
            .collect();
        assert_eq!(
            got,
            [
                Some(3),
                Some(-9),
                Some(42),
                Some(7),
                Some(5),
                None,
                None,
                None,
                None
            ]
        );
        assert_eq!(header_int(None, "a"), None);
    }

    #[test]
    fn builds_tables_from_text_and_refuses_long_names() {
        let t = table_from_text([("x-carteiro-attempt", "2"), ("reason", "boom")])
            .expect("short names");
        assert_eq!(header_int(Some(&t), "x-carteiro-attempt"), Some(2));
        assert_eq!(header_text(Some(&t), "reason").as_deref(), Some("boom"));
        let long = "n".repeat(256);
        let err = table_from_text([(long.as_str(), "v")]).expect_err("256-byte name");
        assert_eq!(err.len, 256);
    }
}
