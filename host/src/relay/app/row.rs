//! An application's row as the relay publishes it: read by the claim's `SELECT` (poll) or
//! from the slot's text values (cdc), the same way. A row that can never make a message
//! (an event id, routing key or payload that is NULL, a payload over `max_payload`) is
//! still read, with why: the relay parks it with that error instead of skipping it.

use super::config::AppOutboxConfig;
use super::shape::Shape;
use crate::relay::cdc::{DecodeError, Relation, bytea};
use crate::store::{ColumnKind, NewOutboxRow, OutboxRow};

/// A row as the claim selects it (`statements`): every value may be NULL.
#[derive(Debug, sqlx::FromRow)]
pub struct AppRecord {
    pub id: i64,
    pub event_id: Option<String>,
    pub message_type: Option<String>,
    pub routing_key: Option<String>,
    pub payload: Option<Vec<u8>>,
    pub ordering_key: Option<String>,
    pub created_ms: Option<i64>,
    /// A JSON array of the header columns' text values, in config order.
    pub headers: Option<String>,
}

/// How one outbox's rows become messages.
#[derive(Debug, Clone)]
pub struct Reading {
    config: AppOutboxConfig,
    content_type: Option<String>,
    payload_kind: ColumnKind,
}

impl Reading {
    pub fn new(config: &AppOutboxConfig, shape: &Shape) -> Self {
        let payload_kind = shape.kind(&config.columns.payload);
        let content_type = config
            .content_type
            .clone()
            .or_else(|| (payload_kind == ColumnKind::Json).then(|| "application/json".to_owned()));
        Self {
            config: config.clone(),
            content_type,
            payload_kind,
        }
    }

    /// The relay's row for `record`.
    pub fn row(&self, record: AppRecord) -> OutboxRow {
        let c = &self.config.columns;
        let mut refused = None;
        let mut missing = |value: Option<String>, column: &Option<String>| match value {
            Some(v) => v,
            None => {
                let name = column.as_deref().unwrap_or_default();
                refused.get_or_insert_with(|| format!("column {name} is NULL"));
                String::new()
            }
        };
        let event_id = missing(record.event_id, &Some(c.event_id.clone()));
        let routing_key = match &self.config.routing_key {
            Some(fixed) => fixed.clone(),
            None => missing(record.routing_key, &c.routing_key),
        };
        let payload = match record.payload {
            Some(p) => p,
            None => {
                refused.get_or_insert_with(|| format!("column {} is NULL", c.payload));
                Vec::new()
            }
        };
        if payload.len() as u64 > self.config.max_payload {
            refused.get_or_insert_with(|| {
                format!(
                    "payload is {} bytes, over max_payload ({} bytes)",
                    payload.len(),
                    self.config.max_payload
                )
            });
        }
        let headers = match record
            .headers
            .as_deref()
            .map(serde_json::from_str::<Vec<Option<String>>>)
        {
            Some(Ok(values)) => c
                .headers
                .iter()
                .zip(values)
                .filter_map(|(name, value)| value.map(|v| (name.clone(), v)))
                .collect(),
            Some(Err(e)) => {
                refused.get_or_insert_with(|| format!("header columns unreadable: {e}"));
                Vec::new()
            }
            None => Vec::new(),
        };
        OutboxRow {
            id: record.id,
            event: NewOutboxRow {
                event_id,
                route: self.config.name.clone(),
                plugin: String::new(),
                exchange: self.config.exchange.clone(),
                routing_key,
                headers,
                content_type: self.content_type.clone(),
                payload,
                ordering_key: record.ordering_key.unwrap_or_default(),
            },
            created_at: record.created_ms.unwrap_or_else(crate::common::now_ms),
            attempts: 0,
            last_error: None,
            message_type: record.message_type,
            refused,
        }
    }

    /// The relay's row for an insert read from the slot (text-format values).
    pub fn row_of_insert(
        &self,
        relation: &Relation,
        values: &[Option<Vec<u8>>],
    ) -> Result<OutboxRow, DecodeError> {
        let value = |name: &str| -> Option<String> {
            let i = relation.columns.iter().position(|c| c == name)?;
            let raw = values.get(i)?.as_deref()?;
            Some(String::from_utf8_lossy(raw).into_owned())
        };
        let column = |name: &Option<String>| name.as_deref().and_then(value);
        let c = &self.config.columns;
        let id = value(&c.id)
            .ok_or(DecodeError::Missing("id"))?
            .parse::<i64>()
            .map_err(|e| DecodeError::Invalid {
                column: "id",
                why: e.to_string(),
            })?;
        let payload = match value(&c.payload) {
            Some(text) if self.payload_kind == ColumnKind::Bytes => Some(bytea(&text)?),
            Some(text) => Some(text.into_bytes()),
            None => None,
        };
        let headers: Vec<Option<String>> = c.headers.iter().map(|h| value(h)).collect();
        let record = AppRecord {
            id,
            event_id: value(&c.event_id),
            message_type: column(&c.message_type),
            routing_key: column(&c.routing_key),
            payload,
            ordering_key: column(&c.key),
            created_ms: column(&c.created_at).and_then(|t| timestamp_ms(&t)),
            headers: (!c.headers.is_empty())
                .then(|| serde_json::to_string(&headers).unwrap_or_default()),
        };
        Ok(self.row(record))
    }
}

/// A timestamp in PostgreSQL's text output (`2026-12-05 11:00:00.123456`, UTC, with or
/// without a `+00` offset) in unix ms; `None` for another offset or form.
fn timestamp_ms(text: &str) -> Option<i64> {
    let plain = text
        .strip_suffix("+00:00")
        .or_else(|| text.strip_suffix("+00"))
        .unwrap_or(text);
    let at = humantime::parse_rfc3339_weak(plain).ok()?;
    let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    i64::try_from(ms).ok()
}

#[cfg(test)]
mod tests {
    use super::timestamp_ms;

    #[test]
    fn postgres_text_timestamps_read_as_utc() {
        assert_eq!(timestamp_ms("1970-01-01 00:00:01.5"), Some(1500));
        assert_eq!(timestamp_ms("1970-01-01 00:00:02+00"), Some(2000));
        assert_eq!(timestamp_ms("1970-01-01 00:00:02+02"), None);
    }
}
