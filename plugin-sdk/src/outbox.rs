//! Events to publish, committed atomically with the message's kv writes and published by
//! the host's relay after commit (at least once, with the event id as AMQP `message-id`).
//!
//! Events emitted by a message that ends in retry or dead-letter are discarded.

use std::fmt;

use serde::Serialize;

use crate::host;
use crate::{Header, OutboxError};

/// Content type set by [`emit_json`] and [`Event::json`].
pub const JSON: &str = "application/json";

/// An event to publish after the message commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Exchange to publish to.
    pub exchange: String,
    /// Routing key to publish with.
    pub routing_key: String,
    /// Headers to set on the published message.
    pub headers: Vec<Header>,
    /// The `content-type` property, if any.
    pub content_type: Option<String>,
    /// The message body.
    pub payload: Vec<u8>,
}

impl Event {
    /// An event with a raw payload, no headers and no content type.
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            headers: Vec::new(),
            content_type: None,
            payload: payload.into(),
        }
    }

    /// An event whose payload is `value` as JSON, with content type `application/json`.
    pub fn json<T: Serialize + ?Sized>(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        value: &T,
    ) -> Result<Self, OutboxError> {
        let payload = serde_json::to_vec(value)
            .map_err(|e| OutboxError::Codec(format!("cannot encode payload as JSON: {e}")))?;
        Ok(Self::new(exchange, routing_key, payload).with_content_type(JSON))
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push(Header::new(name, value));
        self
    }

    /// Sets the content type.
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// The payload decoded from JSON (handy in tests).
    pub fn payload_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }
}

/// The id the host gave an event (a UUIDv7); published as the AMQP `message-id`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub String);

impl EventId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Queues `event` for publication if the message acks.
pub fn emit(event: Event) -> Result<EventId, OutboxError> {
    host::outbox_emit(event)
}

/// Queues a JSON event (content type `application/json`) for publication if the message
/// acks.
pub fn emit_json<T: Serialize + ?Sized>(
    exchange: &str,
    routing_key: &str,
    value: &T,
) -> Result<EventId, OutboxError> {
    emit(Event::json(exchange, routing_key, value)?)
}
