//! Outbox rows stored verbatim, leasing between relays, backoff, ordering keys, retention.

use super::{TestDb, both_backends, event, keys, request};
use crate::store::{CommitOutcome, NewOutboxRow, now_ms};

both_backends!(
    stored_verbatim,
    leases_and_backoff,
    ordering_key_holds_back_later_rows,
    an_owner_extends_its_own_chains_only,
    marks_and_releases_by_id,
    leases_and_backoffs_are_stamped_by_the_database_clock,
    a_claim_is_bounded_by_bytes,
    a_stale_relay_cannot_fail_a_row_it_no_longer_leases,
    a_parked_row_is_not_open_to_the_cdc_recheck,
);

fn keyed(routing_key: &str, ordering_key: &str) -> NewOutboxRow {
    let mut e = event(routing_key, b"p");
    e.ordering_key = ordering_key.into();
    e
}

/// `n` events with routing keys `{prefix}0`, `{prefix}1`, ...
fn numbered(prefix: &str, n: usize, payload: &[u8]) -> Vec<NewOutboxRow> {
    (0..n)
        .map(|i| event(&format!("{prefix}{i}"), payload))
        .collect()
}

async fn commit_events(db: &TestDb, key: &str, events: Vec<NewOutboxRow>) {
    let mut req = request("orders", key);
    req.outbox = events;
    assert_eq!(
        db.store.commit_batch(&[req]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );
}

async fn stored_verbatim(db: &TestDb) {
    let big: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
    let mut tricky = event(
        "'); DROP TABLE outbox;--",
        b"it's \"quoted\" \\ '); DROP TABLE kv;--",
    );
    tricky.exchange = "ex'\"`".into();
    tricky.headers = vec![
        ("x-sql".into(), "'; DELETE FROM inbox; --".into()),
        ("x-unicode".into(), "ção ✉ \u{1F4EC}".into()),
        ("x-sql".into(), "duplicate names keep their order".into()),
    ];
    tricky.ordering_key = "order-'1'".into();
    let mut large = event("large", &big);
    large.content_type = None;
    large.headers = vec![];
    let mut empty = event("", b"");
    empty.exchange = String::new();
    let expected = vec![tricky, large, empty];
    commit_events(db, "m-1", expected.clone()).await;

    let rows = db
        .store
        .outbox_pending(10, "relay-a", 60_000)
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    for (row, want) in rows.iter().zip(&expected) {
        assert_eq!(&row.event, want);
        assert_eq!((row.attempts, row.last_error.clone()), (0, None));
    }
    assert!(rows.windows(2).all(|w| w[0].id < w[1].id));
    // The tables are all still there.
    assert_eq!(db.store.outbox_status().await.unwrap().pending, 3);
    assert!(db.store.kv_get("ns", "x").await.unwrap().is_none());
}

async fn leases_and_backoff(db: &TestDb) {
    let s = &db.store;
    commit_events(db, "m-1", numbered("rk", 5, b"p")).await;

    // Relay A takes three; relay B gets the other two, never the same rows.
    let a = s.outbox_pending(3, "relay-a", 60_000).await.unwrap();
    let b = s.outbox_pending(10, "relay-b", 60_000).await.unwrap();
    assert_eq!((a.len(), b.len()), (3, 2));
    assert!(a.iter().all(|r| b.iter().all(|o| o.id != r.id)));
    assert!(a.last().unwrap().id < b[0].id, "handed out in id order");
    assert!(
        s.outbox_pending(10, "relay-a", 60_000)
            .await
            .unwrap()
            .is_empty()
    );
    let status = s.outbox_status().await.unwrap();
    assert_eq!(
        (status.pending, status.leased, status.with_errors),
        (5, 5, 0)
    );
    assert!(status.oldest_pending_age_ms.unwrap() >= 0);

    // Published rows are never handed out again; marking twice is harmless.
    s.outbox_mark_published(a[0].id).await.unwrap();
    s.outbox_mark_published(a[0].id).await.unwrap();
    // A failure releases the lease and backs off until retry_at.
    s.outbox_mark_failed(a[1].id, "relay-a", "nack from broker\0", 60_000)
        .await
        .unwrap();
    s.outbox_mark_failed(a[2].id, "relay-a", "channel closed", 0)
        .await
        .unwrap();
    let again = s.outbox_pending(10, "relay-c", 60_000).await.unwrap();
    assert_eq!(
        again.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![a[2].id]
    );
    assert_eq!(
        (again[0].attempts, again[0].last_error.as_deref()),
        (1, Some("channel closed"))
    );
    let status = s.outbox_status().await.unwrap();
    assert_eq!((status.pending, status.with_errors), (4, 2));

    // A relay shutting down gives its leases back; an expired lease is free too.
    assert_eq!(s.outbox_release("relay-b").await.unwrap(), 2);
    let c = s.outbox_pending(10, "relay-c", -1).await.unwrap();
    assert_eq!(c.len(), 2);
    let expired = s.outbox_pending(10, "relay-d", 60_000).await.unwrap();
    assert_eq!(expired.len(), 2, "expired leases are free to take");

    // Retention removes only published rows older than the cutoff.
    assert_eq!(s.outbox_purge_published_before(0).await.unwrap(), 0);
    assert_eq!(
        s.outbox_purge_published_before(now_ms() + 1).await.unwrap(),
        1
    );
    assert_eq!(s.outbox_status().await.unwrap().pending, 4);
}

async fn ordering_key_holds_back_later_rows(db: &TestDb) {
    let s = &db.store;
    commit_events(
        db,
        "m-1",
        vec![keyed("a1", "A"), keyed("b1", "B"), keyed("a2", "A")],
    )
    .await;

    // All three at once is fine: the relay publishes them in id order.
    let first = s.outbox_pending(10, "r1", 60_000).await.unwrap();
    assert_eq!(first.len(), 3);
    // a1 fails and backs off: a2 (same key) must wait behind it, b1 is not affected.
    for (row, backoff_ms) in first.iter().zip([60_000, 0, 0]) {
        s.outbox_mark_failed(row.id, "r1", "nack", backoff_ms)
            .await
            .unwrap();
    }
    let next = s.outbox_pending(10, "r1", 60_000).await.unwrap();
    assert_eq!(keys(&next), ["b1"]);
    // Once a1 is published, a2 flows.
    s.outbox_mark_published(first[0].id).await.unwrap();
    let last = s.outbox_pending(10, "r1", 60_000).await.unwrap();
    assert_eq!(keys(&last), ["a2"]);
}

async fn an_owner_extends_its_own_chains_only(db: &TestDb) {
    let s = &db.store;
    commit_events(
        db,
        "m-1",
        vec![
            keyed("a1", "A"),
            keyed("b1", "B"),
            keyed("a2", "A"),
            keyed("a3", "A"),
            keyed("u1", ""),
        ],
    )
    .await;
    // r1 takes the head of A.
    let first = s.outbox_pending(1, "r1", 60_000).await.unwrap();
    assert_eq!(keys(&first), ["a1"]);
    // Another owner must not take later rows of A while r1 holds a1.
    let other = s.outbox_pending(10, "r2", 60_000).await.unwrap();
    assert_eq!(keys(&other), ["b1", "u1"]);
    // r1 itself may: they join its chain behind a1, in id order.
    let more = s.outbox_pending(10, "r1", 60_000).await.unwrap();
    assert_eq!(keys(&more), ["a2", "a3"]);
    assert!(s.outbox_pending(10, "r1", 60_000).await.unwrap().is_empty());

    // a1 confirmed; a2 fails and backs off; r1 gives a3 back after recording the failure.
    assert_eq!(
        s.outbox_mark_published_many(&[first[0].id]).await.unwrap(),
        1
    );
    s.outbox_mark_failed(more[0].id, "r1", "nack", 60_000)
        .await
        .unwrap();
    assert_eq!(s.outbox_release_rows("r1", &[more[1].id]).await.unwrap(), 1);
    // a3 stays behind a2, for everyone.
    assert!(s.outbox_pending(10, "r1", 60_000).await.unwrap().is_empty());
    assert!(s.outbox_pending(10, "r3", 60_000).await.unwrap().is_empty());
    // Once a2's backoff is over, a2 and a3 come back in order.
    end_backoff(db, more[0].id).await;
    let retry = s.outbox_pending(10, "r3", 60_000).await.unwrap();
    assert_eq!(keys(&retry), ["a2", "a3"]);
    assert_eq!(retry[0].attempts, 1);
}

async fn marks_and_releases_by_id(db: &TestDb) {
    let s = &db.store;
    commit_events(db, "m-1", numbered("rk", 5, b"p")).await;
    let rows = s.outbox_pending(10, "r1", 60_000).await.unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    assert_eq!(s.outbox_mark_published_many(&[]).await.unwrap(), 0);
    // One write marks several rows; marking again changes nothing.
    assert_eq!(s.outbox_mark_published_many(&ids[..3]).await.unwrap(), 3);
    assert_eq!(s.outbox_mark_published_many(&ids[..3]).await.unwrap(), 0);
    let status = s.outbox_status().await.unwrap();
    assert_eq!((status.pending, status.leased), (2, 2));
    // Only the owner's own, unpublished rows are released.
    assert_eq!(s.outbox_release_rows("r2", &ids).await.unwrap(), 0);
    assert_eq!(s.outbox_release_rows("r1", &ids).await.unwrap(), 2);
    assert_eq!(s.outbox_status().await.unwrap().leased, 0);
    let again = s.outbox_pending(10, "r2", 60_000).await.unwrap();
    assert_eq!(again.iter().map(|r| r.id).collect::<Vec<_>>(), ids[3..]);
}

/// SQLite: in-process writers queue on the store's writer lock (FIFO) rather than in
/// SQLite's busy handler; a writer waiting there holds no pooled connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writers_take_turns_in_process() {
    let db = TestDb::sqlite().await;
    let s = db.store.clone();
    commit_events(&db, "m-1", vec![event("rk", b"p")]).await;
    let rows = s.outbox_pending(10, "r1", 60_000).await.unwrap();
    let held = s.begin_write().await.unwrap();
    // Queued behind `held`: more waiters than the pool (4) has connections.
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            let id = rows[0].id;
            tokio::spawn(async move { s.outbox_mark_published_many(&[id]).await })
        })
        .collect();
    // Readers still get connections while the writers queue.
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), s.outbox_status())
        .await
        .expect("a read is not blocked by queued writers")
        .unwrap();
    assert_eq!(status.pending, 1);
    held.commit().await.unwrap();
    let mut marked = 0;
    for w in waiters {
        marked += tokio::time::timeout(std::time::Duration::from_secs(10), w)
            .await
            .expect("queued writers proceed")
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        marked, 1,
        "the first writer marks the row; the rest find it marked"
    );
    db.finish().await;
}

