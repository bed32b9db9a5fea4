//! Dead-letter archive: insert, filters, stats, replay bookkeeping, purge.

use super::{TestDb, both_backends, dl};
use crate::store::{DeadLetter, DeadLetterFilter, NewDeadLetter, Store, StoreError};

both_backends!(
    archive_query_replay_purge,
    any_text_is_archived_losslessly,
    oldest_first_pages_counts_and_groups,
    reason_and_id_lists_select_exactly,
    edits_and_replays_keep_their_history,
    a_dedupe_key_archives_once
);

/// A foreign dead letter redelivered after a crash between its commit and its ack (same key)
/// is one row, concurrent archivers included; another key, or none, is another row.
async fn a_dedupe_key_archives_once(db: &TestDb) {
    let s = &db.store;
    let letter = dl(
        "matriculas.dlq",
        "rejected in queue `matriculas.processar`",
        1_000,
    );
    let (first, new) = s
        .dead_letter_insert_once(&letter, Some("k1"))
        .await
        .unwrap();
    assert!(new);
    let (again, new) = s
        .dead_letter_insert_once(&letter, Some("k1"))
        .await
        .unwrap();
    assert_eq!((again, new), (first, false));
    let racing =
        futures::future::join_all((0..4).map(|_| s.dead_letter_insert_once(&letter, Some("k2"))))
            .await;
    let racing: Vec<(i64, bool)> = racing.into_iter().map(Result::unwrap).collect();
    assert_eq!(racing.iter().filter(|(_, new)| *new).count(), 1);
    assert!(racing.iter().all(|(id, _)| *id == racing[0].0));
    s.dead_letter_insert(&letter).await.unwrap();
    s.dead_letter_insert(&letter).await.unwrap();
    let all = DeadLetterFilter::default();
    assert_eq!(s.dead_letters_count(&all).await.unwrap(), 4);
}

