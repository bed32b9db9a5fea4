//! Which `x-carteiro-*` headers Carteiro believes.
//!
//! Publishers are not trusted (docs/architecture.md, "Trust boundaries"): anyone may send
//! `x-carteiro-attempt: 99`. Every copy Carteiro publishes with its own headers (retry
//! copies, dead-letter copies, replays) is therefore *sealed*: `x-carteiro-seal` holds an
//! HMAC-SHA256, under a key kept in the store (shared by every gateway on that store), over
//! the route, the message id, the body and all `x-carteiro-*` headers. A delivery's
//! Carteiro headers are believed only when its seal checks out for the route that consumes
//! it — that is, when it is a copy this route (or its dead-letter archiver) made. On
//! anything else they are renamed `x-untrusted-carteiro-*`: kept for the record, visible to
//! the plugin under that name, never believed.

use futures::future::BoxFuture;
use hmac::{Hmac, Mac};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use sha2::{Digest, Sha256};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::field_table::value_to_text;

/// Prefix of Carteiro's own headers.
pub const PREFIX: &str = "x-carteiro-";
/// The header that carries the seal.
pub const SEAL: &str = "x-carteiro-seal";
/// What untrusted Carteiro headers are renamed to (prefix).
pub const UNTRUSTED_PREFIX: &str = "x-untrusted-carteiro-";

/// A received message's headers as Carteiro believes them ([`SealKey::check`]).
#[derive(Debug, Clone)]
pub struct Checked {
    /// Carteiro's own headers kept if the seal holds for the route, renamed
    /// `x-untrusted-carteiro-*` if not; the seal itself removed.
    pub table: FieldTable,
    /// The seal holds for the route: the Carteiro headers are believed.
    pub trusted: bool,
    /// Carteiro headers came without a seal that holds for the route.
    pub unsealed: bool,
}

/// The store-held keys that seal Carteiro's headers: the current one seals; keys retired by
/// a rotation, and the key a rotation brings in before it seals, only verify. Clones share
/// one keyring, which [`SealKey::update`] replaces while everything runs (a rotation needs
/// no restart).
#[derive(Clone)]
pub struct SealKey(Arc<Shared>);

struct Shared {
    ring: RwLock<Keyring>,
    /// Reads the keyring again ([`SealKey::reread_with`]); none in the CLI and tests.
    reader: OnceLock<Reader>,
    /// When the last re-read for an unknown key finished; held while one runs.
    last_reread: tokio::sync::Mutex<Option<Instant>>,
}

/// Reads the keys from where they are kept: the current key and the verify-only ones, or
/// `None` when that failed (the keys in use stay).
pub type Reader =
    Arc<dyn Fn() -> BoxFuture<'static, Option<(Vec<u8>, Vec<Vec<u8>>)>> + Send + Sync>;

/// At most one re-read for a seal naming an unknown key per this interval: a flood of
/// forged seals with made-up key ids costs the store one read a second, no more.
pub const REREAD_EVERY: Duration = Duration::from_secs(1);

struct Keyring {
    current: Key,
    accepted: Vec<Key>,
}

#[derive(Clone)]
struct Key {
    /// The first 8 hex digits of the secret's SHA-256: names the key in a seal, reveals
    /// nothing of it.
    id: String,
    mac: Hmac<Sha256>,
}

impl Key {
    fn new(secret: &[u8]) -> Self {
        let id = hex::encode(&Sha256::digest(secret)[..4]);
        Self {
            id,
            mac: Hmac::new_from_slice(secret).expect("HMAC takes keys of any length"),
        }
    }
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SealKey({}, ***)", self.current_id())
    }
}

impl SealKey {
    /// One key from its secret bytes (at least 32 recommended).
    pub fn new(secret: &[u8]) -> Self {
        Self::with_retired(secret, &[])
    }

    /// The current key, and retired ones that still verify.
    pub fn with_retired(current: &[u8], retired: &[Vec<u8>]) -> Self {
        Self(Arc::new(Shared {
            ring: RwLock::new(Keyring::of(current, retired)),
            reader: OnceLock::new(),
            last_reread: tokio::sync::Mutex::new(None),
        }))
    }

    /// Replaces the keys of this keyring and of every clone of it: `current` seals, the
    /// `retired` (verify-only) keys and `current` verify.
    pub fn update(&self, current: &[u8], retired: &[Vec<u8>]) {
        let ring = Keyring::of(current, retired);
        *self.0.ring.write().unwrap_or_else(PoisonError::into_inner) = ring;
    }

