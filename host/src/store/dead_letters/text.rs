//! How a dead letter's text is stored so that *any* [`NewDeadLetter`] can be archived: a dead
//! letter that cannot be archived loops in `Q.dlq` and trips the store gate for every route,
//! so "the store cannot hold this text" must never be an answer.
//!
//! Each text column (`route`, `queue`, `reason`, `plugin`) holds the text verbatim when it
//! can, and otherwise a visible stand-in:
//! - a NUL byte (U+0000, which PostgreSQL text cannot hold) is shown as the six characters
//!   `\u{0}`;
//! - text longer than the column's cap ([`SHORT_MAX`] for `route`, `queue` and `plugin`,
//!   since `route` is indexed; [`TEXT_MAX`] for `reason`) is cut on a character boundary and
//!   ends with `…[cut: N more bytes]`.
//!
//! Whenever a column holds a stand-in, the exact original text of that field is kept in the
//! `original` column as JSON (`{"route": "...", "reason": "..."}`, where JSON escapes NUL as
//! `\u0000`), and reading the row gives the original back: the encoding is lossless, and
//! `original IS NOT NULL` marks the rows that use it. Text as is never needs unescaping, so
//! a reason that really contains the characters `\u{0}` reads back unchanged.
//!
//! Headers are stored as JSON text (any string, NUL included, survives). The one lossy case
//! is size: an original text field, or the headers' JSON, over [`TEXT_MAX`] (16 MiB; AMQP
//! headers travel in one frame of at most `frame_max`, 128 KiB by default, so only an
//! in-process caller can get there) keeps its first 16 MiB, and `original.cut` records the
//! field's full length in bytes (for headers: how many entries were dropped). The body is
//! always stored verbatim.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::store::headers_to_json;

/// A message to archive, and what an archived `DeadLetter` gives back (its `letter`).
/// Defined here, below `dead_letters` (which archives it), because the encoding reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDeadLetter {
    /// Route it belonged to.
    pub route: String,
    /// Queue it was consumed from (usually `Q.dlq`).
    pub queue: String,
    /// Why it was dead-lettered. Any text: the module docs say how text the columns cannot
    /// hold (NUL, very long) is stored.
    pub reason: String,
    /// Plugin that handled it, when known.
    pub plugin: Option<String>,
    /// Delivery attempts made.
    pub attempts: i64,
    /// AMQP headers, in order.
    pub headers: Vec<(String, String)>,
    /// Body, verbatim.
    pub body: Vec<u8>,
    /// Unix ms of the first failure, when known.
    pub first_failed_at: Option<i64>,
    /// Unix ms it was dead-lettered.
    pub dead_lettered_at: i64,
}

/// Cap on `route`, `queue` and `plugin` columns, in bytes (PostgreSQL's btree entries are
/// limited to about 2,700 bytes, and `route` is indexed).
pub(crate) const SHORT_MAX: usize = 1_024;
/// Cap on the `reason` column, on every original text kept, and on the headers' JSON.
pub(crate) const TEXT_MAX: usize = 16 << 20;

/// The columns of one dead letter, as stored.
pub(super) struct Stored {
    pub route: String,
    pub queue: String,
    pub reason: String,
    pub plugin: Option<String>,
    pub headers: String,
    /// `original` column: the exact text of every field whose column holds a stand-in.
    pub original: Option<String>,
}

/// The `original` column's JSON.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Original {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// Fields whose original was longer than [`TEXT_MAX`]: their length in bytes (for
    /// `headers`: the number of entries dropped).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cut: BTreeMap<String, u64>,
}

impl Original {
    fn is_empty(&self) -> bool {
        self.route.is_none()
            && self.queue.is_none()
            && self.reason.is_none()
            && self.plugin.is_none()
            && self.cut.is_empty()
    }
}

/// The stored form of `dl`: always storable on both backends.
pub(super) fn encode(dl: &NewDeadLetter) -> Stored {
    let mut original = Original::default();
    let route = column(
        "route",
        &dl.route,
        SHORT_MAX,
        &mut original.route,
        &mut original.cut,
    );
    let queue = column(
        "queue",
        &dl.queue,
        SHORT_MAX,
        &mut original.queue,
        &mut original.cut,
    );
    let reason = column(
        "reason",
        &dl.reason,
        TEXT_MAX,
        &mut original.reason,
        &mut original.cut,
    );
    let plugin = dl.plugin.as_deref().map(|p| {
        column(
            "plugin",
            p,
            SHORT_MAX,
            &mut original.plugin,
            &mut original.cut,
        )
    });
    let headers = headers_json(&dl.headers, &mut original.cut);
    let original = (!original.is_empty())
        .then(|| serde_json::to_string(&original).unwrap_or_else(|_| "{}".to_owned()));
    Stored {
        route,
        queue,
        reason,
        plugin,
        headers,
        original,
    }
}

