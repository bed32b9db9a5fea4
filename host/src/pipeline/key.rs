//! The idempotency key of a delivery, from the route's configured source.

use super::config::KeySource;

/// Why a delivery has no idempotency key; the text is the dead-letter reason.
#[derive(Debug, thiserror::Error)]
pub enum MissingKey {
    /// The key is read from a JSON body that does not parse.
    #[error("missing idempotency key: body is not JSON ({0})")]
    NotJson(#[source] serde_json::Error),
    /// The message has no (or an empty) AMQP `message_id`.
    #[error("missing idempotency key (no AMQP message_id)")]
    NoMessageId,
    /// The message lacks the header (or it is empty).
    #[error("missing idempotency key (no header `{0}`)")]
    NoHeader(String),
    /// The JSON body has nothing (or null, or "") at the pointer.
    #[error("missing idempotency key (nothing at JSON pointer `{0}`)")]
    NothingAtPointer(String),
}

/// Finds the key; `Err` says why there is none (for the dead-letter reason).
pub fn extract(
    source: &KeySource,
    message_id: Option<&str>,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<String, MissingKey> {
    let found = match source {
        KeySource::MessageId => message_id.map(str::to_owned),
        KeySource::Header(name) => headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone()),
        KeySource::JsonPointer(pointer) => {
            let json: serde_json::Value =
                serde_json::from_slice(body).map_err(MissingKey::NotJson)?;
            match json.pointer(pointer) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                Some(serde_json::Value::Null) | None => None,
                Some(other) => Some(other.to_string()),
            }
        }
    };
    match found {
        Some(key) if !key.is_empty() => Ok(storable(&key)),
        _ => Err(match source {
            KeySource::MessageId => MissingKey::NoMessageId,
            KeySource::Header(name) => MissingKey::NoHeader(name.clone()),
            KeySource::JsonPointer(pointer) => MissingKey::NothingAtPointer(pointer.clone()),
        }),
    }
}

/// Longest key stored as it is; longer ones are stored by digest.
pub const MAX_PLAIN_KEY_BYTES: usize = 512;
/// Prefix of a key stored by its digest.
pub const DIGEST_PREFIX: &str = "sha256:";

/// The key as the inbox stores it: as it came when the store can hold it as text and index
/// it; otherwise (NUL bytes, over [`MAX_PLAIN_KEY_BYTES`]) `sha256:<hex>` of its bytes. A key
/// that already starts with `sha256:` is digested too, so two different keys never meet.
pub fn storable(key: &str) -> String {
    if key.len() <= MAX_PLAIN_KEY_BYTES && !key.contains('\0') && !key.starts_with(DIGEST_PREFIX) {
        return key.to_owned();
    }
    use sha2::Digest;
    format!(
        "{DIGEST_PREFIX}{}",
        hex::encode(sha2::Sha256::digest(key.as_bytes()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_finds_its_key() {
        let headers = vec![("x-id".to_owned(), "h1".to_owned())];
        let body = br#"{"order":{"id":42}}"#;
        assert_eq!(
            extract(&KeySource::MessageId, Some("m1"), &headers, body).ok(),
            Some("m1".into())
        );
        assert_eq!(
            extract(&KeySource::Header("x-id".into()), None, &headers, body).ok(),
            Some("h1".into())
        );
        assert_eq!(
            extract(
                &KeySource::JsonPointer("/order/id".into()),
                None,
                &headers,
                body
            )
            .ok(),
            Some("42".into())
        );
    }

    #[test]
    fn missing_or_bad_keys_explain_why() {
        let err = extract(&KeySource::MessageId, None, &[], b"").unwrap_err();
        assert_eq!(
            err.to_string(),
            "missing idempotency key (no AMQP message_id)"
        );
        let err = extract(&KeySource::Header("x-id".into()), None, &[], b"").unwrap_err();
        assert_eq!(
            err.to_string(),
            "missing idempotency key (no header `x-id`)"
        );
        let err = extract(&KeySource::JsonPointer("/id".into()), None, &[], b"{}").unwrap_err();
        assert_eq!(
            err.to_string(),
            "missing idempotency key (nothing at JSON pointer `/id`)"
        );
        let err = extract(&KeySource::JsonPointer("/id".into()), None, &[], b"{oops")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("missing idempotency key: body is not JSON ("),
            "{err}"
        );
        let deep = "[".repeat(10_000);
        assert!(
            extract(
                &KeySource::JsonPointer("/id".into()),
                None,
                &[],
                deep.as_bytes()
            )
            .is_err()
        );
    }

    #[test]
    fn keys_the_store_cannot_hold_are_stored_by_digest() {
        let nul = extract(&KeySource::MessageId, Some("a\0b"), &[], b"").unwrap();
        assert!(
            nul.starts_with(DIGEST_PREFIX) && !nul.contains('\0'),
            "{nul}"
        );
        let other = extract(&KeySource::MessageId, Some("a\0c"), &[], b"").unwrap();
        assert_ne!(nul, other, "different keys stay different");
        let long = "k".repeat(MAX_PLAIN_KEY_BYTES + 1);
        let digested = storable(&long);
        assert_eq!(digested.len(), DIGEST_PREFIX.len() + 64);
        assert_eq!(
            storable(&"k".repeat(MAX_PLAIN_KEY_BYTES)).len(),
            MAX_PLAIN_KEY_BYTES
        );
        // A key that looks like a digest is digested again, so it cannot collide with one.
        assert_ne!(storable(&digested), digested);
        assert_eq!(
            storable("order-1; DROP TABLE inbox;--"),
            "order-1; DROP TABLE inbox;--"
        );
    }
}
