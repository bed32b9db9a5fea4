//! Typed errors returned by the host imports, mirroring the WIT variants, and their
//! default mapping to a [`Verdict`].

use std::fmt;

use crate::Verdict;

/// A kv operation failed. The first three variants mirror the WIT `kv-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// The key is empty, too long, or contains a NUL character.
    InvalidKey(String),
    /// The value is larger than the host accepts (carries the limit, in bytes).
    ValueTooLarge(u64),
    /// The store could not be reached; returning `retry` is usually right.
    Unavailable(String),
    /// SDK-side only: a stored value could not be decoded (JSON, integer) or a value could
    /// not be encoded.
    Codec(String),
}

impl KvError {
    /// True when trying again later may succeed ([`KvError::Unavailable`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidKey(why) => write!(f, "kv: invalid key: {why}"),
            Self::ValueTooLarge(limit) => {
                write!(f, "kv: value larger than the {limit}-byte limit")
            }
            Self::Unavailable(why) => write!(f, "kv unavailable: {why}"),
            Self::Codec(why) => write!(f, "kv: {why}"),
        }
    }
}

impl std::error::Error for KvError {}

/// Transient kv errors retry, the others dead-letter; the reason is the error text.
impl From<KvError> for Verdict {
    fn from(e: KvError) -> Self {
        if e.is_transient() {
            Verdict::retry(e.to_string())
        } else {
            Verdict::dead_letter(e.to_string())
        }
    }
}

/// An outbox emit failed. The first three variants mirror the WIT `outbox-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboxError {
    /// An exchange, routing key or header is not acceptable (NUL byte, too long, ...).
    InvalidEvent(String),
    /// This message already emitted the maximum number of events (the limit).
    TooManyEvents(u32),
    /// The payload is larger than the host accepts (carries the limit, in bytes).
    PayloadTooLarge(u64),
    /// SDK-side only: the payload could not be serialized.
    Codec(String),
}

impl fmt::Display for OutboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidEvent(why) => write!(f, "outbox: invalid event: {why}"),
            Self::TooManyEvents(max) => {
                write!(f, "outbox: too many events for one message (limit {max})")
            }
            Self::PayloadTooLarge(limit) => {
                write!(f, "outbox: payload larger than the {limit}-byte limit")
            }
            Self::Codec(why) => write!(f, "outbox: {why}"),
        }
    }
}

impl std::error::Error for OutboxError {}

/// Outbox errors are permanent for a given message: they dead-letter.
impl From<OutboxError> for Verdict {
    fn from(e: OutboxError) -> Self {
        Verdict::dead_letter(e.to_string())
    }
}

/// A body that cannot be decoded will not decode on retry either: it dead-letters.
impl From<crate::BodyError> for Verdict {
    fn from(e: crate::BodyError) -> Self {
        Verdict::dead_letter(format!("invalid body: {e}"))
    }
}
