//! The one place that builds what Carteiro publishes — retry copies, dead-letter copies,
//! replays and outbox events — and enforces AMQP's limits on it, so a hostile header or a
//! plugin's odd event is a clear error instead of a lapin panic or a broker `FRAME_ERROR`
//! that kills the connection (and every route on it) and loops on redelivery.
//!
//! A retry or dead-letter copy is built whole by one call, [`handed_on_properties`]: the
//! received headers, Carteiro's story of the failure ([`CopyStory`]) and the original's
//! properties.
//!
//! Limits enforced here:
//! - short strings (content type, message id, correlation id, header names, ...) at most
//!   255 bytes ([`MAX_SHORT_STRING`]); lapin's `From<&str>` panics above that;
//! - the content-header frame within the connection's negotiated `frame_max`
//!   ([`check_header_frame`], called by the publisher for every message);
//! - reasons at most [`MAX_REASON_BYTES`] ([`cap_reason`]).
//!
//! Copies never carry `expiration` (a dead letter must not expire before it is archived, a
//! retry copy's delay is its tier's TTL) nor `user-id` (RabbitMQ refuses a `user-id` that is
//! not the publishing connection's user, which would loop the copy forever).

use crate::common::header_names as h;
use crate::common::labels::FailureKind;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

pub use carteiro_sdk::rules::MAX_SHORT_STRING;

/// Longest reason Carteiro records or sends (plugin reasons, panic messages, store errors).
/// Longer ones are cut at a character boundary and marked with `…`.
pub const MAX_REASON_BYTES: usize = 4096;

/// Bytes of a content-header frame besides its properties: frame header and end (8), class,
/// weight and body size (12), property flags (2). Rounded up for safety.
const HEADER_FRAME_OVERHEAD: usize = 64;

/// A message that AMQP cannot carry, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unpublishable {
    /// A short-string property or header name over 255 bytes.
    #[error("{what} is {len} bytes; AMQP short strings hold at most {MAX_SHORT_STRING}")]
    ShortString { what: String, len: usize },
    /// Headers and properties do not fit in one content-header frame.
    #[error(
        "headers and properties take about {size} bytes, over the connection's frame_max of \
         {frame_max}; send fewer or smaller headers (or raise the broker's frame_max)"
    )]
    HeaderFrame { size: usize, frame_max: usize },
    /// The row it comes from cannot make a message (a NULL routing key, a payload over the
    /// outbox's `max_payload`).
    #[error("{0}")]
    Row(String),
}

/// `text` as a short string, or why it cannot be one.
pub fn short(what: &str, text: &str) -> Result<ShortString, Unpublishable> {
    ShortString::try_new(text).map_err(|_| Unpublishable::ShortString {
        what: what.to_owned(),
        len: text.len(),
    })
}

/// Cuts `reason` to [`MAX_REASON_BYTES`] at a character boundary.
pub fn cap_reason(reason: &str) -> String {
    cap(reason, MAX_REASON_BYTES)
}

