//! Which `x-carteiro-*` headers Carteiro believes.
//!
//! Publishers are not trusted (DESIGN.md, trust boundaries): anyone may send
//! `x-carteiro-attempt: 99`. Every copy Carteiro publishes with its own headers (retry
//! copies, dead-letter copies, replays) is therefore *sealed*: `x-carteiro-seal` holds an
//! HMAC-SHA256, under a key kept in the store (shared by every gateway on that store), over
//! the route, the message id, the body and all `x-carteiro-*` headers. A delivery's
//! Carteiro headers are believed only when its seal checks out for the route that consumes
//! it — that is, when it is a copy this route (or its dead-letter archiver) made. On
//! anything else they are renamed `x-untrusted-carteiro-*`: kept for the record, visible to
//! the plugin under that name, never believed.

use hmac::{Hmac, Mac};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use sha2::{Digest, Sha256};

use super::headers::value_to_text;

/// Prefix of Carteiro's own headers.
pub const PREFIX: &str = "x-carteiro-";
/// The header that carries the seal.
pub const SEAL: &str = "x-carteiro-seal";
/// What untrusted Carteiro headers are renamed to (prefix).
pub const UNTRUSTED_PREFIX: &str = "x-untrusted-carteiro-";

/// The store-held key that seals Carteiro's headers.
#[derive(Clone)]
pub struct SealKey(Hmac<Sha256>);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(***)")
    }
}

impl SealKey {
    /// A key from its secret bytes (at least 32 recommended).
    pub fn new(secret: &[u8]) -> Self {
        Self(Hmac::new_from_slice(secret).expect("HMAC takes keys of any length"))
    }

    fn mac(&self, route: &str, properties: &BasicProperties, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        let mut field = |bytes: &[u8]| {
            mac.update(&(bytes.len() as u64).to_be_bytes());
            mac.update(bytes);
        };
        field(route.as_bytes());
        let id = properties.message_id().as_ref().map(|s| s.as_str());
        field(id.unwrap_or("").as_bytes());
        field(&Sha256::digest(body));
        if let Some(table) = properties.headers() {
            // A field table iterates in name order, so the encoding is canonical.
            for (name, value) in table {
                let name = name.as_str();
                if name.starts_with(PREFIX) && name != SEAL {
                    field(name.as_bytes());
                    field(value_to_text(value).as_bytes());
                }
            }
        }
        mac
    }

    /// Adds (or replaces) the seal over `properties`' Carteiro headers for `route`.
    pub fn seal(&self, route: &str, properties: BasicProperties, body: &[u8]) -> BasicProperties {
        let tag = hex::encode(self.mac(route, &properties, body).finalize().into_bytes());
        let mut table = properties.headers().clone().unwrap_or_default();
        table.insert(
            ShortString::from(SEAL),
            AMQPValue::LongString(LongString::from(tag)),
        );
        properties.with_headers(table)
    }

    /// True when `properties` carry a valid seal for `route`.
    pub fn verify(&self, route: &str, properties: &BasicProperties, body: &[u8]) -> bool {
        let Some(tag) = properties
            .headers()
            .as_ref()
            .and_then(|t| t.inner().get(SEAL))
            .map(value_to_text)
            .and_then(|t| hex::decode(t).ok())
        else {
            return false;
        };
        self.mac(route, properties, body).verify_slice(&tag).is_ok()
    }
}

/// Whether a header name is one of Carteiro's own.
pub fn is_ours(name: &str) -> bool {
    name.starts_with(PREFIX)
}

/// The table with Carteiro's headers kept (`trusted`) or renamed `x-untrusted-carteiro-*`,
/// and the seal removed either way.
pub fn sanitize(table: &FieldTable, trusted: bool) -> FieldTable {
    let mut out = FieldTable::default();
    for (name, value) in table {
        let text = name.as_str();
        if text == SEAL {
            continue;
        }
        if trusted || !is_ours(text) {
            out.insert(name.clone(), value.clone());
            continue;
        }
        let renamed = format!("{UNTRUSTED_PREFIX}{}", &text[PREFIX.len()..]);
        let renamed = super::outgoing::cap(&renamed, super::outgoing::MAX_SHORT_STRING);
        if let Ok(key) = ShortString::try_new(renamed) {
            out.insert(key, value.clone());
        }
    }
    out
}

/// True when any header is one of Carteiro's own (cheap check before verifying a seal).
pub fn has_ours(properties: &BasicProperties) -> bool {
    properties
        .headers()
        .as_ref()
        .is_some_and(|t| t.into_iter().any(|(name, _)| is_ours(name.as_str())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::broker::outgoing::{set_int, set_text};

    fn props(attempt: i64) -> BasicProperties {
        let mut t = FieldTable::default();
        set_int(&mut t, "x-carteiro-attempt", attempt);
        set_text(&mut t, "x-carteiro-last-reason", "boom");
        t.insert("x-tenant".into(), AMQPValue::LongString("acme".into()));
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(t)
    }

    #[test]
    fn a_sealed_copy_verifies_only_unchanged_and_for_its_route() {
        let key = SealKey::new(b"0123456789abcdef0123456789abcdef");
        let sealed = key.seal("orders", props(2), b"body");
        assert!(key.verify("orders", &sealed, b"body"));
        assert!(!key.verify("payments", &sealed, b"body"), "other route");
        assert!(!key.verify("orders", &sealed, b"other body"), "other body");
        let other_key = SealKey::new(b"another key entirely, 32 bytes!!");
        assert!(!other_key.verify("orders", &sealed, b"body"), "other key");

        // Change one Carteiro header: the seal no longer holds.
        let mut table = sealed.headers().clone().unwrap();
        set_int(&mut table, "x-carteiro-attempt", 99);
        let forged = sealed.clone().with_headers(table);
        assert!(!key.verify("orders", &forged, b"body"));
        // Headers of the publisher's own may change (the broker adds x-death): still valid.
        let mut table = sealed.headers().clone().unwrap();
        table.insert("x-death".into(), AMQPValue::LongString("[]".into()));
        assert!(key.verify("orders", &sealed.clone().with_headers(table), b"body"));
        // No seal at all.
        assert!(!key.verify("orders", &props(2), b"body"));
    }

    #[test]
    fn untrusted_headers_are_renamed_and_kept() {
        let mut t = props(99).headers().clone().unwrap();
        set_text(&mut t, SEAL, "forged");
        let long = format!("x-carteiro-{}", "n".repeat(244));
        t.insert(long.as_str().into(), AMQPValue::LongString("v".into()));
        let clean = sanitize(&t, false);
        let names: Vec<&str> = clean.into_iter().map(|(k, _)| k.as_str()).collect();
        assert!(names.contains(&"x-untrusted-carteiro-attempt"), "{names:?}");
        assert!(names.contains(&"x-tenant"));
        assert!(
            !names.iter().any(|n| n.starts_with("x-carteiro-")),
            "{names:?}"
        );
        assert!(names.iter().all(|n| n.len() <= 255));
        assert_eq!(
            names.len(),
            4,
            "seal dropped, long name kept shortened: {names:?}"
        );
        let kept = sanitize(&t, true);
        assert!(kept.inner().contains_key("x-carteiro-attempt"));
        assert!(!kept.inner().contains_key(SEAL));
    }
}
