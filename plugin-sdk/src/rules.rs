//! The limits and checks the Carteiro host applies to every kv key and outbox event. The
//! host uses this module itself, and so does the mock host behind [`crate::testing`], so a
//! handler's unit tests refuse exactly what production refuses, with the same words.

/// Longest kv key, in bytes.
pub const MAX_KV_KEY_BYTES: usize = 1024;
/// Largest kv value, in bytes.
pub const MAX_KV_VALUE_BYTES: usize = 4 << 20;
/// Largest outbox event payload, in bytes.
pub const MAX_EVENT_PAYLOAD_BYTES: usize = 8 << 20;
/// AMQP short strings (exchange, routing key, header names) hold at most 255 bytes.
pub const MAX_SHORT_STRING: usize = 255;
/// Most bytes of one event's headers (names and values): they travel in one AMQP
/// content-header frame, which RabbitMQ caps at its `frame_max` (128 KiB by default).
pub const MAX_EVENT_HEADER_BYTES: usize = 64 << 10;

/// Why `key` cannot be a kv key when keys may be `max_len` bytes long, or `None` if it can.
pub fn kv_key_problem(key: &str, max_len: usize) -> Option<String> {
    if key.is_empty() {
        return Some("kv keys must not be empty".into());
    }
    if key.len() > max_len {
        return Some(format!("kv key is {} bytes; at most {max_len}", key.len()));
    }
    if key.contains('\0') {
        return Some("kv keys must not contain NUL".into());
    }
    None
}

/// Why an event with this exchange, routing key, content type and headers (name, value)
/// cannot be published, or `None` if it can. The payload's size is checked on its own.
pub fn event_problem<'a>(
    exchange: &str,
    routing_key: &str,
    content_type: Option<&str>,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<String> {
    if let Some(ct) = content_type {
        if ct.len() > MAX_SHORT_STRING {
            return Some(format!(
                "content type is {} bytes; AMQP allows {MAX_SHORT_STRING}",
                ct.len()
            ));
        }
        if ct.contains('\0') {
            return Some("content type must not contain NUL".into());
        }
    }
    let mut header_bytes = 0;
    for (what, text) in [("exchange", exchange), ("routing key", routing_key)] {
        if text.len() > MAX_SHORT_STRING {
            return Some(format!(
                "{what} is {} bytes; AMQP allows {MAX_SHORT_STRING}",
                text.len()
            ));
        }
        if text.contains('\0') {
            return Some(format!("{what} must not contain NUL"));
        }
    }
    for (name, value) in headers {
        header_bytes += name.len() + value.len();
        if header_bytes > MAX_EVENT_HEADER_BYTES {
            return Some(format!(
                "headers take more than {MAX_EVENT_HEADER_BYTES} bytes; AMQP carries them in one \
                 frame"
            ));
        }
        if name.is_empty() || name.len() > MAX_SHORT_STRING {
            return Some(format!("header names must be 1-{MAX_SHORT_STRING} bytes"));
        }
        if name.contains('\0') || value.contains('\0') {
            return Some(format!(
                "header `{}` must not contain NUL",
                name.replace('\0', "\\0")
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_keys() {
        assert_eq!(kv_key_problem("a", 4), None);
        assert_eq!(kv_key_problem("abcd", 4), None);
        assert!(kv_key_problem("", 4).unwrap().contains("empty"));
        assert!(
            kv_key_problem("abcde", 4)
                .unwrap()
                .contains("5 bytes; at most 4")
        );
        assert!(kv_key_problem("a\0b", 4).unwrap().contains("NUL"));
    }

    #[test]
    fn events() {
        let long = "x".repeat(MAX_SHORT_STRING + 1);
        assert_eq!(event_problem("ex", "rk", None, [("h", "v")]), None);
        assert_eq!(event_problem("", "", None, []), None);
        assert!(
            event_problem(&long, "rk", None, [])
                .unwrap()
                .starts_with("exchange is 256 bytes")
        );
        assert!(
            event_problem("ex", "r\0k", None, [])
                .unwrap()
                .starts_with("routing key")
        );
        assert!(
            event_problem("ex", "rk", None, [("", "v")])
                .unwrap()
                .contains("1-255")
        );
        assert!(
            event_problem("ex", "rk", None, [("h", "v\0")])
                .unwrap()
                .contains("`h`")
        );
        assert!(
            event_problem("ex", "rk", Some(&long), [])
                .unwrap()
                .starts_with("content type is 256 bytes")
        );
        assert_eq!(
            event_problem("ex", "rk", Some("application/json"), []),
            None
        );
        let value = "v".repeat(1024);
        let many: Vec<(&str, &str)> = (0..100).map(|_| ("h", value.as_str())).collect();
        assert!(
            event_problem("ex", "rk", None, many)
                .unwrap()
                .contains("headers take more than")
        );
    }
}
