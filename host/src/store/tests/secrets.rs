//! The header-seal keyring: one current key for every gateway, rotation keeping the old key
//! for its window only.

use super::{TestDb, both_backends};

both_backends!(rotation_keeps_the_old_key_for_its_window_only);

async fn rotation_keeps_the_old_key_for_its_window_only(db: &TestDb) {
    let s = &db.store;
    let first = s.header_seal_secrets().await.unwrap();
    assert_eq!(s.header_seal_secrets().await.unwrap(), first, "stable");
    assert!(first.retired.is_empty());

    let rotated = s.header_seal_rotate(60_000).await.unwrap();
    assert_ne!(rotated.current, first.current);
    assert_eq!(rotated.retired, vec![first.current.clone()]);
    assert_eq!(s.header_seal_secret().await.unwrap(), rotated.current);

    // A rotation with no window: the key it retires never verifies again, and the next
    // rotation deletes what has expired.
    let again = s.header_seal_rotate(0).await.unwrap();
    assert_eq!(again.retired, vec![first.current.clone()]);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let last = s.header_seal_rotate(60_000).await.unwrap();
    assert_eq!(last.retired.len(), 2, "first (60 s) and third (60 s) keys");
    assert!(!last.retired.contains(&rotated.current), "expired at once");
}
