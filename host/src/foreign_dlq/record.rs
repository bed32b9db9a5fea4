//! A foreign dead letter as the archive keeps it: every header (the non-string ones also
//! typed, under `:typed-headers`), its AMQP properties as pseudo-headers, where its replay
//! goes (`:origin-exchange`, `:origin-routing-key`), its reason, and the key that makes a
//! redelivery of it the same row.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Map, Value as Json};
use sha2::{Digest, Sha256};

use super::config::DeadLetterQueueConfig;
use crate::broker::field_table::{header_text, to_json, to_text_pairs};
use crate::broker::outgoing::cap_reason;
use crate::common::header_names as h;
use crate::store::NewDeadLetter;

/// What one delivery of a foreign DLQ archives as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Foreign {
    pub letter: NewDeadLetter,
    /// The same for every redelivery of this dead letter (`Store::dead_letter_insert_once`).
    pub dedupe_key: String,
}

/// The latest `x-death` record (RabbitMQ keeps the most recent first).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Death {
    pub reason: Option<String>,
    pub queue: Option<String>,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub count: Option<i64>,
}

/// The `x-death` records as JSON (an empty array without any).
fn deaths(table: &FieldTable) -> Json {
    table
        .inner()
        .get("x-death")
        .map(to_json)
        .unwrap_or_else(|| Json::Array(Vec::new()))
}

/// The latest record of `deaths`.
pub fn latest_death(deaths: &Json) -> Option<Death> {
    let entry = deaths.as_array()?.first()?.as_object()?;
    let text = |name: &str| entry.get(name).and_then(Json::as_str).map(str::to_owned);
    Some(Death {
        reason: text("reason"),
        queue: text("queue"),
        exchange: text("exchange"),
        routing_key: entry
            .get("routing-keys")
            .and_then(Json::as_array)
            .and_then(|keys| keys.first())
            .and_then(Json::as_str)
            .map(str::to_owned),
        count: entry.get("count").and_then(Json::as_i64),
    })
}

/// The consumer's own reason (`x-exception-type: x-exception`), else the broker's.
fn reason(table: &FieldTable, death: Option<&Death>, dlq: &str) -> String {
    let kind = header_text(Some(table), h::EXCEPTION_TYPE).filter(|t| !t.is_empty());
    let message = header_text(Some(table), h::EXCEPTION).filter(|m| !m.is_empty());
    match (kind, message, death) {
        (Some(kind), Some(message), _) => format!("{kind}: {message}"),
        (Some(only), None, _) | (None, Some(only), _) => only,
        (None, None, Some(death)) => {
            let why = death.reason.as_deref().unwrap_or("unknown");
            let queue = death.queue.as_deref().unwrap_or("?");
            format!("{why} in queue {queue}")
        }
        (None, None, None) => {
            format!("published straight to `{dlq}` (no x-death record, no x-exception header)")
        }
    }
}

/// A non-string header value, typed, for `:typed-headers`.
fn typed(value: &AMQPValue) -> Option<Json> {
    match value {
        AMQPValue::ShortString(_) | AMQPValue::LongString(_) => None,
        // A timestamp has no JSON type of its own: kept as its text, like a string.
        AMQPValue::Timestamp(_) => None,
        other => Some(to_json(other)),
    }
}

/// The archive record of one delivery from `dlq`'s queue, received at `now_ms`.
pub fn record(
    dlq: &DeadLetterQueueConfig,
    props: &BasicProperties,
    body: &[u8],
    now_ms: i64,
) -> Foreign {
    let table = props.headers().clone().unwrap_or_default();
    let deaths = deaths(&table);
    let death = latest_death(&deaths);
    // A link to an earlier dead letter is believed only from Carteiro's sealed copies, which
    // a foreign queue never carries: kept under another name.
    let mut pairs: Vec<(String, String)> = to_text_pairs(&table)
        .into_iter()
        .map(|(k, v)| match k == h::REPLAY_OF {
            true => (format!("{k}.unsealed"), v),
            false => (k, v),
        })
        .collect();
    let typed_headers: Map<String, Json> = table
        .into_iter()
        .filter_map(|(k, v)| typed(v).map(|t| (k.as_str().to_owned(), t)))
        .collect();
    if !typed_headers.is_empty() {
        pairs.push((
            h::TYPED_HEADERS.into(),
            Json::Object(typed_headers).to_string(),
        ));
    }
    let priority = props.priority().map(|p| p.to_string());
    let properties = [
        (
            h::PROP_MESSAGE_ID,
            props.message_id().as_ref().map(|s| s.as_str()),
        ),
        (
            h::PROP_CONTENT_TYPE,
            props.content_type().as_ref().map(|s| s.as_str()),
        ),
        (
            h::PROP_CORRELATION_ID,
            props.correlation_id().as_ref().map(|s| s.as_str()),
        ),
        (
            h::PROP_CONTENT_ENCODING,
            props.content_encoding().as_ref().map(|s| s.as_str()),
        ),
        (
            h::PROP_REPLY_TO,
            props.reply_to().as_ref().map(|s| s.as_str()),
        ),
        (h::PROP_PRIORITY, priority.as_deref()),
        (h::PROP_TYPE, props.kind().as_ref().map(|s| s.as_str())),
        (h::PROP_APP_ID, props.app_id().as_ref().map(|s| s.as_str())),
    ];
    for (name, value) in properties {
        if let Some(value) = value {
            pairs.push((name.to_owned(), value.to_owned()));
        }
    }
    // Where a replay goes: where it was published before it died, or where its publisher
    // says it came from when it dead-lettered it by hand.
    let origin = match &death {
        Some(Death {
            exchange: Some(exchange),
            routing_key: Some(key),
            ..
        }) => Some((exchange.clone(), key.clone())),
        _ => header_text(Some(&table), h::ORIGIN_ROUTING_KEY_HEADER).map(|key| {
            let exchange = header_text(Some(&table), h::ORIGIN_EXCHANGE_HEADER);
            (exchange.unwrap_or_default(), key)
        }),
    };
    if let Some((exchange, key)) = origin {
        pairs.push((h::ORIGIN_EXCHANGE.into(), exchange));
        pairs.push((h::ORIGIN_ROUTING_KEY.into(), key));
    }
    if let Some(task) = super::celery::celery_task(&pairs, body) {
        pairs.push((h::SEARCH_FIELDS.into(), task.search_fields().to_string()));
    }
    let message_id = props.message_id().as_ref().map(|s| s.as_str().to_owned());
    let letter = NewDeadLetter {
        route: dlq.route_name().to_owned(),
        queue: death
            .as_ref()
            .and_then(|d| d.queue.clone())
            .unwrap_or_else(|| dlq.queue.clone()),
        reason: cap_reason(&reason(&table, death.as_ref(), &dlq.queue)),
        plugin: None,
        attempts: death.as_ref().and_then(|d| d.count).unwrap_or(1),
        headers: pairs,
        body: body.to_vec(),
        first_failed_at: None,
        dead_lettered_at: now_ms,
    };
    Foreign {
        letter,
        dedupe_key: dedupe_key(&dlq.queue, message_id.as_deref(), &deaths, body),
    }
}