async fn leases_and_backoffs_are_stamped_by_the_database_clock(db: &TestDb) {
    let s = &db.store;
    commit_events(db, "m", vec![event("a", b"p")]).await;
    let before = s.db_now_ms().await.unwrap();
    let rows = s.outbox_pending(10, "r1", 60_000).await.unwrap();
    let after = s.db_now_ms().await.unwrap();
    let stamp = |column: &'static str| {
        let sql = format!("SELECT {column} FROM outbox WHERE id = $1");
        let id = rows[0].id;
        async move {
            let v: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(id)
                .fetch_one(s.pool())
                .await
                .unwrap();
            v
        }
    };
    let lease_until = stamp("lease_until").await;
    assert!(
        (before + 60_000..=after + 60_000).contains(&lease_until),
        "{before} {lease_until} {after}"
    );
    s.outbox_mark_failed(rows[0].id, "r1", "nack", 30_000)
        .await
        .unwrap();
    let after = s.db_now_ms().await.unwrap();
    let next = stamp("next_attempt_at").await;
    assert!((before + 30_000..=after + 30_000).contains(&next), "{next}");
}

async fn a_claim_is_bounded_by_bytes(db: &TestDb) {
    let s = &db.store;
    commit_events(db, "m", numbered("e", 5, &[7u8; 1_000])).await;
    // Each row weighs 1,000 payload bytes plus 19 of header JSON: [["x-trace","abc"]].
    let two = s.outbox_claim(10, 2_500, "r1", 60_000).await.unwrap();
    assert_eq!(keys(&two), ["e0", "e1"]);
    let one = s.outbox_claim(10, 1, "r1", 60_000).await.unwrap();
    assert_eq!(keys(&one), ["e2"], "always at least one row, however large");
    let exact = s.outbox_claim(10, 1_019, "r1", 60_000).await.unwrap();
    assert_eq!(keys(&exact), ["e3"]);
    let rest = s.outbox_claim(10, i64::MAX, "r1", 60_000).await.unwrap();
    assert_eq!(keys(&rest), ["e4"]);
}

