//! The enrollment scenario (`matricula.confirmada`) without any I/O: its payload and kv
//! record, the ids in it, the events' routing keys and the texts of its verdicts and logs.
//!
//! Two handlers decide the scenario and must decide it alike: the component
//! (`plugins/enrollment`, through the SDK) and the native copy the pipeline benchmark measures
//! it against (`host/benches/native_enrollment.rs`, through the host's `NativeHost`). Each
//! does its own I/O; what they must agree on lives here, once.

#![deny(missing_docs)]

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Default exchange for the emitted events (config var `events_exchange` overrides it).
pub const DEFAULT_EVENTS_EXCHANGE: &str = "carteiro.events";
/// Routing key: course access granted.
pub const ACESSO_LIBERADO: &str = "acesso.liberado";
/// Routing key: invoice requested.
pub const FATURA_SOLICITADA: &str = "fatura.solicitada";
/// Routing key: welcome email requested.
pub const EMAIL_SOLICITADO: &str = "email.solicitado";
/// The events a confirmed enrollment emits, in order.
pub const ROUTING_KEYS: [&str; 3] = [ACESSO_LIBERADO, FATURA_SOLICITADA, EMAIL_SOLICITADO];

/// An id as published: a string or an integer, kept as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Id {
    /// A textual id.
    Text(String),
    /// A numeric id.
    Number(i128),
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Text(s) => f.write_str(s),
            Id::Number(n) => write!(f, "{n}"),
        }
    }
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Id::Text(t) => s.serialize_str(t),
            Id::Number(n) => s.serialize_i128(*n),
        }
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl Visitor<'_> for IdVisitor {
            type Value = Id;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-empty string or an integer id")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Id, E> {
                if v.is_empty() {
                    return Err(E::invalid_value(de::Unexpected::Str(v), &self));
                }
                Ok(Id::Text(v.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Id, E> {
                Ok(Id::Number(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Id, E> {
                Ok(Id::Number(v.into()))
            }
        }
        d.deserialize_any(IdVisitor)
    }
}

/// The `matricula.confirmada` payload, and the record stored in kv.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Matricula {
    /// The enrollment.
    pub matricula_id: Id,
    /// The student.
    pub usuario_id: Id,
    /// The course.
    pub curso_id: Id,
}

impl Matricula {
    /// The kv key of this enrollment's record.
    pub fn key(&self) -> String {
        format!("matricula/{}", self.matricula_id)
    }

    /// The dead-letter reason when the record holds this enrollment with other ids.
    pub fn confirmed_differently(&self) -> String {
        format!(
            "matricula {} was already confirmed with a different usuario_id or curso_id",
            self.matricula_id
        )
    }

    /// The log line when the same enrollment is recorded already (an ack, no new events).
    pub fn already_confirmed(&self) -> String {
        format!(
            "matricula {} already confirmed; nothing to do",
            self.matricula_id
        )
    }

    /// The log line once the record and the events are in.
    pub fn confirmed(&self) -> String {
        format!("matricula {} confirmed", self.matricula_id)
    }
}

/// The dead-letter reason of a body that is not a `matricula.confirmada` (`why`: what the
/// JSON reader said).
pub fn invalid(why: impl fmt::Display) -> String {
    format!("invalid matricula.confirmada: {why}")
}

/// The retry reason while config var `content_service` is `down`.
pub const CONTENT_SERVICE_DOWN: &str = "content service unavailable";

/// The header each event carries with the id of the message that caused it.
pub const CAUSATION_HEADER: &str = "x-causation-id";
