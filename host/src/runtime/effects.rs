//! What one delivery's handler did: kv reads (with the versions it saw), buffered kv writes
//! and outbox events. Nothing reaches the database until the pipeline commits these, so
//! retry, dead-letter and failures leave no trace by construction.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::store::StoreError;

/// A stored kv value and its version (for optimistic, per-key serializable commits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvValue {
    pub value: Vec<u8>,
    pub version: i64,
}

/// Boxed future returned by [`KvSource::get`].
pub type KvFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<KvValue>, StoreError>> + Send + 'a>>;

/// Where the handler's kv reads come from: the database in the gateway, memory in
/// `carteiro plugin test`.
pub trait KvSource: Send + Sync {
    /// Current committed value of `key` in `namespace`; `Err` means the store is unavailable.
    fn get<'a>(&'a self, namespace: &'a str, key: &'a str) -> KvFuture<'a>;
}

/// An outbox event as emitted by the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmittedEvent {
    /// UUIDv7 made once at emit; it becomes the AMQP `message_id` when relayed.
    pub event_id: uuid::Uuid,
    pub exchange: String,
    pub routing_key: String,
    pub headers: Vec<(String, String)>,
    pub content_type: Option<String>,
    pub payload: Vec<u8>,
}

/// The effects of one handler run.
#[derive(Debug, Default, Clone)]
pub struct Effects {
    /// First version observed per key read from the store (`None`: absent).
    pub reads: BTreeMap<String, Option<i64>>,
    /// Last value written per key (`None`: deleted).
    pub writes: BTreeMap<String, Option<Vec<u8>>>,
    /// Events in emit order.
    pub events: Vec<EmittedEvent>,
}