/// The queue, the message id, every `x-death` record (reasons, queues, counts and times, to
/// the second) and the body's digest: a redelivery of the same dead letter has them all
/// alike; the same message dead-lettered again has a higher count or a later time.
fn dedupe_key(queue: &str, message_id: Option<&str>, deaths: &Json, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    for part in [
        queue.as_bytes(),
        message_id.unwrap_or("").as_bytes(),
        deaths.to_string().as_bytes(),
        &Sha256::digest(body),
    ] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hex::encode(hash.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{FieldArray, LongString, ShortString};

    fn death(count: i64, time: u64) -> AMQPValue {
        let mut entry = FieldTable::default();
        let text = |s: &str| AMQPValue::LongString(LongString::from(s));
        entry.insert(ShortString::from("reason"), text("rejected"));
        entry.insert(ShortString::from("queue"), text("matriculas.processar"));
        entry.insert(ShortString::from("exchange"), text("matriculas"));
        entry.insert(ShortString::from("count"), AMQPValue::LongLongInt(count));
        entry.insert(ShortString::from("time"), AMQPValue::Timestamp(time));
        entry.insert(
            ShortString::from("routing-keys"),
            AMQPValue::FieldArray(FieldArray::from(vec![text("matricula.confirmada")])),
        );
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(entry)]))
    }

    fn props(headers: Vec<(&str, AMQPValue)>) -> BasicProperties {
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert(ShortString::from(k), v);
        }
        BasicProperties::default()
            .with_headers(table)
            .with_message_id("m-1".into())
            .with_content_encoding("utf-8".into())
    }

    fn dlq() -> DeadLetterQueueConfig {
        DeadLetterQueueConfig {
            queue: "matriculas.dlq".into(),
            route: None,
            alert: None,
        }
    }

    #[test]
    fn the_broker_reason_names_the_queue_and_the_origin_is_kept() {
        let f = record(
            &dlq(),
            &props(vec![("x-death", death(1, 1_800_000_000))]),
            b"{",
            5,
        );
        assert_eq!(f.letter.reason, "rejected in queue matriculas.processar");
        assert_eq!(f.letter.route, "matriculas.dlq");
        assert_eq!(f.letter.queue, "matriculas.processar");
        let header = |name: &str| {
            f.letter
                .headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(header(h::ORIGIN_EXCHANGE).as_deref(), Some("matriculas"));
        assert_eq!(
            header(h::ORIGIN_ROUTING_KEY).as_deref(),
            Some("matricula.confirmada")
        );
        assert_eq!(header(h::PROP_MESSAGE_ID).as_deref(), Some("m-1"));
        assert_eq!(header(h::PROP_CONTENT_ENCODING).as_deref(), Some("utf-8"));
        assert!(header(h::TYPED_HEADERS).is_some_and(|t| t.contains("\"count\":1")));
    }

    #[test]
    fn the_consumer_reason_wins() {
        let text = |s: &str| AMQPValue::LongString(LongString::from(s));
        let f = record(
            &dlq(),
            &props(vec![
                ("x-death", death(1, 1)),
                (h::EXCEPTION_TYPE, text("IntegrityError")),
                (h::EXCEPTION, text("duplicate key")),
            ]),
            b"[]",
            5,
        );
        assert_eq!(f.letter.reason, "IntegrityError: duplicate key");
        let bare = record(&dlq(), &BasicProperties::default(), b"x", 5);
        assert!(bare.letter.reason.contains("no x-death record"));
    }

    #[test]
    fn a_redelivery_has_the_same_key_and_a_new_death_another() {
        let once = props(vec![("x-death", death(1, 1_800_000_000))]);
        let a = record(&dlq(), &once, b"{", 5);
        let b = record(&dlq(), &once, b"{", 9_999);
        assert_eq!(a.dedupe_key, b.dedupe_key);
        let twice = props(vec![("x-death", death(2, 1_800_000_000))]);
        assert_ne!(a.dedupe_key, record(&dlq(), &twice, b"{", 5).dedupe_key);
        let later = props(vec![("x-death", death(1, 1_800_000_001))]);
        assert_ne!(a.dedupe_key, record(&dlq(), &later, b"{", 5).dedupe_key);
        assert_ne!(a.dedupe_key, record(&dlq(), &once, b"}", 5).dedupe_key);
    }
}