/// Cuts `text` to at most `max` bytes (including the marker) at a character boundary.
pub fn cap(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    const MARK: &str = "…";
    let mut end = max.saturating_sub(MARK.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

/// Sets a long-string header; `name` must be one of Carteiro's own (short) names.
pub fn set_text(table: &mut FieldTable, name: &'static str, value: &str) {
    table.insert(
        ShortString::from(name),
        AMQPValue::LongString(LongString::from(value)),
    );
}

/// Sets an integer header; `name` must be one of Carteiro's own (short) names.
pub fn set_int(table: &mut FieldTable, name: &'static str, value: i64) {
    table.insert(ShortString::from(name), AMQPValue::LongLongInt(value));
}

/// The broker's own bookkeeping headers (`x-death`, `x-first-death-*`, `x-last-death-*`).
/// A publisher can forge them, and RabbitMQ 3.10 crashes the queue process that dead-letters
/// a message whose `x-death` is malformed (it then dead-letters it again on restart, over
/// and over): copies Carteiro publishes never carry them as they came.
pub fn is_broker_record(name: &str) -> bool {
    name == "x-death" || name.starts_with("x-first-death-") || name.starts_with("x-last-death-")
}

/// `table` without the broker's bookkeeping headers; with `keep_renamed`, they stay for the
/// record as `x-received-<name>` (inert: the broker reads only its own names).
pub fn without_broker_records(table: &FieldTable, keep_renamed: bool) -> FieldTable {
    let mut out = FieldTable::default();
    for (name, value) in table {
        if !is_broker_record(name.as_str()) {
            out.insert(name.clone(), value.clone());
        } else if keep_renamed {
            let renamed = format!("x-received-{}", name.as_str());
            if let Ok(key) = ShortString::try_new(cap(&renamed, MAX_SHORT_STRING)) {
                out.insert(key, value.clone());
            }
        }
    }
    out
}

/// The properties of a copy of a received message (retry tier, dead-letter exchange):
/// everything the publisher set except `expiration` and `user-id`, persistent, with
/// `headers` in place of the original table.
pub fn copy_properties(original: &BasicProperties, headers: FieldTable) -> BasicProperties {
    let mut p = BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(2);
    // The optional properties kept, each as `getter => setter`.
    macro_rules! keep {
        ($($get:ident => $set:ident),* $(,)?) => {
            $(if let Some(v) = original.$get() {
                p = p.$set(v.clone());
            })*
        };
    }
    keep!(
        content_type => with_content_type,
        content_encoding => with_content_encoding,
        correlation_id => with_correlation_id,
        reply_to => with_reply_to,
        message_id => with_message_id,
        kind => with_type,
        app_id => with_app_id,
        cluster_id => with_cluster_id,
    );
    if let Some(v) = original.priority() {
        p = p.with_priority(*v);
    }
    if let Some(v) = original.timestamp() {
        p = p.with_timestamp(*v);
    }
    p
}

/// Where a copy of a received message goes, with what only that kind of copy says.
#[derive(Debug, Clone, Copy)]
pub enum HandOn<'a> {
    /// A retry tier; the copy counts as `attempt` when it comes back.
    Retry { attempt: i64 },
    /// The route's dead-letter exchange: the failure, who failed it and after how many
    /// attempts.
    DeadLetter {
        kind: FailureKind,
        plugin: &'a str,
        plugin_sha256: &'a str,
        attempts: i64,
        route: &'a str,
    },
}

/// What Carteiro's own headers on a retry or dead-letter copy say.
#[derive(Debug, Clone, Copy)]
pub struct CopyStory<'a> {
    /// Where the message was first published (kept across every hop).
    pub original_exchange: &'a str,
    pub original_routing_key: &'a str,
    /// The received copy's first-failure time, if it has one (only a sealed copy does).
    pub first_failure_at: Option<i64>,
    /// Why it is handed on (already capped).
    pub reason: &'a str,
    /// This failure's time (unix ms).
    pub now_ms: i64,
    /// The attempts so far, this one included (`x-carteiro-journey`, see `common::journey`).
    pub journey: Option<&'a str>,
    pub to: HandOn<'a>,
}

/// The properties of a retry or dead-letter copy of a received message: `received` (the
/// delivery's checked headers) with Carteiro's story set, and the original's properties as
/// [`copy_properties`] keeps them. The broker's bookkeeping headers are dropped from retry
/// copies (the tier hop writes its own) and kept renamed on dead-letter copies (see
/// [`without_broker_records`]).
pub fn handed_on_properties(
    original: &BasicProperties,
    received: &FieldTable,
    story: &CopyStory<'_>,
) -> BasicProperties {
    let dead_letter = matches!(story.to, HandOn::DeadLetter { .. });
    let mut headers = without_broker_records(received, dead_letter);
    let first = story.first_failure_at.unwrap_or(story.now_ms);
    set_text(&mut headers, h::ORIGINAL_EXCHANGE, story.original_exchange);
    set_text(
        &mut headers,
        h::ORIGINAL_ROUTING_KEY,
        story.original_routing_key,
    );
    set_int(&mut headers, h::FIRST_FAILURE_AT, first);
    set_int(&mut headers, h::LAST_FAILURE_AT, story.now_ms);
    set_text(&mut headers, h::LAST_REASON, story.reason);
    if let Some(journey) = story.journey {
        set_text(&mut headers, h::JOURNEY, journey);
    }
    match story.to {
        HandOn::Retry { attempt } => set_int(&mut headers, h::ATTEMPT, attempt),
        HandOn::DeadLetter {
            kind,
            plugin,
            plugin_sha256,
            attempts,
            route,
        } => {
            set_text(&mut headers, h::REASON, story.reason);
            set_text(&mut headers, h::FAILURE_KIND, kind.label());
            set_text(&mut headers, h::PLUGIN, plugin);
            set_text(&mut headers, h::PLUGIN_SHA256, plugin_sha256);
            set_int(&mut headers, h::ATTEMPTS, attempts);
            set_text(&mut headers, h::ROUTE, route);
            set_int(&mut headers, h::DEAD_LETTERED_AT, story.now_ms);
        }
    }
    copy_properties(original, headers)
}

/// The properties of an outbox event: `event_id` as `message_id`, persistent, the commit
/// time (unix ms, sent in seconds), the row's headers and content type.
pub fn event_properties(
    event_id: &str,
    created_at_ms: i64,
    headers: &[(String, String)],
    content_type: Option<&str>,
) -> Result<BasicProperties, Unpublishable> {
    typed_event_properties(event_id, None, created_at_ms, headers, content_type)
}