    /// Lets [`Self::learn_unknown_key`] read the keys again with `reader` (set once; a
    /// second call changes nothing).
    pub fn reread_with(&self, reader: Reader) {
        let _ = self.0.reader.set(reader);
    }

    /// Before [`Self::check`]: when `properties` carry a seal naming a key this keyring
    /// does not hold (a rotation this gateway has not read yet, another gateway has), reads
    /// the keys again so the copy keeps its headers. At most one re-read per
    /// [`REREAD_EVERY`], one at a time; a caller that waited for a running one uses its
    /// result.
    pub async fn learn_unknown_key(&self, properties: &BasicProperties) {
        if !self.names_unknown_key(properties) {
            return;
        }
        let Some(reader) = self.0.reader.get() else {
            return;
        };
        let mut last = self.0.last_reread.lock().await;
        if last.is_some_and(|at| at.elapsed() < REREAD_EVERY) {
            return;
        }
        if let Some((current, retired)) = reader().await {
            let before = self.current_id();
            self.update(&current, &retired);
            let (key, changed) = (self.current_id(), before != self.current_id());
            if self.names_unknown_key(properties) {
                // Forged, or a key of another store: worth a trace, not a log line a second.
                tracing::debug!(key = %key, "read the header-seal keys again: the seal's key is still unknown");
            } else {
                tracing::info!(key = %key, sealing_key_changed = changed, "read the header-seal keys again for a seal naming a key this gateway did not know yet");
            }
        }
        *last = Some(Instant::now());
    }

    /// The seal in `properties` names a key id that is not in this keyring.
    fn names_unknown_key(&self, properties: &BasicProperties) -> bool {
        let Some(seal) = seal_of(properties) else {
            return false;
        };
        let Some((id, _)) = seal.split_once(':') else {
            return false;
        };
        let ring = self.ring();
        !std::iter::once(&ring.current)
            .chain(&ring.accepted)
            .any(|key| key.id == id)
    }

    /// The id of the key that seals now.
    pub fn current_id(&self) -> String {
        self.ring().current.id.clone()
    }

