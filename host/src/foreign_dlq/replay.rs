//! What a copy of a foreign dead letter is sent with: back to the exchange and routing key
//! it came from (or a queue the operator names), unsealed and without Carteiro's headers (it
//! is not Carteiro's message), its non-string headers typed again and its AMQP properties
//! restored, so its own consumer (a Celery worker) reads it as it was first sent.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use serde_json::Value as Json;

use crate::common::header_names as h;
use crate::store::DeadLetter;

/// Where a copy goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub exchange: String,
    pub routing_key: String,
}

/// A foreign dead letter's origin (`None` for a route's dead letter, which goes back to its
/// route's queue).
pub fn origin(d: &DeadLetter) -> Option<Destination> {
    Some(Destination {
        exchange: d.header(h::ORIGIN_EXCHANGE).unwrap_or_default().to_owned(),
        routing_key: d.header(h::ORIGIN_ROUTING_KEY)?.to_owned(),
    })
}

/// Whether `d` came from a `[[dead_letter_queues]]` queue.
pub fn is_foreign(d: &DeadLetter) -> bool {
    d.header(h::ORIGIN_ROUTING_KEY).is_some()
        || d.letter.headers.iter().any(|(k, _)| k == h::TYPED_HEADERS)
}

/// Headers a copy of a foreign dead letter drops: the reason and origin its publisher added.
fn is_reason_header(name: &str) -> bool {
    [
        h::EXCEPTION,
        h::EXCEPTION_TYPE,
        h::ORIGIN_EXCHANGE_HEADER,
        h::ORIGIN_ROUTING_KEY_HEADER,
    ]
    .contains(&name)
}

/// `properties` (text headers, message id, content type, correlation id) with the rest of
/// what `d` was archived with: its headers typed as they came (those whose text is
/// unchanged) and its other AMQP properties.
pub fn restore(d: &DeadLetter, properties: BasicProperties) -> BasicProperties {
    let mut headers: FieldTable = properties
        .headers()
        .clone()
        .unwrap_or_default()
        .inner()
        .iter()
        .filter(|(name, _)| !is_reason_header(name.as_str()))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into();
    let typed: serde_json::Map<String, Json> = d
        .header(h::TYPED_HEADERS)
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    let archived = |name: &str| d.header(name).map(str::to_owned);
    for (name, value) in typed {
        let unchanged = headers.inner().get(name.as_str()).is_some_and(|now| {
            matches!(now, AMQPValue::LongString(s) if Some(String::from_utf8_lossy(s.as_bytes()).into_owned()) == archived(&name))
        });
        if unchanged && let Ok(key) = ShortString::try_new(name.as_str()) {
            headers.insert(key, from_json(&value));
        }
    }
    let mut p = properties.with_headers(headers);
    let short = |name: &str| archived(name).and_then(|v| ShortString::try_new(v).ok());
    if let Some(v) = short(h::PROP_CONTENT_ENCODING) {
        p = p.with_content_encoding(v);
    }
    if let Some(v) = short(h::PROP_REPLY_TO) {
        p = p.with_reply_to(v);
    }
    if let Some(v) = archived(h::PROP_PRIORITY).and_then(|v| v.parse().ok()) {
        p = p.with_priority(v);
    }
    if let Some(v) = short(h::PROP_TYPE) {
        p = p.with_type(v);
    }
    if let Some(v) = short(h::PROP_APP_ID) {
        p = p.with_app_id(v);
    }
    p
}

/// A JSON value as the AMQP value a Python client reads back as the same value.
fn from_json(value: &Json) -> AMQPValue {
    match value {
        Json::Null => AMQPValue::Void,
        Json::Bool(b) => AMQPValue::Boolean(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::Double(n.as_f64().unwrap_or_default()),
        },
        Json::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        Json::Array(items) => AMQPValue::FieldArray(FieldArray::from(
            items.iter().map(from_json).collect::<Vec<_>>(),
        )),
        Json::Object(map) => {
            let mut table = FieldTable::default();
            for (k, v) in map {
                if let Ok(key) = ShortString::try_new(k.as_str()) {
                    table.insert(key, from_json(v));
                }
            }
            AMQPValue::FieldTable(table)
        }
    }
}