/// [`event_properties`] with an AMQP `type` (an application outbox's type column).
pub fn typed_event_properties(
    event_id: &str,
    message_type: Option<&str>,
    created_at_ms: i64,
    headers: &[(String, String)],
    content_type: Option<&str>,
) -> Result<BasicProperties, Unpublishable> {
    let table = string_table(headers)?;
    let mut properties = BasicProperties::default()
        .with_message_id(short("event id", event_id)?)
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(created_at_ms / 1000).unwrap_or(0))
        .with_headers(table);
    if let Some(ct) = content_type {
        properties = properties.with_content_type(short("content type", ct)?);
    }
    if let Some(kind) = message_type {
        properties = properties.with_type(short("type", kind)?);
    }
    Ok(properties)
}

/// The properties of a replayed dead letter: its archived headers (`pairs`, without the
/// failure story the caller filtered out) and the AMQP properties it kept as pseudo-headers.
pub fn replay_properties(
    pairs: &[(String, String)],
    message_id: Option<&str>,
    content_type: Option<&str>,
    correlation_id: Option<&str>,
) -> Result<BasicProperties, Unpublishable> {
    let table = string_table(pairs)?;
    let mut p = BasicProperties::default()
        .with_headers(table)
        .with_delivery_mode(2);
    if let Some(id) = message_id {
        p = p.with_message_id(short("message id", id)?);
    }
    if let Some(ct) = content_type {
        p = p.with_content_type(short("content type", ct)?);
    }
    if let Some(c) = correlation_id {
        p = p.with_correlation_id(short("correlation id", c)?);
    }
    Ok(p)
}

/// `pairs` as an AMQP table of long strings, refusing a name AMQP cannot carry.
fn string_table(pairs: &[(String, String)]) -> Result<FieldTable, Unpublishable> {
    let mut table = FieldTable::default();
    for (name, value) in pairs {
        table.insert(
            short("header name", name)?,
            AMQPValue::LongString(LongString::from(value.as_str())),
        );
    }
    Ok(table)
}

/// Refuses properties whose content-header frame would exceed `frame_max` (0: no limit).
pub fn check_header_frame(
    properties: &BasicProperties,
    frame_max: usize,
) -> Result<(), Unpublishable> {
    if frame_max == 0 {
        return Ok(());
    }
    let size = header_frame_size(properties);
    if size > frame_max {
        return Err(Unpublishable::HeaderFrame { size, frame_max });
    }
    Ok(())
}

/// An upper bound of the encoded size of the content-header frame for `p`.
pub fn header_frame_size(p: &BasicProperties) -> usize {
    let shorts = [
        p.content_type(),
        p.content_encoding(),
        p.correlation_id(),
        p.reply_to(),
        p.expiration(),
        p.message_id(),
        p.kind(),
        p.user_id(),
        p.app_id(),
        p.cluster_id(),
    ];
    let strings: usize = shorts
        .iter()
        .filter_map(|s| s.as_ref())
        .map(|s| 1 + s.as_str().len())
        .sum();
    let table = p.headers().as_ref().map_or(0, table_size);
    HEADER_FRAME_OVERHEAD + strings + table + 2 + 8
}

/// Encoded size of a field table: its length prefix and each name, type tag and value.
fn table_size(table: &FieldTable) -> usize {
    4 + table
        .into_iter()
        .map(|(name, value)| 1 + name.as_str().len() + 1 + value_size(value))
        .sum::<usize>()
}

