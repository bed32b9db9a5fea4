//! A batch handler (`handle-batch`) for the batch tests. For each message of a batch, in
//! order, keyed by its AMQP `message-id` (`?` when absent):
//! - increments kv `done/<id>` and sets kv `batch-len/<id>` to the number of messages of the
//!   call it ran in (1 through `handle`);
//! - emits one JSON event `{"message_id": <id>, "batch": <len>}` to the exchange of config
//!   var `out_exchange` (default `carteiro.events`), routing key `counter-batch.done`;
//! - returns the verdict its body asks for: `ok` → ack; `retry` → retry on attempt 1, ack
//!   later; `dead` → dead-letter; `trap` → panics, which traps the whole batch; anything
//!   else → ack.

use carteiro_sdk::{Batch, Message, Verdict, config, export_batch_handler, kv, outbox};

/// Default exchange for the emitted events.
pub const DEFAULT_OUT_EXCHANGE: &str = "carteiro.events";
/// Routing key of the emitted events.
pub const ROUTING_KEY: &str = "counter-batch.done";

fn handle_batch(batch: Batch) -> Vec<Verdict> {
    let len = batch.len();
    batch.map(|msg| handle_one(&msg, len)).collect()
}

fn handle_one(msg: &Message, len: usize) -> Verdict {
    let id = msg.id.clone().unwrap_or_else(|| "?".to_owned());
    let effects = || -> Result<(), Verdict> {
        kv::incr(&format!("done/{id}"), 1)?;
        kv::set(&format!("batch-len/{id}"), len.to_string().as_bytes())?;
        let exchange = config::var_or("out_exchange", DEFAULT_OUT_EXCHANGE);
        let payload = serde_json::json!({ "message_id": id, "batch": len });
        outbox::emit_json(&exchange, ROUTING_KEY, &payload)?;
        Ok(())
    };
    if let Err(verdict) = effects() {
        return verdict;
    }
    match msg.text().unwrap_or("") {
        "retry" if msg.attempt < 2 => Verdict::retry("asked to retry once"),
        "dead" => Verdict::dead_letter("asked to dead-letter"),
        "trap" => panic!("asked to trap"),
        _ => Verdict::Ack,
    }
}

export_batch_handler!(handle_batch);

#[cfg(test)]
mod tests {
    use super::*;
    use carteiro_sdk::testing::{self, MockHost};

    fn msg(id: &str, body: &str) -> Message {
        let mut m = Message::new("k", body);
        m.id = Some(id.to_owned());
        m
    }

    #[test]
    fn each_message_keeps_its_own_effects() {
        MockHost::reset();
        let out = testing::run_batch(
            handle_batch,
            vec![msg("a", "ok"), msg("b", "retry"), msg("c", "dead")],
        );
        assert!(out[0].verdict.is_ack());
        assert!(out[1].verdict.is_retry());
        assert!(!out[2].verdict.is_ack() && !out[2].verdict.is_retry());
        assert_eq!(MockHost::kv_string("done/a").as_deref(), Some("1"));
        assert_eq!(MockHost::kv_string("batch-len/a").as_deref(), Some("3"));
        assert_eq!(MockHost::kv_string("done/b"), None);
        assert_eq!(MockHost::kv_string("done/c"), None);
        assert_eq!(MockHost::events().len(), 1);
    }
}
