//! The in-memory mock host used off wasm32: one state per thread, so parallel tests
//! (each on its own thread) never see each other's kv, events or config.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::log::Level;
use crate::outbox::{Event, EventId};
use crate::testing::{EmittedEvent, Limits, LogRecord};
use crate::{KvError, OutboxError};

/// Everything the mock host holds for one thread.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) kv: BTreeMap<String, Vec<u8>>,
    pub(crate) vars: BTreeMap<String, String>,
    pub(crate) events: Vec<EmittedEvent>,
    pub(crate) logs: Vec<LogRecord>,
    pub(crate) kv_unavailable: Option<String>,
    pub(crate) limits: Limits,
    /// Events emitted by the message being handled (checked against the limit).
    pub(crate) message_events: u32,
    next_event: u64,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Runs `f` on this thread's mock state.
pub(crate) fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

fn check_key(state: &State, key: &str) -> Result<(), KvError> {
    if let Some(why) = &state.kv_unavailable {
        return Err(KvError::Unavailable(why.clone()));
    }
    if key.is_empty() {
        return Err(KvError::InvalidKey("key is empty".into()));
    }
    if key.contains('\0') {
        return Err(KvError::InvalidKey("key contains a NUL character".into()));
    }
    if key.len() > state.limits.max_key_len {
        return Err(KvError::InvalidKey(format!(
            "key is {} bytes, the limit is {}",
            key.len(),
            state.limits.max_key_len
        )));
    }
    Ok(())
}

pub(crate) fn kv_get(key: &str) -> Result<Option<Vec<u8>>, KvError> {
    with(|s| {
        check_key(s, key)?;
        Ok(s.kv.get(key).cloned())
    })
}

pub(crate) fn kv_set(key: &str, value: &[u8]) -> Result<(), KvError> {
    with(|s| {
        check_key(s, key)?;
        if value.len() > s.limits.max_value_len {
            return Err(KvError::ValueTooLarge(value.len() as u64));
        }
        s.kv.insert(key.to_owned(), value.to_vec());
        Ok(())
    })
}

pub(crate) fn kv_delete(key: &str) -> Result<(), KvError> {
    with(|s| {
        check_key(s, key)?;
        s.kv.remove(key);
        Ok(())
    })
}

fn check_text(what: &str, text: &str) -> Result<(), OutboxError> {
    if text.contains('\0') {
        return Err(OutboxError::InvalidEvent(format!(
            "{what} contains a NUL character"
        )));
    }
    if text.len() > 255 {
        return Err(OutboxError::InvalidEvent(format!(
            "{what} is longer than 255 bytes"
        )));
    }
    Ok(())
}

pub(crate) fn outbox_emit(event: Event) -> Result<EventId, OutboxError> {
    check_text("exchange", &event.exchange)?;
    check_text("routing key", &event.routing_key)?;
    for h in &event.headers {
        check_text("header name", &h.name)?;
        if h.value.contains('\0') {
            return Err(OutboxError::InvalidEvent(format!(
                "header `{}` contains a NUL character",
                h.name
            )));
        }
    }
    with(|s| {
        if s.message_events >= s.limits.max_events {
            return Err(OutboxError::TooManyEvents(s.limits.max_events));
        }
        if event.payload.len() > s.limits.max_payload_len {
            return Err(OutboxError::PayloadTooLarge(event.payload.len() as u64));
        }
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
        s.logs.push(LogRecord {
            level,
            message: message.to_owned(),
        })
    });
}

pub(crate) fn config_get(name: &str) -> Option<String> {
    with(|s| s.vars.get(name).cloned())
}

pub(crate) fn config_all() -> Vec<(String, String)> {
    with(|s| s.vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}
