//! Counts messages, for exactly-once tests.
//!
//! On every message, inside the message's transaction:
//! - increments kv `runs` (decimal text);
//! - increments kv `seen/<message id>` when the message has an AMQP `message-id` (any value
//!   above 1 means the same message's effects committed twice);
//! - increments kv `counter/<key>` when the header `x-counter-key` is set;
//! - emits one JSON event to the exchange named by config var `out_exchange`
//!   (default `carteiro.events`) with routing key `counter.incremented`:
//!   `{"message_id": <id or null>, "runs": <new runs value>, "key": <header or null>}`;
//! - acks. A kv outage retries; any other host error dead-letters.

use carteiro_sdk::{Message, Verdict, config, export_handler, kv, outbox};

/// Default exchange for the emitted events.
pub const DEFAULT_OUT_EXCHANGE: &str = "carteiro.events";
/// Routing key of the emitted events.
pub const ROUTING_KEY: &str = "counter.incremented";
/// Header naming an extra counter to increment.
pub const KEY_HEADER: &str = "x-counter-key";

fn handle(msg: Message) -> Verdict {
    Verdict::from_result(count(&msg))
}

fn count(msg: &Message) -> Result<(), Verdict> {
    let runs = kv::incr("runs", 1)?;
    if let Some(id) = &msg.id {
        kv::incr(&format!("seen/{id}"), 1)?;
    }
    let key = msg.header(KEY_HEADER);
    if let Some(key) = key {
        kv::incr(&format!("counter/{key}"), 1)?;
    }
    let exchange = config::var_or("out_exchange", DEFAULT_OUT_EXCHANGE);
    let payload = serde_json::json!({ "message_id": msg.id, "runs": runs, "key": key });
    outbox::emit_json(&exchange, ROUTING_KEY, &payload)?;
    Ok(())
}

export_handler!(handle);

#[cfg(test)]
mod tests {
    use super::*;
    use carteiro_sdk::testing::{self, MockHost};

    #[test]
    fn counts_and_emits_one_event() {
        MockHost::reset();
        MockHost::set_var("out_exchange", "test.out");
        for i in 1..=3 {
            let msg = Message::new("q", "x")
                .with_id(format!("m-{i}"))
                .with_header(KEY_HEADER, "a");
            let out = testing::run(handle, msg);
            assert_eq!(out.verdict, Verdict::Ack);
            assert_eq!(out.events.len(), 1);
            let event = &out.events[0].event;
            assert_eq!(event.exchange, "test.out");
            assert_eq!(event.routing_key, ROUTING_KEY);
            let payload: serde_json::Value = event.payload_json().expect("JSON payload");
            assert_eq!(payload["runs"], i);
            assert_eq!(payload["message_id"], format!("m-{i}"));
        }
        assert_eq!(MockHost::kv_string("runs").as_deref(), Some("3"));
        assert_eq!(MockHost::kv_string("seen/m-2").as_deref(), Some("1"));
        assert_eq!(MockHost::kv_string("counter/a").as_deref(), Some("3"));
    }

    #[test]
    fn default_exchange_and_kv_outage() {
        MockHost::reset();
        let out = testing::run(handle, Message::new("q", ""));
        assert_eq!(out.events[0].event.exchange, DEFAULT_OUT_EXCHANGE);
        MockHost::set_kv_unavailable(Some("down"));
        assert!(
            testing::run(handle, Message::new("q", ""))
                .verdict
                .is_retry()
        );
        assert_eq!(MockHost::kv_string("runs").as_deref(), Some("1"));
    }
}