/// The ids of `rows`, in order.
fn ids(rows: Vec<DeadLetter>) -> Vec<i64> {
    rows.into_iter().map(|d| d.id).collect()
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
    assert_eq!(got.letter.reason, "trap: 100% bad_input");
    assert_eq!(got.letter.body, vec![0, 159, 146, 150, 0]);
    assert_eq!(
        got.letter.headers,
        vec![("x-carteiro-attempt".to_string(), "5".to_string())]
    );
    assert_eq!(
        (
            got.letter.attempts,
            got.letter.first_failed_at,
            got.replay_count
        ),
        (5, Some(1_990), 0)
    );
    let odd = s.dead_letter_get(b2).await.unwrap().unwrap();
    assert_eq!(
        (odd.letter.plugin, odd.letter.first_failed_at),
        (None, None)
    );
    assert_eq!(
        odd.letter.reason, "reason with NUL \0 is kept readable",
        "kept exactly"
    );
    assert!(odd.stored_encoded);
    assert!(s.dead_letter_get(9_999).await.unwrap().is_none());

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

/// NUL bytes in every text field, a 1 MiB reason, a route too long for its index, and text
/// that merely looks like the encoding: all archived, all read back exactly.
async fn any_text_is_archived_losslessly(db: &TestDb) {
    let s = &db.store;
    let mut reason = String::from("boom\0");
    while reason.len() < 1 << 20 {
        reason.push_str("é \0 déjà vu; ");
    }
    let hostile = NewDeadLetter {
        route: "orders\0evil".into(),
        queue: "orders\0.dlq".into(),
        reason: reason.clone(),
        plugin: Some("plug\0in".into()),
        attempts: i64::MAX,
        headers: vec![
            ("x-carteiro-reason\0".into(), "a\0b".into()),
            ("\0".into(), "\0\0".into()),
            ("x-json".into(), "\"quoted\" \\u0000 ]".into()),
        ],
        body: vec![0, 0, 255],
        first_failed_at: Some(-1),
        dead_lettered_at: 7,
    };
    let long_route = NewDeadLetter {
        route: "r".repeat(5_000),
        queue: "q".repeat(300_000),
        ..dl("unused", "long names", 8)
    };
    let lookalike = dl("orders", "literally \\u{0} and …[cut: 3 more bytes]", 9);
    for d in [&hostile, &long_route, &lookalike] {
        let id = s.dead_letter_insert(d).await.unwrap();
        let got = s.dead_letter_get(id).await.unwrap().unwrap();
        assert_eq!(&got.letter, d, "dead letter {id} read back exactly");
    }
    let lookalike_row = s
        .dead_letters_list(&DeadLetterFilter {
            route: Some("orders".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(lookalike_row.len(), 1);
    assert!(
        !lookalike_row[0].stored_encoded,
        "plain text is stored as is"
    );

    // Filters go through the same stand-in: a NUL in a filter finds the NUL route.
    let f = DeadLetterFilter {
        route: Some("orders\0evil".into()),
        reason_contains: Some("boom\0".into()),
        ..Default::default()
    };
    let found = s.dead_letters_list(&f).await.unwrap();
    assert_eq!(found.len(), 1);
    assert!(found[0].stored_encoded);
    assert_eq!(found[0].letter.reason, reason);
    let f = DeadLetterFilter {
        route: Some("r".repeat(5_000)),
        ..Default::default()
    };
    assert_eq!(s.dead_letters_count(&f).await.unwrap(), 1);
    // Groups show the visible stand-in.
    let groups = s.dead_letter_stats().await.unwrap();
    assert!(
        groups
            .iter()
            .any(|g| g.route == "orders\\u{0}evil" && g.reason.starts_with("boom\\u{0}")),
        "{:?}",
        groups.iter().map(|g| &g.route).collect::<Vec<_>>()
    );
}

async fn oldest_first_pages_counts_and_groups(db: &TestDb) {
    let s = &db.store;
    let mut inserted = Vec::new();
    for i in 0..7 {
        let reason = if i % 3 == 0 { "timeout" } else { "bad json" };
        inserted.push(
            s.dead_letter_insert(&dl("orders", reason, 1_000 + i))
                .await
                .unwrap(),
        );
    }
    let f = DeadLetterFilter {
        reason_contains: Some("bad".into()),
        replayed: Some(false),
        ..Default::default()
    };
    assert_eq!(s.dead_letters_count(&f).await.unwrap(), 4);
    let first = ids(s.dead_letters_oldest_first(&f, 3).await.unwrap());
    assert_eq!(
        first,
        vec![inserted[1], inserted[2], inserted[4]],
        "oldest first"
    );
    let next = DeadLetterFilter {
        after_id: first.last().copied(),
        ..f.clone()
    };
    let rest = ids(s.dead_letters_oldest_first(&next, 3).await.unwrap());
    assert_eq!(rest, vec![inserted[5]]);
    s.dead_letter_mark_replayed(inserted[1]).await.unwrap();
    assert_eq!(s.dead_letters_count(&f).await.unwrap(), 3);
    let groups = s
        .dead_letter_groups(&DeadLetterFilter::default())
        .await
        .unwrap();
    let summary: Vec<(&str, i64, i64)> = groups
        .iter()
        .map(|g| (g.reason.as_str(), g.count, g.unreplayed))
        .collect();
    assert_eq!(summary, vec![("bad json", 4, 3), ("timeout", 3, 3)]);
}

/// The console's groups and selections: `reasons` matches any of the exact reasons (however
/// many, quotes and NUL included), `ids` any of the ids; groups carry first/last times.
async fn reason_and_id_lists_select_exactly(db: &TestDb) {
    let s = &db.store;
    let reasons = [
        "missing field `a`",
        "missing field `b'\"`",
        "nul\0here",
        "other",
    ];
    let mut inserted = Vec::new();
    for (i, reason) in reasons.iter().enumerate() {
        for j in 0..2 {
            let at = 1_000 + (i as i64) * 10 + j;
            inserted.push(s.dead_letter_insert(&dl("r", reason, at)).await.unwrap());
        }
    }
    let f = DeadLetterFilter {
        reasons: Some(reasons[..3].iter().map(|r| (*r).to_owned()).collect()),
        ..Default::default()
    };
    assert_eq!(s.dead_letters_count(&f).await.unwrap(), 6);
    let none = DeadLetterFilter {
        reasons: Some(Vec::new()),
        ..Default::default()
    };
    assert_eq!(s.dead_letters_count(&none).await.unwrap(), 0);
    let many = DeadLetterFilter {
        reasons: Some(
            (0..5_000)
                .map(|i| format!("reason {i}"))
                .chain(["other".into()])
                .collect(),
        ),
        ..Default::default()
    };
    assert_eq!(s.dead_letters_count(&many).await.unwrap(), 2);
    let picked = DeadLetterFilter {
        ids: Some(vec![inserted[0], inserted[5], 999_999]),
        ..Default::default()
    };
    let got = ids(s.dead_letters_oldest_first(&picked, 10).await.unwrap());
    assert_eq!(got, vec![inserted[0], inserted[5]]);
    assert_eq!(s.dead_letters_purge(&picked).await.unwrap(), 2);
    let groups = s
        .dead_letter_groups(&DeadLetterFilter::default())
        .await
        .unwrap();
    let other = groups.iter().find(|g| g.reason == "other").unwrap();
    assert_eq!((other.first_at, other.last_at), (1_030, 1_031));
}

/// Claims dead letter `id` for an edit by `owner`.
async fn claim_edit(s: &Store, id: i64, owner: &str) -> bool {
    s.dead_letter_claim_edit(id, owner, 60_000).await.unwrap()
}

/// Claims dead letter `id` for a replay by `owner` (of rows replayed before `before`).
async fn claim_replay(s: &Store, id: i64, owner: &str, before: Option<i64>) -> bool {
    let claimed = s.dead_letter_claim_replay(id, owner, 60_000, before);
    claimed.await.unwrap()
}

async fn release(s: &Store, id: i64, owner: &str) {
    s.dead_letter_release_replay(Some(id), owner).await.unwrap();
}

async fn insert(s: &Store, at: i64) -> i64 {
    s.dead_letter_insert(&dl("o", "boom", at)).await.unwrap()
}

/// An edit and a replay share the replay claim; an edit is recorded with who, what and the
/// body sent, and the row is never replayed as archived afterwards; a dead letter a replay
/// became again links back; a purge forgets the history of what it deleted.
async fn edits_and_replays_keep_their_history(db: &TestDb) {
    let s = &db.store;
    let original = insert(s, 1_000).await;
    let other = insert(s, 1_001).await;

    // A replay holds the row: an edit cannot take it, and the other way round.
    assert!(claim_replay(s, original, "run", None).await);
    assert!(!claim_edit(s, original, "edit").await);
    release(s, original, "run").await;
    assert!(claim_edit(s, original, "edit").await);
    assert!(!claim_replay(s, original, "run", None).await);
    let detail = r#"{"body_changed":true}"#;
    let sent = br#"{"fixed":1}"#;
    s.dead_letter_mark_edited(original, "ops", detail, sent)
        .await
        .unwrap();
    let edited = s.dead_letter_get(original).await.unwrap().unwrap();
    assert!(edited.edited_at.is_some());
    assert_eq!(edited.replay_count, 1);
    assert_eq!(
        edited.letter.body,
        vec![0, 159, 146, 150, 0],
        "the original is kept"
    );
    // Edited: never replayed as archived again, even by a run that takes replayed rows.
    let later = Some(crate::common::now_ms() + 60_000);
    assert!(!claim_replay(s, original, "again", later).await);
    // Edited again: allowed.
    assert!(claim_edit(s, original, "edit-2").await);
    release(s, original, "edit-2").await;

    s.dead_letter_mark_replayed(other).await.unwrap();
    let events = s.dead_letter_events(original).await.unwrap();
    assert_eq!(events.len(), 1);
    let edit = &events[0];
    assert!(edit.is_edit());
    assert_eq!(edit.actor.as_deref(), Some("ops"));
    assert_eq!(edit.detail["body_changed"], serde_json::json!(true));
    assert_eq!(edit.body.as_deref(), Some(&sent[..]));
    let replays = s.dead_letter_events(other).await.unwrap();
    assert_eq!(replays.len(), 1);
    assert!(!replays[0].is_edit());
    assert!(replays[0].actor.is_none() && replays[0].body.is_none());

    // The copy failed again: its dead letter names the one it came from.
    let mut again = dl("o", "boom again", 2_000);
    let link = ("x-carteiro-replay-of".to_owned(), original.to_string());
    again.headers.push(link);
    let again = s.dead_letter_insert(&again).await.unwrap();
    let got = s.dead_letter_get(again).await.unwrap().unwrap();
    assert_eq!(got.replay_of, Some(original));
    let children = ids(s.dead_letters_replaying(original).await.unwrap());
    assert_eq!(children, vec![again]);
    let none = s.dead_letters_replaying(other).await.unwrap();
    assert!(none.is_empty());

    let f = DeadLetterFilter {
        ids: Some(vec![original, other]),
        ..Default::default()
    };
    assert_eq!(s.dead_letters_purge(&f).await.unwrap(), 2);
    for id in [original, other] {
        assert!(s.dead_letter_events(id).await.unwrap().is_empty());
    }
}

/// The console's groups at a million dead letters: SQLite reads one covering index (no
/// table, no temporary sort), so the page stays fast and holds its connection briefly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_read_a_covering_index_at_a_million() {
    let db = TestDb::sqlite().await;
    let insert = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000) \
         INSERT INTO dead_letters (route, queue, reason, plugin, attempts, headers, body, \
         dead_lettered_at, replay_count) \
         SELECT 'r' || (i % 5), 'q', 'failure kind ' || (i % 50), 'p', 1, '[]', x'7b7d', i, 0 FROM n";
    sqlx::query(insert).execute(db.store.pool()).await.unwrap();
    for route in [None, Some("r3".to_owned())] {
        let filter = DeadLetterFilter {
            route: route.clone(),
            ..Default::default()
        };
        let plan = db.store.groups_plan(&filter).await.join("; ");
        assert!(
            plan.contains("USING COVERING INDEX dead_letters_groups"),
            "{route:?}: {plan}"
        );
        assert!(
            !plan.contains("USE TEMP B-TREE FOR GROUP BY"),
            "{route:?}: {plan}"
        );
        let started = std::time::Instant::now();
        let groups = db.store.dead_letter_groups(&filter).await.unwrap();
        eprintln!(
            "groups of {route:?} at 1M dead letters: {:?}",
            started.elapsed()
        );
        assert_eq!(groups.len(), if route.is_some() { 10 } else { 50 });
        assert_eq!(
            groups.iter().map(|g| g.count).sum::<i64>(),
            if route.is_some() { 200_000 } else { 1_000_000 }
        );
    }
    db.finish().await;
}
