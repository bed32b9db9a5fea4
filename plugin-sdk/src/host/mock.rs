//! The in-memory mock host used off wasm32: one state per thread, so parallel tests
//! (each on its own thread) never see each other's kv, events or config.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::log::Level;
use crate::outbox::{Event, EventId};
use crate::{KvError, OutboxError, rules};

/// An event the handler emitted, with the id the mock host gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmittedEvent {
    /// The id returned to the handler.
    pub id: EventId,
    /// The event as emitted.
    pub event: Event,
}

/// One line the handler logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Its level.
    pub level: Level,
    /// Its text.
    pub message: String,
}

/// Limits the mock host enforces, so tests see the same typed errors as in production.
///
/// The defaults are the gateway's: 1 KiB keys, 4 MiB values, 8 MiB payloads, and the
/// per-plugin defaults `max_events = 100`, `max_host_calls = 10000`. Match what your
/// operator configures with
/// [`MockHost::set_limits`](crate::testing::MockHost::set_limits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest accepted kv key, in bytes.
    pub max_key_len: usize,
    /// Largest accepted kv value, in bytes.
    pub max_value_len: usize,
    /// Most events one message may emit.
    pub max_events: u32,
    /// Largest accepted event payload, in bytes.
    pub max_payload_len: usize,
    /// Most host calls (kv, outbox, log, config) one message may make. Exceeding it traps
    /// the component on the real host; [`run`](crate::testing::run) panics instead.
    pub max_host_calls: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_len: rules::MAX_KV_KEY_BYTES,
            max_value_len: rules::MAX_KV_VALUE_BYTES,
            max_events: 100,
            max_payload_len: rules::MAX_EVENT_PAYLOAD_BYTES,
            max_host_calls: 10_000,
        }
    }
}

/// Everything the mock host holds for one thread.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) kv: BTreeMap<String, Vec<u8>>,
    pub(crate) vars: BTreeMap<String, String>,
    pub(crate) events: Vec<EmittedEvent>,
    pub(crate) logs: Vec<LogRecord>,
    pub(crate) kv_unavailable: Option<String>,
    pub(crate) limits: Limits,
    /// Inside `testing::run`: host calls and events are counted against the limits.
    pub(crate) in_message: bool,
    pub(crate) message_events: u32,
    pub(crate) message_calls: u32,
    /// Inside `testing::run_batch`: the other messages' state.
    pub(crate) batch: Option<MockBatch>,
    next_event: u64,
}

/// A batch being handled (`testing::run_batch`), as the real host keeps it: one kv view,
/// event list, log list and count of host calls per message. The current message's live in
/// [`State`]; the others are parked here.
#[derive(Debug, Default)]
pub(crate) struct MockBatch {
    pub(crate) items: Vec<Parked>,
    pub(crate) current: usize,
    /// `State::events` and `State::logs` lengths when the batch began.
    pub(crate) events_mark: usize,
    pub(crate) logs_mark: usize,
}

/// One message of a batch while another is current.
#[derive(Debug, Default, Clone)]
pub(crate) struct Parked {
    pub(crate) kv: BTreeMap<String, Vec<u8>>,
    pub(crate) events: Vec<EmittedEvent>,
    pub(crate) logs: Vec<LogRecord>,
    pub(crate) calls: u32,
    pub(crate) event_count: u32,
}

/// Moves the current message's state out of `state` into its parking place.
pub(crate) fn park(state: &mut State) {
    let Some(mut batch) = state.batch.take() else {
        return;
    };
    if let Some(item) = batch.items.get_mut(batch.current) {
        item.kv = state.kv.clone();
        item.events.extend(state.events.drain(batch.events_mark..));
        item.logs.extend(state.logs.drain(batch.logs_mark..));
        item.calls = state.message_calls;
        item.event_count = state.message_events;
    }
    state.batch = Some(batch);
}