fn value_size(value: &AMQPValue) -> usize {
    match value {
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::ShortString(s) => 1 + s.as_str().len(),
        AMQPValue::LongString(s) => 4 + s.as_bytes().len(),
        AMQPValue::ByteArray(b) => 4 + b.as_slice().len(),
        AMQPValue::FieldArray(a) => {
            4 + a
                .as_slice()
                .iter()
                .map(|v| 1 + value_size(v))
                .sum::<usize>()
        }
        AMQPValue::FieldTable(t) => table_size(t),
        AMQPValue::Void => 0,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::broker::field_table::{header_int, header_text};

    #[test]
    fn reasons_are_capped_at_a_char_boundary() {
        assert_eq!(cap_reason("short"), "short");
        let long = "é".repeat(MAX_REASON_BYTES);
        let capped = cap_reason(&long);
        assert!(capped.len() <= MAX_REASON_BYTES, "{}", capped.len());
        assert!(capped.ends_with('…'));
        assert_eq!(cap("abcdef", 4), "a…");
    }

    #[test]
    fn long_short_strings_are_errors_not_panics() {
        let ct = "x".repeat(300);
        let err = event_properties("id", 0, &[], Some(&ct)).unwrap_err();
        assert_eq!(
            err,
            Unpublishable::ShortString {
                what: "content type".into(),
                len: 300
            }
        );
        let name = "h".repeat(256);
        let err = event_properties("id", 0, &[(name, "v".into())], None).unwrap_err();
        assert!(
            err.to_string().contains("header name is 256 bytes"),
            "{err}"
        );
        assert!(event_properties("id", 0, &[("h".into(), "v".into())], Some("a/b")).is_ok());
    }

    #[test]
    fn copies_drop_expiration_and_user_id() {
        let original = BasicProperties::default()
            .with_expiration("1000".into())
            .with_user_id("someone".into())
            .with_message_id("m".into())
            .with_content_type("application/json".into())
            .with_priority(3);
        let copy = copy_properties(&original, FieldTable::default());
        assert_eq!(copy.expiration(), &None);
        assert_eq!(copy.user_id(), &None);
        assert_eq!(copy.message_id().as_ref().map(|s| s.as_str()), Some("m"));
        assert_eq!(
            copy.content_type().as_ref().map(|s| s.as_str()),
            Some("application/json")
        );
        assert_eq!(copy.priority(), &Some(3));
        assert_eq!(copy.delivery_mode(), &Some(2));
    }

    #[test]
    fn broker_records_are_dropped_or_renamed_on_copies() {
        let mut table = FieldTable::default();
        set_text(&mut table, "x-death", "forged");
        set_text(&mut table, "x-first-death-reason", "forged");
        set_text(&mut table, "x-last-death-queue", "forged");
        set_text(&mut table, "x-tenant", "acme");
        let dropped = without_broker_records(&table, false);
        let names: Vec<_> = dropped.into_iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(names, ["x-tenant"]);
        let kept = without_broker_records(&table, true);
        let names: Vec<_> = kept.into_iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(
            names,
            [
                "x-received-x-death",
                "x-received-x-first-death-reason",
                "x-received-x-last-death-queue",
                "x-tenant"
            ]
        );
    }

    fn story(to: HandOn<'static>) -> CopyStory<'static> {
        CopyStory {
            original_exchange: "shop",
            original_routing_key: "order.created",
            first_failure_at: Some(5),
            reason: "busy",
            now_ms: 9,
            journey: Some("{\"attempts\":[]}"),
            to,
        }
    }

    #[test]
    fn a_copy_tells_its_story_in_carteiro_headers() {
        let mut received = FieldTable::default();
        set_text(&mut received, "x-death", "record");
        set_text(&mut received, "x-tenant", "acme");
        let headers = |to| {
            handed_on_properties(&BasicProperties::default(), &received, &story(to))
                .headers()
                .clone()
                .unwrap_or_default()
        };
        let retry = headers(HandOn::Retry { attempt: 2 });
        assert_eq!(header_int(Some(&retry), h::ATTEMPT), Some(2));
        assert_eq!(header_int(Some(&retry), h::FIRST_FAILURE_AT), Some(5));
        assert_eq!(header_int(Some(&retry), h::LAST_FAILURE_AT), Some(9));
        assert_eq!(
            header_text(Some(&retry), h::JOURNEY).as_deref(),
            Some("{\"attempts\":[]}")
        );
        assert_eq!(header_text(Some(&retry), h::REASON), None);
        assert_eq!(header_text(Some(&retry), "x-death"), None);
        let dead = headers(HandOn::DeadLetter {
            kind: FailureKind::Trap,
            plugin: "orders",
            plugin_sha256: "ab",
            attempts: 3,
            route: "q",
        });
        assert_eq!(
            header_text(Some(&dead), h::FAILURE_KIND).as_deref(),
            Some("trap")
        );
        assert_eq!(header_text(Some(&dead), h::REASON).as_deref(), Some("busy"));
        assert_eq!(header_int(Some(&dead), h::ATTEMPTS), Some(3));
        assert_eq!(header_int(Some(&dead), h::DEAD_LETTERED_AT), Some(9));
        assert_eq!(header_int(Some(&dead), h::ATTEMPT), None);
        assert_eq!(
            header_text(Some(&dead), "x-received-x-death").as_deref(),
            Some("record")
        );
        assert_eq!(
            header_text(Some(&dead), "x-tenant").as_deref(),
            Some("acme")
        );
    }

    #[test]
    fn header_frames_over_frame_max_are_refused() {
        let mut table = FieldTable::default();
        set_text(&mut table, "x-carteiro-reason", &"r".repeat(10_000));
        let p = BasicProperties::default().with_headers(table);
        let size = header_frame_size(&p);
        assert!((10_000..10_200).contains(&size), "{size}");
        assert!(check_header_frame(&p, 131_072).is_ok());
        assert!(matches!(
            check_header_frame(&p, 4096),
            Err(Unpublishable::HeaderFrame { .. })
        ));
        assert!(check_header_frame(&p, 0).is_ok(), "0 means no limit");
    }
}
