//! `commit_batch` semantics: committed, duplicate, conflict, rejected, delete.

use super::{
    TestDb, both_backends, commit_writes, event, keys, read, read_modify_write, request, write,
};
use crate::store::{CommitOutcome, StoreError};

both_backends!(
    committed,
    duplicate,
    conflict_when_read_version_changed,
    conflict_when_read_absent_then_inserted,
    rejected_request_leaves_neighbours_alone,
    database_refusal_is_rejected_per_request,
    deletes,
    nul_bytes_are_rejected_with_the_field_name,
    unavailable_when_pool_closed,
    migrate_twice_and_purge_inbox,
);

async fn committed(db: &TestDb) {
    let s = &db.store;
    let mut req = request("orders", "m-1");
    req.reads = vec![read("a", None)];
    req.writes = vec![write("a", Some(b"1")), write("b", Some(b"x"))];
    req.outbox = vec![event("order.created", b"{}")];
    assert_eq!(
        s.commit_batch(&[req]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );

    let a = s.kv_get("ns", "a").await.unwrap().unwrap();
    assert_eq!((a.value.as_slice(), a.version), (&b"1"[..], 1));
    assert!(s.kv_get("ns", "b").await.unwrap().is_some());
    assert!(s.kv_get("other-ns", "a").await.unwrap().is_none());
    assert!(s.inbox_contains("orders", "m-1").await.unwrap());
    assert!(!s.inbox_contains("other-route", "m-1").await.unwrap());
    assert_eq!(s.outbox_status().await.unwrap().pending, 1);

    // Blind write bumps the version; read-modify-write checks it.
    commit_writes(s, "orders", "m-2", vec![write("a", Some(b"2"))]).await;
    let req = read_modify_write("orders", "m-3", "a", Some(2), Some(b"3"));
    assert_eq!(
        s.commit_batch(&[req]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );
    assert_eq!(s.kv_get("ns", "a").await.unwrap().unwrap().version, 3);
    assert_eq!(s.commit_batch(&[]).await.unwrap(), vec![]);
}

async fn duplicate(db: &TestDb) {
    let s = &db.store;
    let mut req = request("orders", "m-1");
    req.writes = vec![write("count", Some(b"1"))];
    req.outbox = vec![event("k", b"p")];
    assert_eq!(
        s.commit_batch(&[req.clone()]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );

    // Redelivery: nothing applied again (new event id, as a re-run handler would make).
    req.outbox = vec![event("k", b"p")];
    assert_eq!(
        s.commit_batch(&[req.clone()]).await.unwrap(),
        vec![CommitOutcome::Duplicate]
    );
    assert_eq!(s.kv_get("ns", "count").await.unwrap().unwrap().version, 1);
    assert_eq!(s.outbox_status().await.unwrap().pending, 1);

    // Two copies in one batch (concurrent duplicates): only the first commits.
    let mut a = request("orders", "m-2");
    a.writes = vec![write("count", Some(b"2"))];
    let mut b = a.clone();
    b.writes = vec![write("count", Some(b"3"))];
    let outcomes = s.commit_batch(&[a, b]).await.unwrap();
    assert_eq!(
        outcomes,
        vec![CommitOutcome::Committed, CommitOutcome::Duplicate]
    );
    let v = s.kv_get("ns", "count").await.unwrap().unwrap();
    assert_eq!((v.value.as_slice(), v.version), (&b"2"[..], 2));
}

async fn conflict_when_read_version_changed(db: &TestDb) {
    let s = &db.store;
    commit_writes(s, "r", "seed", vec![write("c", Some(b"10"))]).await;

    // Two handlers read version 1; both write. The second in the batch must lose.
    let mut a = request("r", "a");
    a.reads = vec![read("c", Some(1))];
    a.writes = vec![write("c", Some(b"11"))];
    a.outbox = vec![event("from-a", b"a")];
    let mut b = request("r", "b");
    b.reads = vec![read("c", Some(1))];
    b.writes = vec![write("c", Some(b"12")), write("other", Some(b"x"))];
    b.outbox = vec![event("from-b", b"b")];
    let outcomes = s.commit_batch(&[a, b.clone()]).await.unwrap();
    assert_eq!(
        outcomes,
        vec![CommitOutcome::Committed, CommitOutcome::Conflict]
    );

    // Nothing of the loser stuck: no inbox row (it will be re-run), no write, no event.
    assert!(!s.inbox_contains("r", "b").await.unwrap());
    assert!(s.kv_get("ns", "other").await.unwrap().is_none());
    assert_eq!(s.kv_get("ns", "c").await.unwrap().unwrap().value, b"11");
    let rows = s.outbox_pending(10, "t", 60_000).await.unwrap();
    assert_eq!(keys(&rows), ["from-a"]);

    // A read of a key that was deleted since is a conflict too, even without a write.
    commit_writes(s, "r", "del", vec![write("c", None)]).await;
    b.inbox_key = "b2".into();
    b.reads = vec![read("c", Some(2))];
    b.writes = vec![];
    assert_eq!(
        s.commit_batch(&[b]).await.unwrap(),
        vec![CommitOutcome::Conflict]
    );

    // Re-run with the current state succeeds.
    let b3 = read_modify_write("r", "b", "c", None, Some(b"1"));
    assert_eq!(
        s.commit_batch(&[b3]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );
}

async fn conflict_when_read_absent_then_inserted(db: &TestDb) {
    let s = &db.store;
    // Both read "new" as absent and create it: in one batch the second loses...
    let a = read_modify_write("r", "a", "new", None, Some(b"a"));
    let b = read_modify_write("r", "b", "new", None, Some(b"b"));
    let outcomes = s.commit_batch(&[a, b.clone()]).await.unwrap();
    assert_eq!(
        outcomes,
        vec![CommitOutcome::Committed, CommitOutcome::Conflict]
    );
    assert_eq!(s.kv_get("ns", "new").await.unwrap().unwrap().value, b"a");

    // ...and across batches too (another key, created by a blind write in between).
    let c = read_modify_write("r", "c", "late", None, Some(b"c"));
    commit_writes(s, "r", "blind", vec![write("late", Some(b"blind"))]).await;
    assert_eq!(
        s.commit_batch(&[c]).await.unwrap(),
        vec![CommitOutcome::Conflict]
    );
    assert_eq!(
        s.kv_get("ns", "late").await.unwrap().unwrap().value,
        b"blind"
    );
    assert!(!s.inbox_contains("r", "c").await.unwrap());
}

async fn rejected_request_leaves_neighbours_alone(db: &TestDb) {
    let s = &db.store;
    let mut ok1 = request("r", "ok1");
    ok1.writes = vec![write("k1", Some(b"1"))];
    ok1.outbox = vec![event("one", b"1")];
    let mut bad = request("r", "bad");
    bad.writes = vec![write("k-bad", Some(b"x"))];
    bad.outbox = vec![event("two\0", b"2")];
    let mut ok2 = request("r", "ok2");
    ok2.writes = vec![write("k2", Some(b"2"))];
    ok2.outbox = vec![event("three", b"3")];
    let outcomes = s.commit_batch(&[ok1, bad, ok2]).await.unwrap();
    assert_eq!(outcomes[0], CommitOutcome::Committed);
    assert!(
        matches!(&outcomes[1], CommitOutcome::Rejected(m) if m.to_string().contains("outbox[0].routing_key")),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[2], CommitOutcome::Committed);
    assert!(s.kv_get("ns", "k1").await.unwrap().is_some());
    assert!(s.kv_get("ns", "k2").await.unwrap().is_some());
    assert!(s.kv_get("ns", "k-bad").await.unwrap().is_none());
    assert!(!s.inbox_contains("r", "bad").await.unwrap());
    assert_eq!(s.outbox_status().await.unwrap().pending, 2);
}

async fn database_refusal_is_rejected_per_request(db: &TestDb) {
    // The database itself refuses the middle request (duplicate event_id: unique violation).
    // On PostgreSQL this aborts the transaction until the savepoint is rolled back.
    let s = &db.store;
    let shared = event("dup", b"d");
    let mut first = request("r", "first");
    first.outbox = vec![shared.clone()];
    let mut again = request("r", "again");
    again.writes = vec![write("must-not-exist", Some(b"x"))];
    again.outbox = vec![shared];
    let mut after = request("r", "after");
    after.writes = vec![write("after", Some(b"y"))];
    let outcomes = s.commit_batch(&[first, again, after]).await.unwrap();
    assert_eq!(outcomes[0], CommitOutcome::Committed);
    assert!(
        matches!(&outcomes[1], CommitOutcome::Rejected(_)),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[2], CommitOutcome::Committed);
    assert!(s.kv_get("ns", "must-not-exist").await.unwrap().is_none());
    assert!(s.kv_get("ns", "after").await.unwrap().is_some());
    assert!(!s.inbox_contains("r", "again").await.unwrap());
}

async fn deletes(db: &TestDb) {
    let s = &db.store;
    commit_writes(
        s,
        "r",
        "put",
        vec![write("a", Some(b"1")), write("b", Some(b"1"))],
    )
    .await;

    let mut del = request("r", "del");
    del.reads = vec![read("a", Some(1))];
    del.writes = vec![
        write("a", None),
        write("b", None),
        write("never-there", None),
    ];
    assert_eq!(
        s.commit_batch(&[del]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );
    assert!(s.kv_get("ns", "a").await.unwrap().is_none());
    assert!(s.kv_get("ns", "b").await.unwrap().is_none());

    // Recreated after delete: the version goes on (2 = tombstone, 3 = new value), so a read
    // made before the delete (version 1) cannot pass its check (no ABA).
    let again = read_modify_write("r", "again", "a", None, Some(b"new"));
    assert_eq!(
        s.commit_batch(&[again]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );
    assert_eq!(s.kv_get("ns", "a").await.unwrap().unwrap().version, 3);
    let aba = read_modify_write("r", "aba", "a", Some(1), Some(b"stale"));
    assert_eq!(
        s.commit_batch(&[aba]).await.unwrap(),
        vec![CommitOutcome::Conflict]
    );
    // Blind write over a tombstone, then tombstone retention.
    commit_writes(s, "r", "blind", vec![write("b", Some(b"back"))]).await;
    assert_eq!(s.kv_get("ns", "b").await.unwrap().unwrap().version, 3);
    commit_writes(
        s,
        "r",
        "del-b",
        vec![write("b", None), write("never-there", None)],
    )
    .await;
    let now = crate::store::now_ms() + 1;
    assert_eq!(s.kv_purge_tombstones_before(now).await.unwrap(), 1);

    // A delete based on a stale read conflicts.
    let stale = read_modify_write("r", "stale", "a", Some(7), None);
    assert_eq!(
        s.commit_batch(&[stale]).await.unwrap(),
        vec![CommitOutcome::Conflict]
    );
    assert!(s.kv_get("ns", "a").await.unwrap().is_some());

    // The last of several writes to one key wins.
    let twice = vec![
        write("t", Some(b"1")),
        write("t", None),
        write("t", Some(b"3")),
    ];
    commit_writes(s, "r", "twice", twice).await;
    assert_eq!(s.kv_get("ns", "t").await.unwrap().unwrap().value, b"3");
}

async fn nul_bytes_are_rejected_with_the_field_name(db: &TestDb) {
    let s = &db.store;
    type Edit = Box<dyn Fn(&mut crate::store::CommitRequest)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "writes[0].key",
            Box::new(|r| r.writes = vec![write("a\0b", Some(b"v"))]),
        ),
        (
            "reads[0].key",
            Box::new(|r| r.reads = vec![read("\0", None)]),
        ),
        ("inbox_key", Box::new(|r| r.inbox_key = "k\0".into())),
        ("namespace", Box::new(|r| r.namespace = "n\0".into())),
        (
            "outbox[0].exchange",
            Box::new(|r| {
                r.outbox = vec![{
                    let mut e = event("rk", b"");
                    e.exchange = "ex\0".into();
                    e
                }]
            }),
        ),
    ];
    for (i, (field, edit)) in cases.iter().enumerate() {
        let mut req = request("r", &format!("nul-{i}"));
        edit(&mut req);
        let outcomes = s.commit_batch(&[req]).await.unwrap();
        match &outcomes[0] {
            CommitOutcome::Rejected(m) => {
                let m = m.to_string();
                assert!(m.contains(field) && m.contains("NUL"), "{field}: {m}");
            }
            other => panic!("{field}: expected Rejected, got {other:?}"),
        }
    }
    // Headers are JSON text: a NUL there is stored escaped and comes back verbatim.
    let mut req = request("r", "nul-header");
    let mut e = event("rk", b"\0binary\0");
    e.headers = vec![("h".into(), "a\0b".into())];
    req.outbox = vec![e.clone()];
    assert_eq!(
        s.commit_batch(&[req]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );
    let rows = s.outbox_pending(10, "t", 1000).await.unwrap();
    assert_eq!(
        (rows[0].event.headers.clone(), rows[0].event.payload.clone()),
        (e.headers, e.payload)
    );
    // Reads with NUL are refused clearly too.
    let err = s.kv_get("ns", "a\0").await.unwrap_err();
    assert!(
        matches!(err, StoreError::Invalid(ref m) if m.contains("kv key")),
        "{err}"
    );
}

async fn unavailable_when_pool_closed(db: &TestDb) {
    let other = db.second_store().await;
    other.pool().close().await;
    let err = other.commit_batch(&[request("r", "x")]).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(other.ping().await.unwrap_err().is_transient());
    db.store.ping().await.unwrap();
}

async fn migrate_twice_and_purge_inbox(db: &TestDb) {
    let s = &db.store;
    s.migrate().await.unwrap();
    s.commit_batch(&[request("r", "old")]).await.unwrap();
    let removed = s
        .inbox_purge_before(crate::store::now_ms() + 1)
        .await
        .unwrap();
    assert_eq!(removed, 1);
    assert!(!s.inbox_contains("r", "old").await.unwrap());
}
