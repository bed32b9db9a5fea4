//! The real host imports, converted to and from the SDK's types.

use crate::bindings::carteiro::handler::{config, kv, log as wit_log, outbox, types};
use crate::log::Level;
use crate::outbox::{Event, EventId};
use crate::{Header, KvError, OutboxError};

fn kv_error(e: kv::KvError) -> KvError {
    match e {
        kv::KvError::InvalidKey(why) => KvError::InvalidKey(why),
        kv::KvError::ValueTooLarge(size) => KvError::ValueTooLarge(size),
        kv::KvError::Unavailable(why) => KvError::Unavailable(why),
    }
}

pub(crate) fn kv_get(key: &str) -> Result<Option<Vec<u8>>, KvError> {
    kv::get(key).map_err(kv_error)
}

pub(crate) fn kv_set(key: &str, value: &[u8]) -> Result<(), KvError> {
    kv::set(key, value).map_err(kv_error)
}

pub(crate) fn kv_delete(key: &str) -> Result<(), KvError> {
    kv::delete(key).map_err(kv_error)
}

pub(crate) fn outbox_emit(event: Event) -> Result<EventId, OutboxError> {
    let event = outbox::Event {
        exchange: event.exchange,
        routing_key: event.routing_key,
        headers: event.headers.into_iter().map(wit_header).collect(),
        content_type: event.content_type,
        payload: event.payload,
    };
    outbox::emit(&event).map(EventId).map_err(|e| match e {
        outbox::OutboxError::InvalidEvent(why) => OutboxError::InvalidEvent(why),
        outbox::OutboxError::TooManyEvents(max) => OutboxError::TooManyEvents(max),
        outbox::OutboxError::PayloadTooLarge(size) => OutboxError::PayloadTooLarge(size),
    })
}

fn wit_header(h: Header) -> types::Header {
    types::Header {
        name: h.name,
        value: h.value,
    }
}

pub(crate) fn log(level: Level, message: &str) {
    let level = match level {
        Level::Trace => wit_log::Level::Trace,
        Level::Debug => wit_log::Level::Debug,
        Level::Info => wit_log::Level::Info,
        Level::Warn => wit_log::Level::Warn,
        Level::Error => wit_log::Level::Error,
    };
    wit_log::log(level, message);
}

pub(crate) fn config_get(name: &str) -> Option<String> {
    config::get(name)
}

pub(crate) fn config_all() -> Vec<(String, String)> {
    config::all()
}

/// Host calls from now on belong to message `index` of the batch (`batch-handler` only).
pub(crate) fn batch_item(index: u32) {
    crate::bindings::batch_world::carteiro::handler::batch::item(index);
}