    fn ring(&self) -> std::sync::RwLockReadGuard<'_, Keyring> {
        self.0.ring.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn mac(key: &Key, route: &str, properties: &BasicProperties, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = key.mac.clone();
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

    /// Adds (or replaces) the seal over `properties`' Carteiro headers for `route`, with
    /// the current key: `KEYID:HMAC`.
    pub fn seal(&self, route: &str, properties: BasicProperties, body: &[u8]) -> BasicProperties {
        let ring = self.ring();
        let key = &ring.current;
        let tag = hex::encode(
            Self::mac(key, route, &properties, body)
                .finalize()
                .into_bytes(),
        );
        let mut table = properties.headers().clone().unwrap_or_default();
        table.insert(
            ShortString::from(SEAL),
            AMQPValue::LongString(LongString::from(format!("{}:{tag}", key.id))),
        );
        properties.with_headers(table)
    }

    /// The headers of a message received on `route`, checked: [`has_ours`], then the seal
    /// ([`Self::verify`]), then [`sanitize`].
    pub fn check(&self, route: &str, properties: &BasicProperties, body: &[u8]) -> Checked {
        let ours = has_ours(properties);
        let trusted = ours && self.verify(route, properties, body);
        let table = properties
            .headers()
            .as_ref()
            .map(|t| sanitize(t, trusted))
            .unwrap_or_default();
        Checked {
            table,
            trusted,
            unsealed: ours && !trusted,
        }
    }

    /// True when `properties` carry a valid seal for `route`, by the key the seal names
    /// (current or retired); a seal without a key id (older gateways) is tried with each.
    pub fn verify(&self, route: &str, properties: &BasicProperties, body: &[u8]) -> bool {
        let Some(seal) = seal_of(properties) else {
            return false;
        };
        let (id, tag) = match seal.split_once(':') {
            Some((id, tag)) => (Some(id), tag),
            None => (None, seal.as_str()),
        };
        let Ok(tag) = hex::decode(tag) else {
            return false;
        };
        let ring = self.ring();
        std::iter::once(&ring.current)
            .chain(&ring.accepted)
            .filter(|key| id.is_none_or(|id| id == key.id))
            .any(|key| {
                Self::mac(key, route, properties, body)
                    .verify_slice(&tag)
                    .is_ok()
            })
    }
}

impl Keyring {
    fn of(current: &[u8], retired: &[Vec<u8>]) -> Self {
        Self {
            current: Key::new(current),
            accepted: retired.iter().map(|s| Key::new(s)).collect(),
        }
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

/// The seal header's text, if the copy carries one.
fn seal_of(properties: &BasicProperties) -> Option<String> {
    properties
        .headers()
        .as_ref()
        .and_then(|t| t.inner().get(SEAL))
        .map(value_to_text)
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
    fn a_check_believes_a_sealed_copy_and_renames_an_unsealed_one() {
        let key = SealKey::new(b"0123456789abcdef0123456789abcdef");
        let sealed = key.check("orders", &key.seal("orders", props(2), b"body"), b"body");
        assert!(sealed.trusted && !sealed.unsealed);
        assert!(sealed.table.inner().contains_key("x-carteiro-attempt"));
        assert!(!sealed.table.inner().contains_key(SEAL));
        let forged = key.check("orders", &props(2), b"body");
        assert!(!forged.trusted && forged.unsealed);
        assert!(
            forged
                .table
                .inner()
                .contains_key("x-untrusted-carteiro-attempt")
        );
        let plain = key.check("orders", &BasicProperties::default(), b"body");
        assert!(!plain.trusted && !plain.unsealed && plain.table.inner().is_empty());
    }

    #[test]
    fn a_rotation_keeps_retired_keys_verifying_and_seals_with_the_new_one() {
        let (old, new) = (
            b"old key, thirty-two bytes long!!",
            b"new key, thirty-two bytes long!!",
        );
        let gateway = SealKey::new(old);
        let sealed_old = gateway.seal("orders", props(2), b"body");
        let other_gateway = gateway.clone();
        gateway.update(new, &[old.to_vec()]);
        assert_ne!(gateway.current_id(), SealKey::new(old).current_id());
        // Every clone follows the update; the old copy still verifies; new copies use the
        // new key, which a keyring that only knows the old one cannot verify.
        assert!(other_gateway.verify("orders", &sealed_old, b"body"));
        let sealed_new = other_gateway.seal("orders", props(3), b"body");
        assert!(SealKey::new(new).verify("orders", &sealed_new, b"body"));
        assert!(!SealKey::new(old).verify("orders", &sealed_new, b"body"));
        // Past the window the retired key is dropped.
        gateway.update(new, &[]);
        assert!(!gateway.verify("orders", &sealed_old, b"body"));
        // A seal of an older gateway (no key id) is tried with every key.
        let legacy = {
            let mut t = sealed_new.headers().clone().unwrap();
            let value = value_to_text(t.inner().get(SEAL).unwrap());
            let (_, tag) = value.split_once(':').unwrap();
            t.insert(SEAL.into(), AMQPValue::LongString(tag.to_owned().into()));
            sealed_new.clone().with_headers(t)
        };
        assert!(gateway.verify("orders", &legacy, b"body"));
    }

    #[tokio::test]
    async fn an_unknown_key_id_rereads_the_keys_at_most_once_a_second() {
        let (old, new) = (
            b"old key, thirty-two bytes long!!",
            b"new key, thirty-two bytes long!!",
        );
        let stale = SealKey::new(old);
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = reads.clone();
        stale.reread_with(Arc::new(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move { Some((old.to_vec(), vec![new.to_vec()])) })
        }));
        let sealed_new = SealKey::new(new).seal("orders", props(2), b"body");
        assert!(!stale.verify("orders", &sealed_new, b"body"));
        stale.learn_unknown_key(&sealed_new).await;
        assert!(
            stale.verify("orders", &sealed_new, b"body"),
            "learnt the new key"
        );
        assert_eq!(
            stale.current_id(),
            SealKey::new(old).current_id(),
            "still seals with old"
        );
        // Known ids and forged ids within the interval: no more reads.
        stale.learn_unknown_key(&sealed_new).await;
        let forged =
            SealKey::new(b"a forger's key, 32 bytes long!!!").seal("orders", props(9), b"x");
        stale.learn_unknown_key(&forged).await;
        stale.learn_unknown_key(&forged).await;
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1);
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
