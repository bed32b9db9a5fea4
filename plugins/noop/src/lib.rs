//! Acks every message without touching kv or the outbox: the baseline for benchmarks.

use carteiro_sdk::{Message, Verdict, export_handler};

fn handle(_msg: Message) -> Verdict {
    Verdict::Ack
}

export_handler!(handle);

#[cfg(test)]
mod tests {
    use super::*;
    use carteiro_sdk::testing::{self, MockHost};

    #[test]
    fn acks_without_effects() {
        MockHost::reset();
        let out = testing::run(handle, Message::new("any", "whatever"));
        assert_eq!(out.verdict, Verdict::Ack);
        assert!(out.events.is_empty());
        assert!(out.kv_writes.is_empty());
    }
}
