//! Unit-test handlers natively with plain `cargo test` (not available on wasm32).
//!
//! Off wasm32 every `kv`, `outbox`, `log` and `config` call goes to an in-memory mock host
//! held per thread (each `#[test]` runs on its own thread, so tests stay isolated).
//! [`run`] calls a handler the way the gateway does: kv writes and events are kept only if
//! the verdict is [`Verdict::Ack`](crate::Verdict::Ack), and discarded otherwise.
//!
//! ```
//! use carteiro_sdk::testing::{self, MockHost};
//! use carteiro_sdk::{kv, Message, Verdict};
//!
//! fn handle(_msg: Message) -> Verdict {
//!     match kv::incr("seen", 1) {
//!         Ok(_) => Verdict::Ack,
//!         Err(e) => e.into(),
//!     }
//! }
//!
//! MockHost::reset();
//! let outcome = testing::run(handle, Message::new("any", "hi"));
//! assert!(outcome.verdict.is_ack());
//! assert_eq!(MockHost::kv_string("seen").as_deref(), Some("1"));
//!
//! MockHost::set_kv_unavailable(Some("database down"));
//! assert!(testing::run(handle, Message::new("any", "hi")).verdict.is_retry());
//! ```

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;

use crate::host::mock::{self, MockBatch, Parked, State};
use crate::outbox::Event;
use crate::{Batch, Message, Verdict};

// Defined with the mock host's state, which holds them; authors name them from here.
pub use crate::host::mock::{EmittedEvent, Limits, LogRecord};

/// What one [`run`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The handler's verdict.
    pub verdict: Verdict,
    /// Events the handler emitted, in order. Committed (visible in [`MockHost::events`])
    /// only if the verdict is ack.
    pub events: Vec<EmittedEvent>,
    /// kv changes the handler made, by key: `Some(value)` written, `None` deleted. Committed
    /// only if the verdict is ack.
    pub kv_writes: BTreeMap<String, Option<Vec<u8>>>,
    /// Lines the handler logged (kept whatever the verdict).
    pub logs: Vec<LogRecord>,
}

impl Outcome {
    /// The emitted events with this routing key.
    pub fn events_to(&self, routing_key: &str) -> Vec<&Event> {
        self.events
            .iter()
            .map(|e| &e.event)
            .filter(|e| e.routing_key == routing_key)
            .collect()
    }
}

/// Runs `handler` on `message` like the gateway does: effects commit only on ack.
///
/// Panics if the handler panics (a trap on the real host) or exceeds
/// [`Limits::max_host_calls`].
pub fn run(handler: fn(Message) -> Verdict, message: Message) -> Outcome {
    let (kv_before, events_before, logs_before) = mock::with(|s| {
        s.in_message = true;
        s.message_events = 0;
        s.message_calls = 0;
        (s.kv.clone(), s.events.len(), s.logs.len())
    });
    let verdict = handler(message);
    mock::with(|s| {
        let kv_writes = diff(&kv_before, &s.kv);
        let events = s.events[events_before..].to_vec();
        let logs = s.logs[logs_before..].to_vec();
        if !verdict.is_ack() {
            s.kv = kv_before;
            s.events.truncate(events_before);
        }
        s.in_message = false;
        s.message_events = 0;
        Outcome {
            verdict,
            events,
            kv_writes,
            logs,
        }
    })
}

/// Runs a batch `handler` on `messages` like the gateway does: one [`Outcome`] per message,
/// each with the effects made while it was the current message of the [`Batch`]; the kv
/// writes and events of each acked message commit (in message order), the others' are
/// discarded. A handler that returns another number of verdicts than messages gets, like on
/// the gateway, a retry for every message and no effects.
///
/// Panics if the handler panics (a trap on the real host) or exceeds
/// [`Limits::max_host_calls`] for one message.
pub fn run_batch(handler: fn(Batch) -> Vec<Verdict>, messages: Vec<Message>) -> Vec<Outcome> {
    let n = messages.len();
    let base = mock::with(|s| {
        s.in_message = true;
        s.message_events = 0;
        s.message_calls = 0;
        s.batch = Some(MockBatch {
            items: vec![
                Parked {
                    kv: s.kv.clone(),
                    ..Parked::default()
                };
                n
            ],
            current: 0,
            events_mark: s.events.len(),
            logs_mark: s.logs.len(),
        });
        s.kv.clone()
    });
    let verdicts = handler(Batch::new(messages));
    mock::with(|s| {
        mock::park(s);
        let items = s.batch.take().unwrap_or_default().items;
        s.kv = base.clone();
        s.in_message = false;
        s.message_events = 0;
        let wrong_length = verdicts.len() != n;
        let reason = format!(
            "the batch handler returned {} verdicts for {n} messages; every message of the \
             batch is retried",
            verdicts.len()
        );
        let mut verdicts = verdicts.into_iter();
        items
            .into_iter()
            .map(|item| {
                let verdict = match verdicts.next() {
                    Some(v) if !wrong_length => v,
                    _ => Verdict::retry(reason.clone()),
                };
                let kv_writes = diff(&base, &item.kv);
                s.logs.extend(item.logs.iter().cloned());
                if verdict.is_ack() {
                    for (key, value) in &kv_writes {
                        match value {
                            Some(v) => s.kv.insert(key.clone(), v.clone()),
                            None => s.kv.remove(key),
                        };
                    }
                    s.events.extend(item.events.iter().cloned());
                }
                Outcome {
                    verdict,
                    events: if wrong_length {
                        Vec::new()
                    } else {
                        item.events
                    },
                    kv_writes: if wrong_length {
                        BTreeMap::new()
                    } else {
                        kv_writes
                    },
                    logs: item.logs,
                }
            })
            .collect()
    })
}