/// Host calls from now on belong to message `index` of the batch. Like the real host, which
/// traps, calling it outside a batch or past its end panics.
pub(crate) fn batch_item(index: u32) {
    with(|s| {
        host_call(s);
        let len = s.batch.as_ref().map(|b| b.items.len());
        match len {
            None => panic!(
                "carteiro mock host: batch item {index} outside a batch (the real host traps)"
            ),
            Some(len) if index as usize >= len => panic!(
                "carteiro mock host: batch item {index} in a batch of {len} (the real host traps)"
            ),
            Some(_) => {}
        }
        park(s);
        if let Some(batch) = s.batch.as_mut() {
            let item = &batch.items[index as usize];
            s.kv = item.kv.clone();
            s.message_calls = item.calls;
            s.message_events = item.event_count;
            batch.current = index as usize;
        }
    });
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Runs `f` on this thread's mock state.
pub(crate) fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

/// Counts one host call of the message being handled. Like the real host, which traps the
/// component, exceeding the cap panics: the test fails unless it expects the panic.
fn host_call(state: &mut State) {
    if !state.in_message {
        return;
    }
    state.message_calls += 1;
    if state.message_calls > state.limits.max_host_calls {
        let max = state.limits.max_host_calls;
        // Stop counting, so a test that catches the panic can keep using the mock.
        state.in_message = false;
        panic!("carteiro mock host: the handler exceeded {max} host calls (the real host traps)");
    }
}

fn check_key(state: &State, key: &str) -> Result<(), KvError> {
    match rules::kv_key_problem(key, state.limits.max_key_len) {
        Some(why) => Err(KvError::InvalidKey(why)),
        None => Ok(()),
    }
}

pub(crate) fn kv_get(key: &str) -> Result<Option<Vec<u8>>, KvError> {
    with(|s| {
        host_call(s);
        check_key(s, key)?;
        // Like the real host: only reads reach the store; writes are buffered until commit.
        if let Some(why) = &s.kv_unavailable {
            return Err(KvError::Unavailable(why.clone()));
        }
        Ok(s.kv.get(key).cloned())
    })
}

pub(crate) fn kv_set(key: &str, value: &[u8]) -> Result<(), KvError> {
    with(|s| {
        host_call(s);
        check_key(s, key)?;
        if value.len() > s.limits.max_value_len {
            return Err(KvError::ValueTooLarge(s.limits.max_value_len as u64));
        }
        s.kv.insert(key.to_owned(), value.to_vec());
        Ok(())
    })
}

pub(crate) fn kv_delete(key: &str) -> Result<(), KvError> {
    with(|s| {
        host_call(s);
        check_key(s, key)?;
        s.kv.remove(key);
        Ok(())
    })
}

fn check_event(event: &Event, max_payload_len: usize) -> Result<(), OutboxError> {
    let headers = event
        .headers
        .iter()
        .map(|h| (h.name.as_str(), h.value.as_str()));
    let content_type = event.content_type.as_deref();
    if let Some(why) =
        rules::event_problem(&event.exchange, &event.routing_key, content_type, headers)
    {
        return Err(OutboxError::InvalidEvent(why));
    }
    if event.payload.len() > max_payload_len {
        return Err(OutboxError::PayloadTooLarge(max_payload_len as u64));
    }
    Ok(())
}

pub(crate) fn outbox_emit(event: Event) -> Result<EventId, OutboxError> {
    with(|s| {
        host_call(s);
        if s.message_events >= s.limits.max_events {
            return Err(OutboxError::TooManyEvents(s.limits.max_events));
        }
        check_event(&event, s.limits.max_payload_len)?;
        s.message_events += 1;
        s.next_event += 1;
        // Shaped like a UUIDv7 so code that parses ids keeps working in tests.
        let id = EventId(format!("00000000-0000-7000-8000-{:012x}", s.next_event));
        s.events.push(EmittedEvent {
            id: id.clone(),
            event,
        });
        Ok(id)
    })
}

pub(crate) fn log(level: Level, message: &str) {
    with(|s| {
        host_call(s);
        s.logs.push(LogRecord {
            level,
            message: message.to_owned(),
        })
    });
}

pub(crate) fn config_get(name: &str) -> Option<String> {
    with(|s| {
        host_call(s);
        s.vars.get(name).cloned()
    })
}

pub(crate) fn config_all() -> Vec<(String, String)> {
    with(|s| s.vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}
