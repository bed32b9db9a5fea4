//! The reference scenario: a confirmed enrollment (`matricula.confirmada`).
//!
//! Input: JSON `{"matricula_id", "usuario_id", "curso_id"}` (each a string or an integer).
//! Effects, committed together when the message acks:
//! - kv `matricula/<matricula_id>` = the enrollment record (JSON, see [`Matricula`]);
//! - three JSON events on the exchange named by config var `events_exchange` (default
//!   `carteiro.events`), each carrying the three ids:
//!   `acesso.liberado` (grant course access), `fatura.solicitada` (request the invoice),
//!   `email.solicitado` (request the welcome email).
//!
//! Verdicts:
//! - invalid JSON or a missing/mistyped field → dead-letter, e.g.
//!   ``invalid matricula.confirmada: missing field `curso_id` ``;
//! - config var `content_service` = `down` → retry, "content service unavailable";
//! - kv unavailable → retry;
//! - the same enrollment already recorded → ack without new events (a business-level
//!   duplicate: another message confirmed it already); recorded with other ids → dead-letter.

use std::fmt;

use carteiro_sdk::{BodyError, Message, Verdict, config, export_handler, info, kv, outbox};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Default exchange for the emitted events.
pub const DEFAULT_EVENTS_EXCHANGE: &str = "carteiro.events";
/// Routing key: course access granted.
pub const ACESSO_LIBERADO: &str = "acesso.liberado";
/// Routing key: invoice requested.
pub const FATURA_SOLICITADA: &str = "fatura.solicitada";
/// Routing key: welcome email requested.
pub const EMAIL_SOLICITADO: &str = "email.solicitado";

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

fn handle(msg: Message) -> Verdict {
    Verdict::from_result(confirm(&msg))
}

fn confirm(msg: &Message) -> Result<(), Verdict> {
    let matricula: Matricula = msg.json().map_err(|e| match e {
        BodyError::Json(e) => {
            Verdict::dead_letter(format!("invalid matricula.confirmada: {}", e.description()))
        }
        BodyError::NotUtf8 { .. } => {
            Verdict::dead_letter(format!("invalid matricula.confirmada: {e}"))
        }
    })?;

    if config::var("content_service").as_deref() == Some("down") {
        return Err(Verdict::retry("content service unavailable"));
    }

    let key = format!("matricula/{}", matricula.matricula_id);
    match kv::get_json::<Matricula>(&key)? {
        Some(existing) if existing == matricula => {
            info!(
                "matricula {} already confirmed; nothing to do",
                matricula.matricula_id
            );
            return Ok(());
        }
        Some(_) => {
            return Err(Verdict::dead_letter(format!(
                "matricula {} was already confirmed with a different usuario_id or curso_id",
                matricula.matricula_id
            )));
        }
        None => {}
    }
    kv::set_json(&key, &matricula)?;

    let exchange = config::var_or("events_exchange", DEFAULT_EVENTS_EXCHANGE);
    for routing_key in [ACESSO_LIBERADO, FATURA_SOLICITADA, EMAIL_SOLICITADO] {
        let mut event = outbox::Event::json(exchange.as_str(), routing_key, &matricula)?;
        if let Some(id) = &msg.id {
            event = event.with_header("x-causation-id", id.as_str());
        }
        outbox::emit(event)?;
    }
    info!("matricula {} confirmed", matricula.matricula_id);
    Ok(())
}

export_handler!(handle);

#[cfg(test)]
mod tests {
    use super::*;
    use carteiro_sdk::testing::{self, MockHost};
    use serde_json::json;

    fn confirmada(body: serde_json::Value) -> Message {
        Message::from_json("matricula.confirmada", &body).with_id("msg-1")
    }

    #[test]
    fn records_and_emits_three_events() {
        MockHost::reset();
        MockHost::set_var("events_exchange", "escola.eventos");
        let out = testing::run(
            handle,
            confirmada(json!({"matricula_id": "m-1", "usuario_id": 7, "curso_id": "rust-101"})),
        );
        assert_eq!(out.verdict, Verdict::Ack);
        let keys: Vec<_> = out
            .events
            .iter()
            .map(|e| e.event.routing_key.as_str())
            .collect();
        assert_eq!(keys, [ACESSO_LIBERADO, FATURA_SOLICITADA, EMAIL_SOLICITADO]);
        for e in &out.events {
            assert_eq!(e.event.exchange, "escola.eventos");
            assert_eq!(e.event.content_type.as_deref(), Some("application/json"));
            let payload: serde_json::Value = e.event.payload_json().expect("JSON payload");
            assert_eq!(
                payload,
                json!({"matricula_id": "m-1", "usuario_id": 7, "curso_id": "rust-101"})
            );
        }
        let record: serde_json::Value = MockHost::kv_json("matricula/m-1").expect("record");
        assert_eq!(record["curso_id"], "rust-101");
        assert_eq!(MockHost::events().len(), 3);
    }

    #[test]
    fn malformed_payloads_dead_letter_naming_the_problem() {
        MockHost::reset();
        let out = testing::run(
            handle,
            confirmada(json!({"matricula_id": "m-1", "usuario_id": "u-1"})),
        );
        assert_eq!(
            out.verdict,
            Verdict::dead_letter("invalid matricula.confirmada: missing field `curso_id`")
        );
        let out = testing::run(handle, Message::new("matricula.confirmada", "{oops"));
        assert!(out.verdict.is_dead_letter());
        assert!(
            out.verdict.reason().is_some_and(
                |r| r.starts_with("invalid matricula.confirmada: key must be a string")
            )
        );
        let out = testing::run(
            handle,
            confirmada(json!({"matricula_id": true, "usuario_id": 1, "curso_id": 2})),
        );
        assert!(out.verdict.is_dead_letter());
        assert!(MockHost::kv_entries().is_empty());
        assert!(MockHost::events().is_empty());
    }

    #[test]
    fn content_service_down_retries_without_effects() {
        MockHost::reset();
        MockHost::set_var("content_service", "down");
        let body = json!({"matricula_id": 1, "usuario_id": 2, "curso_id": 3});
        let out = testing::run(handle, confirmada(body.clone()));
        assert_eq!(out.verdict, Verdict::retry("content service unavailable"));
        assert!(MockHost::kv_entries().is_empty());
        MockHost::set_var("content_service", "up");
        assert!(testing::run(handle, confirmada(body)).verdict.is_ack());
    }

    #[test]
    fn kv_outage_retries() {
        MockHost::reset();
        MockHost::set_kv_unavailable(Some("database down"));
        let body = json!({"matricula_id": 1, "usuario_id": 2, "curso_id": 3});
        let out = testing::run(handle, confirmada(body));
        assert!(out.verdict.is_retry());
        assert!(MockHost::events().is_empty());
    }

    #[test]
    fn duplicate_enrollment_acks_without_new_events() {
        MockHost::reset();
        let body = json!({"matricula_id": 1, "usuario_id": 2, "curso_id": 3});
        assert!(
            testing::run(handle, confirmada(body.clone()))
                .verdict
                .is_ack()
        );
        let again = testing::run(handle, confirmada(body));
        assert!(again.verdict.is_ack());
        assert!(again.events.is_empty());
        let conflicting = json!({"matricula_id": 1, "usuario_id": 9, "curso_id": 3});
        assert!(
            testing::run(handle, confirmada(conflicting))
                .verdict
                .is_dead_letter()
        );
        assert_eq!(MockHost::events().len(), 3);
    }
}
