//! Key-value state, namespaced per plugin, read and written inside the message's
//! transaction.
//!
//! Writes become visible to other messages only if this message acks; a retry or
//! dead-letter verdict discards them. Isolation is serializable per key: the host may re-run
//! the handler when a concurrent message wrote a key this one read, so a handler must be
//! deterministic given its message, kv reads and config.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::KvError;
use crate::host;

/// The value stored under `key`, or `None`.
pub fn get(key: &str) -> Result<Option<Vec<u8>>, KvError> {
    host::kv_get(key)
}

/// Stores `value` under `key` (committed if the message acks).
pub fn set(key: &str, value: impl AsRef<[u8]>) -> Result<(), KvError> {
    host::kv_set(key, value.as_ref())
}

/// Deletes `key`; deleting a missing key is not an error.
pub fn delete(key: &str) -> Result<(), KvError> {
    host::kv_delete(key)
}

/// True when `key` holds a value.
pub fn contains(key: &str) -> Result<bool, KvError> {
    Ok(get(key)?.is_some())
}

/// The value under `key` decoded as UTF-8 text.
pub fn get_string(key: &str) -> Result<Option<String>, KvError> {
    get(key)?
        .map(|bytes| {
            String::from_utf8(bytes)
                .map_err(|_| KvError::Codec(format!("value of `{key}` is not UTF-8")))
        })
        .transpose()
}

/// The value under `key` decoded from JSON.
pub fn get_json<T: DeserializeOwned>(key: &str) -> Result<Option<T>, KvError> {
    get(key)?
        .map(|bytes| {
            serde_json::from_slice(&bytes).map_err(|e| {
                KvError::Codec(format!("value of `{key}` is not the expected JSON: {e}"))
            })
        })
        .transpose()
}

/// Stores `value` under `key` as JSON.
pub fn set_json<T: Serialize + ?Sized>(key: &str, value: &T) -> Result<(), KvError> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| KvError::Codec(format!("cannot encode value of `{key}` as JSON: {e}")))?;
    set(key, bytes)
}

/// Adds `by` to the integer under `key` (missing counts as 0) and returns the new value.
///
/// The counter is stored as decimal text (`"42"`), so other tools can read it.
pub fn incr(key: &str, by: i64) -> Result<i64, KvError> {
    let current = match get(key)? {
        None => 0,
        Some(bytes) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| KvError::Codec(format!("value of `{key}` is not an integer")))?,
    };
    let next = current
        .checked_add(by)
        .ok_or_else(|| KvError::Codec(format!("counter `{key}` overflows i64")))?;
    set(key, next.to_string())?;
    Ok(next)
}
