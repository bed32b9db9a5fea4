//! The idempotency key of a delivery, from the route's configured source.

use crate::config::KeySource;

/// Finds the key; `Err` says why there is none (for the dead-letter reason).
pub fn extract(
    source: &KeySource,
    message_id: Option<&str>,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<String, String> {
    let found = match source {
        KeySource::MessageId => message_id.map(str::to_owned),
        KeySource::Header(name) => headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone()),
        KeySource::JsonPointer(pointer) => {
            let json: serde_json::Value = serde_json::from_slice(body)
                .map_err(|e| format!("missing idempotency key: body is not JSON ({e})"))?;
            match json.pointer(pointer) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                Some(serde_json::Value::Null) | None => None,
                Some(other) => Some(other.to_string()),
            }
        }
    };
    match found {
        Some(key) if !key.is_empty() && !key.contains('\0') && key.len() <= 1024 => Ok(key),
        Some(key) if key.contains('\0') => Err("invalid idempotency key: contains NUL".into()),
        Some(key) if key.len() > 1024 => Err(format!(
            "invalid idempotency key: {} bytes, at most 1024",
            key.len()
        )),
        _ => Err(format!("missing idempotency key ({})", describe(source))),
    }
}

fn describe(source: &KeySource) -> String {
    match source {
        KeySource::MessageId => "no AMQP message_id".into(),
        KeySource::Header(name) => format!("no header `{name}`"),
        KeySource::JsonPointer(p) => format!("nothing at JSON pointer `{p}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_finds_its_key() {
        let headers = vec![("x-id".to_owned(), "h1".to_owned())];
        let body = br#"{"order":{"id":42}}"#;
        assert_eq!(
            extract(&KeySource::MessageId, Some("m1"), &headers, body),
            Ok("m1".into())
        );
        assert_eq!(
            extract(&KeySource::Header("x-id".into()), None, &headers, body),
            Ok("h1".into())
        );
        assert_eq!(
            extract(
                &KeySource::JsonPointer("/order/id".into()),
                None,
                &headers,
                body
            ),
            Ok("42".into())
        );
    }

    #[test]
    fn missing_or_bad_keys_explain_why() {
        let err = extract(&KeySource::MessageId, None, &[], b"").unwrap_err();
        assert!(err.contains("no AMQP message_id"), "{err}");
        let err = extract(&KeySource::JsonPointer("/id".into()), None, &[], b"{oops").unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
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
        assert!(
            extract(&KeySource::MessageId, Some("a\0b"), &[], b"")
                .unwrap_err()
                .contains("NUL")
        );
    }
}
