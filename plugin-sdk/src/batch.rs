//! [`Batch`]: the messages a batch handler is given (see
//! [`export_batch_handler!`](crate::export_batch_handler)).

use crate::Message;

/// The messages of one `handle-batch` call, in delivery order: iterate it and return one
/// [`Verdict`](crate::Verdict) per message, in the same order.
///
/// Taking message `i` from the iterator tells the host that the `kv`, `outbox` and `log`
/// calls that follow belong to message `i`: its kv writes and events are committed only if
/// its own verdict is ack, and its kv reads see the committed store and its own writes only.
/// So handle the messages one after another, in the order the iterator gives them.
/// Isolation is per batch, not per message: globals a handler sets while handling one
/// message are seen by the next ones.
#[derive(Debug)]
pub struct Batch {
    messages: std::vec::IntoIter<Message>,
    next: u32,
    /// Whether taking a message tells the host (not for a single `handle` call).
    attribute: bool,
}

impl Batch {
    /// A batch of `messages` whose host calls are attributed message by message.
    #[doc(hidden)]
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            messages: messages.into_iter(),
            next: 0,
            attribute: true,
        }
    }

    /// One message handed to `handle` (a route without `batch`): nothing to attribute.
    #[doc(hidden)]
    pub fn single(message: Message) -> Self {
        Self {
            messages: vec![message].into_iter(),
            next: 0,
            attribute: false,
        }
    }
}

impl Iterator for Batch {
    type Item = Message;

    fn next(&mut self) -> Option<Message> {
        let message = self.messages.next()?;
        if self.attribute {
            crate::host::batch_item(self.next);
        }
        self.next += 1;
        Some(message)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.messages.size_hint()
    }
}

impl ExactSizeIterator for Batch {}

#[cfg(test)]
mod tests {
    use crate::testing::{self, MockHost};
    use crate::{Batch, Message, Verdict, kv, outbox};

    fn handle(batch: Batch) -> Vec<Verdict> {
        batch
            .map(|msg| {
                let n = kv::incr("count", 1).expect("mock kv");
                if let Err(e) = outbox::emit(outbox::Event::new(
                    "ex",
                    msg.routing_key.clone(),
                    msg.body.clone(),
                )) {
                    return e.into();
                }
                match msg.text().unwrap_or("") {
                    "retry" => Verdict::retry(format!("asked (count read {n})")),
                    "dead" => Verdict::dead_letter("asked"),
                    _ => Verdict::Ack,
                }
            })
            .collect()
    }

    #[test]
    fn each_message_commits_only_its_own_effects_and_reads_only_the_committed_store() {
        MockHost::reset();
        let outcomes = testing::run_batch(
            handle,
            vec![
                Message::new("a", "ok"),
                Message::new("b", "retry"),
                Message::new("c", "dead"),
                Message::new("d", "ok"),
            ],
        );
        let verdicts: Vec<_> = outcomes.iter().map(|o| o.verdict.clone()).collect();
        assert!(verdicts[0].is_ack() && verdicts[3].is_ack());
        assert!(verdicts[1].is_retry());
        assert!(
            !verdicts[2].is_ack() && !verdicts[2].is_retry(),
            "dead-lettered"
        );
        // Every message read the committed (empty) store, not an earlier message's write.
        assert_eq!(
            verdicts[1],
            Verdict::retry("asked (count read 1)"),
            "message b saw a's uncommitted write"
        );
        for o in &outcomes {
            assert_eq!(
                o.events.len(),
                1,
                "one event each, attributed to its message"
            );
            assert_eq!(o.kv_writes.len(), 1);
        }
        // Two acked messages each wrote count = 1 from the same snapshot: last one wins,
        // as two concurrent deliveries would conflict and re-run on the gateway.
        assert_eq!(MockHost::kv_string("count").as_deref(), Some("1"));
        let published: Vec<_> = MockHost::events()
            .into_iter()
            .map(|e| e.event.routing_key)
            .collect();
        assert_eq!(published, vec!["a", "d"], "only the acked messages' events");
    }

    #[test]
    fn a_wrong_number_of_verdicts_retries_every_message_without_effects() {
        fn short(batch: Batch) -> Vec<Verdict> {
            for _message in batch {
                kv::set("k", b"v").expect("kv");
            }
            vec![Verdict::Ack]
        }
        MockHost::reset();
        let outcomes =
            testing::run_batch(short, vec![Message::new("a", "1"), Message::new("b", "2")]);
        assert!(outcomes.iter().all(|o| o.verdict.is_retry()));
        assert!(outcomes.iter().all(|o| o.kv_writes.is_empty()));
        assert_eq!(MockHost::kv_string("k"), None);
    }
}
