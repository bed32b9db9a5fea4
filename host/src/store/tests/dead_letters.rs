//! Dead-letter archive: insert, filters, stats, replay bookkeeping, purge.

use super::{TestDb, both_backends};
use crate::store::{DeadLetterFilter, NewDeadLetter, StoreError};

both_backends!(archive_query_replay_purge);

fn dl(route: &str, reason: &str, at: i64) -> NewDeadLetter {
    NewDeadLetter {
        route: route.into(),
        queue: format!("{route}.dlq"),
        reason: reason.into(),
        plugin: Some("handler".into()),
        attempts: 5,
        headers: vec![("x-carteiro-attempt".into(), "5".into())],
        body: vec![0, 159, 146, 150, 0],
        first_failed_at: Some(at - 10),
        dead_lettered_at: at,
    }
}

async fn archive_query_replay_purge(db: &TestDb) {
    let s = &db.store;
    let a1 = s
        .dead_letter_insert(&dl("orders", "retries exhausted: timeout", 1_000))
        .await
        .unwrap();
    let a2 = s
        .dead_letter_insert(&dl("orders", "trap: 100% bad_input", 2_000))
        .await
        .unwrap();
    let b1 = s
        .dead_letter_insert(&dl("billing", "retries exhausted: timeout", 3_000))
        .await
        .unwrap();
    let mut odd = dl("billing", "reason with NUL \0 is kept readable", 4_000);
    odd.plugin = None;
    odd.first_failed_at = None;
    let b2 = s.dead_letter_insert(&odd).await.unwrap();
    assert!(a1 < a2 && a2 < b1 && b1 < b2);

    let got = s.dead_letter_get(a2).await.unwrap().unwrap();
    assert_eq!(got.reason, "trap: 100% bad_input");
    assert_eq!(got.body, vec![0, 159, 146, 150, 0]);
    assert_eq!(
        got.headers,
        vec![("x-carteiro-attempt".to_string(), "5".to_string())]
    );
    assert_eq!(
        (got.attempts, got.first_failed_at, got.replay_count),
        (5, Some(1_990), 0)
    );
    let odd = s.dead_letter_get(b2).await.unwrap().unwrap();
    assert_eq!((odd.plugin, odd.first_failed_at), (None, None));
    assert!(!odd.reason.contains('\0'));
    assert!(s.dead_letter_get(9_999).await.unwrap().is_none());

    let ids = |v: Vec<crate::store::DeadLetter>| v.into_iter().map(|d| d.id).collect::<Vec<_>>();
    let all = s
        .dead_letters_list(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(ids(all), vec![b2, b1, a2, a1], "newest first");
    let f = DeadLetterFilter {
        route: Some("orders".into()),
        ..Default::default()
    };
    assert_eq!(ids(s.dead_letters_list(&f).await.unwrap()), vec![a2, a1]);
    // Substring match is literal: % and _ are not wildcards.
    let f = DeadLetterFilter {
        reason_contains: Some("100% bad_".into()),
        ..Default::default()
    };
    assert_eq!(ids(s.dead_letters_list(&f).await.unwrap()), vec![a2]);
    let f = DeadLetterFilter {
        reason_contains: Some("%".into()),
        ..Default::default()
    };
    assert_eq!(ids(s.dead_letters_list(&f).await.unwrap()), vec![a2]);
    let f = DeadLetterFilter {
        since_ms: Some(2_000),
        until_ms: Some(4_000),
        ..Default::default()
    };
    assert_eq!(ids(s.dead_letters_list(&f).await.unwrap()), vec![b1, a2]);
    let f = DeadLetterFilter {
        limit: Some(1),
        before_id: Some(b1),
        ..Default::default()
    };
    assert_eq!(ids(s.dead_letters_list(&f).await.unwrap()), vec![a2]);
    let f = DeadLetterFilter {
        route: Some("'; DROP TABLE dead_letters;--".into()),
        ..Default::default()
    };
    assert!(s.dead_letters_list(&f).await.unwrap().is_empty());

    s.dead_letter_mark_replayed(a1).await.unwrap();
    s.dead_letter_mark_replayed(a1).await.unwrap();
    let replayed = s.dead_letter_get(a1).await.unwrap().unwrap();
    assert_eq!(replayed.replay_count, 2);
    assert!(replayed.replayed_at.is_some());
    let err = s.dead_letter_mark_replayed(9_999).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    let f = DeadLetterFilter {
        replayed: Some(false),
        ..Default::default()
    };
    assert_eq!(
        ids(s.dead_letters_list(&f).await.unwrap()),
        vec![b2, b1, a2]
    );

    let stats = s.dead_letter_stats().await.unwrap();
    let timeout_orders = stats
        .iter()
        .find(|st| st.route == "orders" && st.reason == "retries exhausted: timeout")
        .unwrap();
    assert_eq!((timeout_orders.count, timeout_orders.unreplayed), (1, 0));
    assert_eq!(stats.len(), 4);

    let f = DeadLetterFilter {
        route: Some("billing".into()),
        limit: Some(1),
        ..Default::default()
    };
    assert_eq!(
        s.dead_letters_purge(&f).await.unwrap(),
        2,
        "purge ignores limit"
    );
    assert_eq!(
        ids(s
            .dead_letters_list(&DeadLetterFilter::default())
            .await
            .unwrap()),
        vec![a2, a1]
    );
}