fn diff(
    before: &BTreeMap<String, Vec<u8>>,
    after: &BTreeMap<String, Vec<u8>>,
) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut writes = BTreeMap::new();
    for (key, value) in after {
        if before.get(key) != Some(value) {
            writes.insert(key.clone(), Some(value.clone()));
        }
    }
    for key in before.keys() {
        if !after.contains_key(key) {
            writes.insert(key.clone(), None);
        }
    }
    writes
}

/// Controls and inspects this thread's mock host. All functions are associated: there is
/// one mock host per thread.
#[derive(Debug)]
pub struct MockHost;

impl MockHost {
    /// Clears kv, config vars, events, logs, the unavailability switch and the limits.
    pub fn reset() {
        mock::with(|s| *s = State::default());
    }

    /// Sets a config variable, as `[plugins.NAME.variables]` would.
    pub fn set_var(name: &str, value: &str) {
        mock::with(|s| s.vars.insert(name.to_owned(), value.to_owned()));
    }

    /// Unsets a config variable.
    pub fn remove_var(name: &str) {
        mock::with(|s| s.vars.remove(name));
    }

    /// Makes kv reads (`get`) fail with
    /// [`KvError::Unavailable`](crate::KvError::Unavailable) carrying `reason`, as the real
    /// host does when its database is down (writes are buffered until commit, so they do
    /// not fail). `None` makes the store reachable again.
    pub fn set_kv_unavailable(reason: Option<&str>) {
        mock::with(|s| s.kv_unavailable = reason.map(str::to_owned));
    }

    /// Replaces the enforced limits.
    pub fn set_limits(limits: Limits) {
        mock::with(|s| s.limits = limits);
    }

    /// Seeds (or overwrites) a committed kv value.
    pub fn kv_insert(key: &str, value: impl AsRef<[u8]>) {
        mock::with(|s| s.kv.insert(key.to_owned(), value.as_ref().to_vec()));
    }

    /// The committed value under `key`.
    pub fn kv(key: &str) -> Option<Vec<u8>> {
        mock::with(|s| s.kv.get(key).cloned())
    }

    /// The committed value under `key` as UTF-8 text (`None` if missing or not UTF-8).
    pub fn kv_string(key: &str) -> Option<String> {
        Self::kv(key).and_then(|v| String::from_utf8(v).ok())
    }

    /// The committed value under `key` decoded from JSON (`None` if missing or not `T`).
    pub fn kv_json<T: DeserializeOwned>(key: &str) -> Option<T> {
        Self::kv(key).and_then(|v| serde_json::from_slice(&v).ok())
    }

    /// Every committed kv entry.
    pub fn kv_entries() -> BTreeMap<String, Vec<u8>> {
        mock::with(|s| s.kv.clone())
    }

    /// Every committed event, in emission order.
    pub fn events() -> Vec<EmittedEvent> {
        mock::with(|s| s.events.clone())
    }