/// The database's clock runs 10 minutes behind, then ahead of, this process (the relay):
/// leases written by another relay in the database's time must be read in that time too.
/// With the relay's wall clock, the first lease would look expired (stolen, published
/// twice) and the second still running (stranded for minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_with_a_wrong_clock_neither_steals_nor_strands_leases() {
    let db = super::TestDb::postgres().await;
    let name = db.pg.as_ref().unwrap().1.clone();
    for (skew, lease_vs_relay, claimable) in [
        // DB 10 min behind the relay; the lease ends 5 min ago by the relay's clock, but
        // in 5 min by the database's: still running.
        ("- interval '10 minutes'", -300_000_i64, false),
        // DB 10 min ahead; the lease ends in 5 min by the relay's clock, but ended 5 min
        // ago by the database's: free to take.
        ("+ interval '10 minutes'", 300_000, true),
    ] {
        for sql in [
            "CREATE SCHEMA IF NOT EXISTS skew".to_owned(),
            format!(
                "CREATE OR REPLACE FUNCTION skew.clock_timestamp() RETURNS timestamptz \
                 LANGUAGE sql AS $$ SELECT pg_catalog.clock_timestamp() {skew} $$"
            ),
            format!("ALTER DATABASE {name} SET search_path = skew, pg_catalog, public"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(db.store.pool())
                .await
                .unwrap();
        }
        let relay = db.second_store().await; // new sessions see the skewed clock
        let db_ahead = relay.db_now_ms().await.unwrap() - now_ms();
        assert!((db_ahead.abs() - 600_000).abs() < 5_000, "{db_ahead}");

        let mut req = request("orders", &uuid::Uuid::now_v7().to_string());
        req.outbox = vec![event("leased-elsewhere", b"p")];
        relay.commit_batch(&[req]).await.unwrap();
        // Another relay leased it; its lease ends `lease_vs_relay` from this relay's now.
        sqlx::query(
            "UPDATE outbox SET lease_owner = 'other', lease_until = $1 WHERE published_at IS NULL",
        )
        .bind(now_ms() + lease_vs_relay)
        .execute(relay.pool())
        .await
        .unwrap();
        let got = relay.outbox_pending(10, "me", 60_000).await.unwrap();
        assert_eq!(!got.is_empty(), claimable, "skew {skew}: {got:?}");
        sqlx::query("DELETE FROM outbox")
            .execute(relay.pool())
            .await
            .unwrap();
        relay.pool().close().await;
    }
    db.finish().await;
}