/// Parses an `original` column; `None` when absent or unreadable (the columns then stand).
pub(super) fn decode(original: Option<&str>) -> Option<Original> {
    original.and_then(|text| serde_json::from_str(text).ok())
}

/// The column text for `value`; when it differs from `value`, `value` (at most
/// [`TEXT_MAX`] of it) goes into `keep`.
fn column(
    name: &str,
    value: &str,
    max: usize,
    keep: &mut Option<String>,
    cut: &mut BTreeMap<String, u64>,
) -> String {
    let shown = stand_in(value, max);
    if shown != value {
        let kept = prefix(value, TEXT_MAX);
        if kept.len() < value.len() {
            cut.insert(name.to_owned(), value.len() as u64);
        }
        *keep = Some(kept.to_owned());
    }
    shown
}

/// `value` with NUL shown as `\u{0}`, cut to `max` bytes with a visible note.
pub(crate) fn stand_in(value: &str, max: usize) -> String {
    let escaped = if value.contains('\0') {
        value.replace('\0', "\\u{0}")
    } else {
        value.to_owned()
    };
    if escaped.len() <= max {
        return escaped;
    }
    // Leave room for the note itself.
    let head = prefix(&escaped, max.saturating_sub(40));
    format!("{head}…[cut: {} more bytes]", escaped.len() - head.len())
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn prefix(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The headers' JSON, keeping whole entries up to [`TEXT_MAX`] bytes.
fn headers_json(headers: &[(String, String)], cut: &mut BTreeMap<String, u64>) -> String {
    let json = headers_to_json(headers);
    if json.len() <= TEXT_MAX {
        return json;
    }
    let mut kept = Vec::new();
    let mut size: usize = 2;
    for pair in headers {
        let entry = serde_json::to_string(pair).map_or(usize::MAX, |e| e.len() + 1);
        if size.saturating_add(entry) > TEXT_MAX {
            continue;
        }
        size += entry;
        kept.push(pair.clone());
    }
    cut.insert("headers".to_owned(), (headers.len() - kept.len()) as u64);
    headers_to_json(&kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dl(text: &str) -> NewDeadLetter {
        NewDeadLetter {
            route: text.into(),
            queue: text.into(),
            reason: text.into(),
            plugin: Some(text.into()),
            attempts: 1,
            headers: vec![(text.into(), text.into())],
            body: Vec::new(),
            first_failed_at: None,
            dead_lettered_at: 0,
        }
    }

    #[test]
    fn plain_text_is_stored_verbatim_without_an_original() {
        let s = encode(&dl("orders: retries exhausted \\u{0}"));
        assert_eq!(s.reason, "orders: retries exhausted \\u{0}");
        assert!(s.original.is_none());
    }

    #[test]
    fn nul_is_shown_visibly_and_kept_exactly() {
        let s = encode(&dl("a\0b"));
        for column in [&s.route, &s.queue, &s.reason] {
            assert_eq!(column, "a\\u{0}b");
        }
        assert!(!s.headers.contains('\0'));
        let original = decode(s.original.as_deref()).unwrap();
        assert_eq!(original.reason.as_deref(), Some("a\0b"));
        assert_eq!(original.plugin.as_deref(), Some("a\0b"));
        assert!(original.cut.is_empty());
        assert!(!s.original.unwrap().contains('\0'));
    }

    #[test]
    fn long_text_is_cut_in_the_column_and_kept_whole() {
        let long = "é".repeat(3_000); // 6,000 bytes, two per character
        let s = encode(&dl(&long));
        assert!(s.route.len() <= SHORT_MAX, "{}", s.route.len());
        assert!(s.route.ends_with("more bytes]"));
        assert_eq!(s.reason, long, "6 kB fits the reason column");
        let original = decode(s.original.as_deref()).unwrap();
        assert_eq!(original.route.as_deref(), Some(long.as_str()));
        assert_eq!(original.reason, None);
    }

    #[test]
    fn text_over_the_cap_records_its_length() {
        let huge = "x".repeat(TEXT_MAX + 10);
        let mut d = dl("r");
        d.reason = huge.clone();
        let s = encode(&d);
        assert!(s.reason.len() <= TEXT_MAX);
        let original = decode(s.original.as_deref()).unwrap();
        assert_eq!(original.reason.map(|r| r.len()), Some(TEXT_MAX));
        assert_eq!(original.cut.get("reason"), Some(&(huge.len() as u64)));
    }
}