    /// Every logged line since the last reset.
    pub fn logs() -> Vec<LogRecord> {
        mock::with(|s| s.logs.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KvError, OutboxError, config, kv, outbox};

    fn counting(msg: Message) -> Verdict {
        let n = match kv::incr("runs", 1) {
            Ok(n) => n,
            Err(e) => return e.into(),
        };
        let exchange = config::var_or("out_exchange", "carteiro.events");
        if let Err(e) = outbox::emit_json(&exchange, "counted", &serde_json::json!({ "n": n })) {
            return e.into();
        }
        crate::info!("counted {n}");
        match msg.header("verdict") {
            Some("retry") => Verdict::retry("asked to"),
            Some("dead") => Verdict::dead_letter("asked to"),
            _ => Verdict::Ack,
        }
    }

    #[test]
    fn ack_commits_kv_and_events() {
        MockHost::reset();
        MockHost::set_var("out_exchange", "ex");
        let out = run(counting, Message::new("k", "x"));
        assert!(out.verdict.is_ack());
        assert_eq!(out.kv_writes.get("runs"), Some(&Some(b"1".to_vec())));
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].event.exchange, "ex");
        assert_eq!(
            out.events[0].event.content_type.as_deref(),
            Some(outbox::JSON)
        );
        assert_eq!(out.logs[0].message, "counted 1");
        assert_eq!(MockHost::events().len(), 1);
        assert_eq!(MockHost::kv_string("runs").as_deref(), Some("1"));
        let payload: serde_json::Value = MockHost::events()[0].event.payload_json().unwrap();
        assert_eq!(payload["n"], 1);
    }

    #[test]
    fn retry_and_dead_letter_discard_effects() {
        MockHost::reset();
        run(counting, Message::new("k", "x"));
        for verdict in ["retry", "dead"] {
            let out = run(
                counting,
                Message::new("k", "x").with_header("verdict", verdict),
            );
            assert!(!out.verdict.is_ack());
            assert_eq!(out.events.len(), 1, "the run still reports what it tried");
            assert_eq!(MockHost::kv_string("runs").as_deref(), Some("1"));
            assert_eq!(MockHost::events().len(), 1);
        }
    }

    #[test]
    fn unavailable_kv_retries() {
        MockHost::reset();
        MockHost::set_kv_unavailable(Some("db down"));
        let out = run(counting, Message::default());
        assert_eq!(out.verdict, Verdict::retry("kv unavailable: db down"));
        MockHost::set_kv_unavailable(None);
        assert!(run(counting, Message::default()).verdict.is_ack());
    }

    #[test]
    fn invalid_keys_and_limits_are_typed_errors() {
        MockHost::reset();
        assert!(matches!(kv::set("", "v"), Err(KvError::InvalidKey(_))));
        assert!(matches!(kv::get("a\0b"), Err(KvError::InvalidKey(_))));
        MockHost::set_limits(Limits {
            max_events: 1,
            max_value_len: 3,
            ..Limits::default()
        });
        assert_eq!(kv::set("k", "long"), Err(KvError::ValueTooLarge(3)));
        fn two_events(_: Message) -> Verdict {
            let first = outbox::emit(outbox::Event::new("ex", "a", "1"));
            assert!(first.is_ok());
            match outbox::emit(outbox::Event::new("ex", "b", "2")) {
                Err(OutboxError::TooManyEvents(1)) => Verdict::dead_letter("limit"),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            run(two_events, Message::default()).verdict.reason(),
            Some("limit")
        );
        assert!(matches!(
            outbox::emit(outbox::Event::new("ex", "bad\0key", "")),
            Err(OutboxError::InvalidEvent(_))
        ));
    }

    #[test]
    #[should_panic(expected = "exceeded 3 host calls")]
    fn host_call_cap_panics_like_a_trap() {
        MockHost::reset();
        MockHost::set_limits(Limits {
            max_host_calls: 3,
            ..Limits::default()
        });
        fn flood(_: Message) -> Verdict {
            loop {
                let _ = kv::get("k");
            }
        }
        run(flood, Message::default());
    }

    #[test]
    fn host_calls_outside_run_are_not_counted() {
        MockHost::reset();
        MockHost::set_limits(Limits {
            max_host_calls: 1,
            ..Limits::default()
        });
        for i in 0..5 {
            kv::set(&format!("seed/{i}"), "x").unwrap();
        }
        fn one_call(_: Message) -> Verdict {
            Verdict::from(kv::get("seed/1").map(|_| Verdict::Ack))
        }
        assert!(run(one_call, Message::default()).verdict.is_ack());
    }

    #[test]
    fn json_helpers_round_trip() {
        MockHost::reset();
        kv::set_json("doc", &serde_json::json!({"a": 1})).unwrap();
        let doc: serde_json::Value = kv::get_json("doc").unwrap().unwrap();
        assert_eq!(doc["a"], 1);
        assert_eq!(kv::get_json::<u8>("missing"), Ok(None));
        kv::set("n", "x").unwrap();
        assert!(matches!(kv::incr("n", 1), Err(KvError::Codec(_))));
        assert!(matches!(kv::get_json::<u8>("n"), Err(KvError::Codec(_))));
        kv::delete("n").unwrap();
        assert_eq!(kv::contains("n"), Ok(false));
    }

    #[test]
    fn config_vars_are_listed() {
        MockHost::reset();
        MockHost::set_var("b", "2");
        MockHost::set_var("a", "1");
        assert_eq!(
            config::vars(),
            vec![("a".into(), "1".into()), ("b".into(), "2".into())]
        );
        MockHost::remove_var("a");
        assert_eq!(config::var("a"), None);
        assert_eq!(config::var_or("a", "d"), "d");
    }
}