/// Ends row `id`'s backoff now, as if its wait were over.
async fn end_backoff(db: &TestDb, id: i64) {
    sqlx::query("UPDATE outbox SET next_attempt_at = 0 WHERE id = $1")
        .bind(id)
        .execute(db.store.pool())
        .await
        .unwrap();
}

/// A relay woken after its lease ran out (SIGSTOP, a long pause) reports a failure for a row
/// another relay has leased since: the new owner's lease must stand.
async fn a_stale_relay_cannot_fail_a_row_it_no_longer_leases(db: &TestDb) {
    let s = &db.store;
    commit_events(db, "m-1", vec![event("rk", b"p")]).await;
    let stale = s.outbox_pending(10, "stale", 1).await.unwrap();
    assert_eq!(stale.len(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let live = s.outbox_pending(10, "live", 60_000).await.unwrap();
    assert_eq!(live.len(), 1, "the expired lease is taken over");
    let applied = s
        .outbox_mark_failed(stale[0].id, "stale", "nack", 0)
        .await
        .unwrap();
    assert!(!applied, "a stale relay's failure must not apply");
    let status = s.outbox_status().await.unwrap();
    assert_eq!((status.leased, status.with_errors), (1, 0), "{status:?}");
    // The live owner's own failure applies.
    assert!(
        s.outbox_mark_failed(live[0].id, "live", "nack", 0)
            .await
            .unwrap()
    );
}

/// A CDC relay that starts before the slot passed a parked row reads it again; the recheck
/// must see it settled, or it is parked again with a doubled count (and, for a keyed row, a
/// "held behind" error in place of its own). Seen by the fault campaign's CDC smoke.
async fn a_parked_row_is_not_open_to_the_cdc_recheck(db: &TestDb) {
    commit_events(db, "m1", numbered("k", 3, b"p")).await;
    let ids = db
        .store
        .outbox_existing_among(&(1..=100).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(ids.len(), 3);
    let (open, parked, failing) = (ids[0], ids[1], ids[2]);
    let s = &db.store;
    s.outbox_record_failure(parked, "permanent: cannot be published", true)
        .await
        .unwrap();
    s.outbox_record_failure(failing, "broker unreachable", false)
        .await
        .unwrap();
    assert_eq!(
        s.outbox_unpublished_among(&ids).await.unwrap(),
        vec![open, failing]
    );
}
