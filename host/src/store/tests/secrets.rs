//! The header-seal keyring: one current key for every gateway; a rotation's key verifies at
//! once and seals only from its activation time; the old key verifies for its window only.

use super::{TestDb, both_backends};
use crate::broker::seal::SealKey;
use crate::store::{SealSecrets, Store};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use std::collections::HashSet;
use std::time::Duration;

both_backends!(
    rotation_keeps_the_old_key_for_its_window_only,
    a_copy_sealed_after_a_rotation_verifies_on_a_gateway_that_has_not_reread,
    concurrent_rotations_lose_no_key
);

async fn rotation_keeps_the_old_key_for_its_window_only(db: &TestDb) {
    let s = &db.store;
    let first = s.header_seal_secrets().await.unwrap();
    assert_eq!(s.header_seal_secrets().await.unwrap(), first, "stable");
    assert!(first.retired.is_empty() && first.next.is_none());

    // Seals from a minute on: until then the first key seals, the new one only verifies.
    let rotated = s.header_seal_rotate(60_000, 60_000).await.unwrap();
    assert_eq!(
        rotated.current, first.current,
        "the new key does not seal yet"
    );
    let next = rotated.next.clone().unwrap();
    assert_ne!(next.secret, first.current);
    assert_eq!(
        rotated.verifying(),
        vec![next.secret],
        "the first key seals, and verifies"
    );
    let refused = s.header_seal_rotate(60_000, 0).await.unwrap_err();
    assert!(
        refused.to_string().contains("rotation is under way"),
        "{refused}"
    );
    db.store.header_seal_secrets().await.unwrap();
    sqlx::query("DELETE FROM carteiro_secrets WHERE name LIKE 'header-seal-next:%'")
        .execute(s.pool())
        .await
        .unwrap();

    // Active at once: seals now, and a rotation with no window retires a key that never
    // verifies again; the next rotation deletes what has expired.
    let now = s.header_seal_rotate(60_000, 0).await.unwrap();
    assert_ne!(now.current, first.current);
    assert_eq!(now.retired, vec![first.current.clone()]);
    assert_eq!(s.header_seal_secret().await.unwrap(), now.current);
    let again = s.header_seal_rotate(0, 0).await.unwrap();
    assert_eq!(again.retired, vec![first.current.clone()]);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let last = s.header_seal_rotate(60_000, 0).await.unwrap();
    assert_eq!(last.retired.len(), 2, "first (60 s) and third (60 s) keys");
    assert!(!last.retired.contains(&now.current), "expired at once");
}

fn keyring(s: &SealSecrets) -> SealKey {
    SealKey::with_retired(&s.current, &s.verifying())
}

fn dead_letter_copy(key: &SealKey) -> BasicProperties {
    let mut table = FieldTable::default();
    let reason = AMQPValue::LongString("boom".into());
    table.insert("x-carteiro-reason".into(), reason);
    let props = BasicProperties::default()
        .with_message_id("m-1".into())
        .with_headers(table);
    key.seal("orders", props, b"body")
}

/// Two gateways on one store: A reads the keyring right after `seal rotate`, B has not yet
/// (its next read is up to a refresh interval away). What A seals must verify on B, or B
/// archives A's dead letters without their reason, plugin and attempts. Then the same once
/// the new key seals, for a B whose refreshes failed: it reads the keys again when a seal
/// names a key it does not know.
async fn a_copy_sealed_after_a_rotation_verifies_on_a_gateway_that_has_not_reread(db: &TestDb) {
    let (a_store, b_store) = (&db.store, db.second_store().await);
    let a = keyring(&a_store.header_seal_secrets().await.unwrap());
    let b = keyring(&b_store.header_seal_secrets().await.unwrap());

    b_store.header_seal_rotate(60_000, 1_500).await.unwrap();
    let read = a_store.header_seal_keyring().await.unwrap();
    a.update(&read.current, &read.verifying());
    let sealed = dead_letter_copy(&a);
    assert!(
        b.verify("orders", &sealed, b"body"),
        "a copy sealed by the refreshed gateway A does not verify on gateway B, which has \
         not read the keyring since the rotation"
    );

    // Past the activation A seals with the new key; B, stale, learns it on the first copy.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let read = loop {
        let read = a_store.header_seal_keyring().await.unwrap();
        if read.next.is_none() {
            break read;
        }
        assert!(tokio::time::Instant::now() < deadline, "never activated");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    a.update(&read.current, &read.verifying());
    let sealed = dead_letter_copy(&a);
    assert!(
        !b.verify("orders", &sealed, b"body"),
        "B has not read the new key"
    );
    attach_reader(&b, b_store);
    b.learn_unknown_key(&sealed).await;
    assert!(
        b.verify("orders", &sealed, b"body"),
        "B read the keys again"
    );
    assert_eq!(
        b.current_id(),
        a.current_id(),
        "and seals with the new key too"
    );
}

fn attach_reader(key: &SealKey, store: Store) {
    key.reread_with(std::sync::Arc::new(move || {
        let store = store.clone();
        Box::pin(async move {
            let s = store.header_seal_keyring().await.ok()?;
            Some((s.current.clone(), s.verifying()))
        })
    }));
}

/// Two `seal rotate` at once (two operators, a script run twice): every key that sealed or
/// may seal must stay in the keyring, else copies sealed with it lose their headers. (On
/// PostgreSQL both used to retire the same key, and the second overwrote the first's.)
async fn concurrent_rotations_lose_no_key(db: &TestDb) {
    let (one, two) = (&db.store, db.second_store().await);
    one.header_seal_secrets().await.unwrap();
    let mut seen = HashSet::new();
    let mut refused = 0;
    for _ in 0..20 {
        let (x, y) = tokio::join!(
            one.header_seal_rotate(60_000, 0),
            two.header_seal_rotate(60_000, 0)
        );
        for rotated in [x, y] {
            match rotated {
                Ok(secrets) => {
                    seen.insert(secrets.current.clone());
                    seen.extend(secrets.verifying());
                }
                Err(e) => {
                    assert!(e.to_string().contains("under way"), "{e}");
                    refused += 1;
                }
            }
        }
    }
    let last = one.header_seal_keyring().await.unwrap();
    let mut known: HashSet<Vec<u8>> = last.verifying().into_iter().collect();
    known.insert(last.current.clone());
    let lost = seen.difference(&known).count();
    assert_eq!(
        lost,
        0,
        "{lost} of {} keys a rotation returned are gone",
        seen.len()
    );
    assert!(refused <= 20, "{refused}");
}
