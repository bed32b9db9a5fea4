//! Dead letters per hour (the console's charts): one grouped query, the same on both backends.

use super::{TestDb, both_backends, dl};
use crate::store::{DeadLetterFilter, DeadLetterHour, HOUR_MS};

both_backends!(hours_count_each_reason_within_the_window);

fn hour(route: &str, reason: &str, hour: i64, count: i64) -> DeadLetterHour {
    DeadLetterHour {
        route: route.into(),
        reason: reason.into(),
        hour,
        count,
    }
}

async fn hours_count_each_reason_within_the_window(db: &TestDb) {
    let s = &db.store;
    // A window of 24 hours from `since`, not aligned to any hour.
    let since = 1_767_261_600_000 + 17 * 60_000 + 123;
    let rows = [
        ("orders", "missing field `a`", since),
        ("orders", "missing field `a`", since + HOUR_MS - 1),
        ("orders", "missing field `a`", since + HOUR_MS),
        ("orders", "missing field `b`", since + 23 * HOUR_MS + 5),
        ("orders", "missing field `b`", since + 24 * HOUR_MS - 1),
        // Outside the window: just before it, at its end.
        ("orders", "missing field `a`", since - 1),
        ("orders", "missing field `a`", since + 24 * HOUR_MS),
        ("billing", "timeout", since + 2 * HOUR_MS),
    ];
    for (route, reason, at) in rows {
        s.dead_letter_insert(&dl(route, reason, at)).await.unwrap();
    }

    let orders = DeadLetterFilter {
        route: Some("orders".into()),
        // Ignored: the window bounds the query.
        since_ms: Some(0),
        until_ms: Some(1),
        limit: Some(1),
        ..Default::default()
    };
    let got = s.dead_letters_per_hour(&orders, since, 24).await.unwrap();
    assert_eq!(
        got,
        vec![
            hour("orders", "missing field `a`", 0, 2),
            hour("orders", "missing field `a`", 1, 1),
            hour("orders", "missing field `b`", 23, 2),
        ]
    );

    let all = s
        .dead_letters_per_hour(&DeadLetterFilter::default(), since, 24)
        .await
        .unwrap();
    assert_eq!(all.len(), 4, "{all:?}");
    assert_eq!(all[0], hour("billing", "timeout", 2, 1));

    // A shorter window, and a filter on the reasons of one group.
    let first_two = s
        .dead_letters_per_hour(&DeadLetterFilter::default(), since, 2)
        .await
        .unwrap();
    assert_eq!(
        first_two,
        vec![
            hour("orders", "missing field `a`", 0, 2),
            hour("orders", "missing field `a`", 1, 1),
        ]
    );
    let group_b = DeadLetterFilter {
        reasons: Some(vec!["missing field `b`".into()]),
        ..Default::default()
    };
    let got = s.dead_letters_per_hour(&group_b, since, 24).await.unwrap();
    assert_eq!(got, vec![hour("orders", "missing field `b`", 23, 2)]);

    // Nothing in a window with no dead letters; hostile text is only a bound value.
    let later = s
        .dead_letters_per_hour(&DeadLetterFilter::default(), since + 48 * HOUR_MS, 24)
        .await
        .unwrap();
    assert!(later.is_empty(), "{later:?}");
    let hostile = DeadLetterFilter {
        route: Some("'; DROP TABLE dead_letters;--".into()),
        ..Default::default()
    };
    assert!(
        s.dead_letters_per_hour(&hostile, since, 24)
            .await
            .unwrap()
            .is_empty()
    );
}
