//! The delivery a handler receives: [`Message`], its [`Header`]s and body decoding helpers.

use std::fmt;

use serde::de::DeserializeOwned;

/// One AMQP header, flattened to text by the host (numbers and booleans rendered as text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Header name, exactly as published (names are case-sensitive).
    pub name: String,
    /// Header value rendered as text.
    pub value: String,
}

impl Header {
    /// A header from a name and a value.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
        }
    }
}

/// The message being handled.
///
/// The host builds it from the AMQP delivery; tests build it with [`Message::new`] or
/// [`Message::from_json`] and the `with_*` methods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The AMQP `message-id`, if the publisher set one.
    pub id: Option<String>,
    /// Exchange the message was originally published to (`""` is the default exchange).
    pub exchange: String,
    /// Routing key the message was originally published with.
    pub routing_key: String,
    /// AMQP headers, flattened to text.
    pub headers: Vec<Header>,
    /// The AMQP `content-type` property, if set.
    pub content_type: Option<String>,
    /// The raw body.
    pub body: Vec<u8>,
    /// 1 on the first delivery; counted by Carteiro across retries.
    pub attempt: u32,
    /// The broker redelivered this message (a consumer died holding it).
    pub redelivered: bool,
}

impl Default for Message {
    fn default() -> Self {
        Self {
            id: None,
            exchange: String::new(),
            routing_key: String::new(),
            headers: Vec::new(),
            content_type: None,
            body: Vec::new(),
            attempt: 1,
            redelivered: false,
        }
    }
}

impl Message {
    /// A first-attempt message with this routing key and raw body (mostly for tests).
    pub fn new(routing_key: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        Self {
            routing_key: routing_key.into(),
            body: body.into(),
            ..Self::default()
        }
    }

    /// A first-attempt message whose body is `value` serialized as JSON, with content type
    /// `application/json` (mostly for tests).
    pub fn from_json<T: serde::Serialize + ?Sized>(
        routing_key: impl Into<String>,
        value: &T,
    ) -> Self {
        // Serializing plain data to a Vec cannot fail; maps with non-string keys can, and
        // then the body is empty, which the handler under test will report.
        let body = serde_json::to_vec(value).unwrap_or_default();
        Self::new(routing_key, body).with_content_type("application/json")
    }

    /// Sets the AMQP `message-id`.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Sets the exchange the message was published to.
    pub fn with_exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
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

    /// Sets the attempt number (1 is the first delivery).
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Marks the message as redelivered by the broker.
    pub fn with_redelivered(mut self, redelivered: bool) -> Self {
        self.redelivered = redelivered;
        self
    }

    /// The value of the first header called `name` (exact, case-sensitive match).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.name == name)
            .map(|h| h.value.as_str())
    }

    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<&str, BodyError> {
        std::str::from_utf8(&self.body).map_err(|e| BodyError::NotUtf8 {
            valid_up_to: e.valid_up_to(),
        })
    }

    /// The body decoded from JSON into `T`.
    ///
    /// The error says what is wrong in words a dead-letter reason can carry, e.g.
    /// ``missing field `curso_id` `` or `expected value at line 1 column 1`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, BodyError> {
        serde_json::from_slice(&self.body).map_err(|e| BodyError::Json(JsonError::from(e)))
    }
}

/// Why a message body could not be read as text or JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// The body is not valid UTF-8.
    NotUtf8 {
        /// Length of the longest valid UTF-8 prefix.
        valid_up_to: usize,
    },
    /// The body is not the expected JSON.
    Json(JsonError),
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotUtf8 { valid_up_to } => {
                write!(
                    f,
                    "body is not UTF-8 (invalid byte at offset {valid_up_to})"
                )
            }
            Self::Json(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for BodyError {}

/// A JSON decoding failure, with the position split off the description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    description: String,
    line: usize,
    column: usize,
    syntax: bool,
}

impl JsonError {
    /// What is wrong, without the position, e.g. ``missing field `curso_id` ``.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// 1-based line of the error (0 when unknown).
    pub fn line(&self) -> usize {
        self.line
    }

    /// 1-based column of the error (0 when unknown).
    pub fn column(&self) -> usize {
        self.column
    }

    /// True when the input is not JSON at all (syntax error or truncated input); false when
    /// it is JSON of the wrong shape (missing field, wrong type).
    pub fn is_syntax(&self) -> bool {
        self.syntax
    }
}

impl From<serde_json::Error> for JsonError {
    fn from(e: serde_json::Error) -> Self {
        let full = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let description = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
        Self {
            description,
            line: e.line(),
            column: e.column(),
            syntax: e.is_syntax() || e.is_eof(),
        }
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            f.write_str(&self.description)
        } else {
            write!(
                f,
                "{} at line {} column {}",
                self.description, self.line, self.column
            )
        }
    }
}

impl std::error::Error for JsonError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Order {
        id: u64,
        sku: String,
    }

    #[test]
    fn json_missing_field_names_the_field() {
        let msg = Message::new("order.created", br#"{"id": 1}"#.to_vec());
        let Err(BodyError::Json(e)) = msg.json::<Order>() else {
            panic!("expected a JSON error");
        };
        assert_eq!(e.description(), "missing field `sku`");
        assert!(!e.is_syntax());
        assert!(e.to_string().starts_with("missing field `sku` at line 1"));
    }

    #[test]
    fn json_syntax_error_is_flagged() {
        let msg = Message::new("order.created", b"{not json".to_vec());
        let Err(BodyError::Json(e)) = msg.json::<Order>() else {
            panic!("expected a JSON error");
        };
        assert!(e.is_syntax());
    }

    #[test]
    fn text_and_headers() {
        let msg = Message::new("k", b"hello".to_vec()).with_header("x-tenant", "acme");
        assert_eq!(msg.text(), Ok("hello"));
        assert_eq!(msg.header("x-tenant"), Some("acme"));
        assert_eq!(msg.header("X-Tenant"), None);
        let bad = Message::new("k", vec![b'a', 0xff]);
        assert_eq!(bad.text(), Err(BodyError::NotUtf8 { valid_up_to: 1 }));
    }
}
