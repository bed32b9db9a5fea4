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

use carteiro_sdk::{BodyError, Message, Verdict, config, export_handler, info, kv, outbox};
pub use enrollment_rules::{
    ACESSO_LIBERADO, DEFAULT_EVENTS_EXCHANGE, EMAIL_SOLICITADO, FATURA_SOLICITADA, Id, Matricula,
};
use enrollment_rules::{CAUSATION_HEADER, CONTENT_SERVICE_DOWN, ROUTING_KEYS, invalid};

fn handle(msg: Message) -> Verdict {
    Verdict::from_result(confirm(&msg))
}

fn confirm(msg: &Message) -> Result<(), Verdict> {
    let matricula: Matricula = msg.json().map_err(|e| match e {
        // Not JSON at all: where it breaks helps whoever fixes the publisher.
        BodyError::Json(e) if e.is_syntax() => Verdict::dead_letter(invalid(format_args!(
            "{} at line {} column {}",
            e.description(),
            e.line(),
            e.column()
        ))),
        // JSON of the wrong shape: the same wording for every message with the same fault,
        // so they group as one reason.
        BodyError::Json(e) => Verdict::dead_letter(invalid(e.description())),
        BodyError::NotUtf8 { .. } => Verdict::dead_letter(invalid(&e)),
    })?;

    if config::var("content_service").as_deref() == Some("down") {
        return Err(Verdict::retry(CONTENT_SERVICE_DOWN));
    }

    let key = matricula.key();
    match kv::get_json::<Matricula>(&key)? {
        Some(existing) if existing == matricula => {
            info!("{}", matricula.already_confirmed());
            return Ok(());
        }
        Some(_) => return Err(Verdict::dead_letter(matricula.confirmed_differently())),
        None => {}
    }
    kv::set_json(&key, &matricula)?;

    let exchange = config::var_or("events_exchange", DEFAULT_EVENTS_EXCHANGE);
    for routing_key in ROUTING_KEYS {
        let mut event = outbox::Event::json(exchange.as_str(), routing_key, &matricula)?;
        if let Some(id) = &msg.id {
            event = event.with_header(CAUSATION_HEADER, id.as_str());
        }
        outbox::emit(event)?;
    }
    info!("{}", matricula.confirmed());
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
        assert_eq!(
            out.verdict.reason(),
            Some("invalid matricula.confirmada: key must be a string at line 1 column 2"),
            "a syntax error says where"
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
