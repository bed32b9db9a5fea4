//! The store's own trouble on real databases: read-only, missing tables, lost grants,
//! statement and lock timeouts, a database that stops answering, and batches past
//! PostgreSQL's 65,535 bound parameters. Each must come back as `Unavailable` (requeue and
//! pause), never as a per-request `Rejected` that would dead-letter a good message.

use std::time::{Duration, Instant};

use super::{TestDb, both_backends, event, request, write};
use crate::store::{
    CommitOutcome, CommitRequest, KvWrite, NewDeadLetter, Store, StoreError, StoreOptions,
};

both_backends!(missing_table_is_unavailable, batches_past_65535_parameters);

/// A request touching every table a commit writes.
fn full_request(key: &str) -> CommitRequest {
    let mut req = request("r", key);
    req.writes = vec![write("k", Some(b"v"))];
    req.outbox = vec![event("e", b"{}")];
    req
}

fn dead_letter() -> NewDeadLetter {
    NewDeadLetter {
        route: "r".into(),
        queue: "r.dlq".into(),
        reason: "boom".into(),
        plugin: None,
        attempts: 1,
        headers: Vec::new(),
        body: b"x".to_vec(),
        first_failed_at: None,
        dead_lettered_at: 1,
    }
}

/// Commits [`full_request`] `key` on `store`, which must fail as `Unavailable` naming
/// `sqlstate`.
async fn unavailable_with(store: &Store, key: &str, sqlstate: &str) {
    let err = store.commit_batch(&[full_request(key)]).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(err.to_string().contains(sqlstate), "{err}");
}

fn assert_unavailable<T: std::fmt::Debug>(what: &str, result: Result<T, StoreError>) {
    match result {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("{what}: expected Unavailable, got {other:?}"),
    }
}

async fn missing_table_is_unavailable(db: &TestDb) {
    let s = &db.store;
    sqlx::query("DROP TABLE outbox")
        .execute(s.pool())
        .await
        .unwrap();
    // Both the set-based path and the savepoint fallback must fail the batch as a whole.
    assert_unavailable("commit", s.commit_batch(&[full_request("m-1")]).await);
    assert_unavailable(
        "commit_each",
        s.commit_each(&[full_request("m-2")], None).await,
    );
    assert!(
        !s.inbox_contains("r", "m-1").await.unwrap(),
        "nothing half-committed"
    );
    // Its search fields and history first: on PostgreSQL they refer to it.
    for table in ["dead_letter_fields", "dead_letter_events", "dead_letters"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(s.pool())
            .await
            .unwrap();
    }
    assert_unavailable("dead letter", s.dead_letter_insert(&dead_letter()).await);
}

/// `lock_kv_keys` used to bind one parameter per key of the whole batch: past 65,535 keys
/// sqlx refused the statement with a protocol error, which counted as "store unavailable",
/// so the batch was requeued and failed again for ever. Chunked, the statement went through
/// and PostgreSQL then ran out of lock table ("out of shared memory", 53200) at 70,000
/// advisory locks: batches are now committed in transactions of at most 2,048 kv keys.
async fn batches_past_65535_parameters(db: &TestDb) {
    const REQUESTS: usize = 70;
    const KEYS: usize = 1_000; // 70,000 kv keys in one batch
    let batch: Vec<CommitRequest> = (0..REQUESTS)
        .map(|r| {
            let mut req = request("wide", &format!("m-{r}"));
            req.writes = (0..KEYS)
                .map(|k| KvWrite {
                    key: format!("{r}/{k}"),
                    value: Some(b"1".to_vec()),
                })
                .collect();
            req
        })
        .collect();
    let outcomes = db.store.commit_batch(&batch).await.unwrap();
    assert!(
        outcomes.iter().all(|o| *o == CommitOutcome::Committed),
        "{outcomes:?}"
    );
    assert!(db.store.kv_get("ns", "69/999").await.unwrap().is_some());

    // One delivery alone past the per-commit bound is refused (dead-lettered with the
    // reason), through either path, never retried for ever.
    let mut wide = request("wide", "one-request");
    wide.writes = (0..66_000)
        .map(|k| KvWrite {
            key: format!("single/{k}"),
            value: Some(b"1".to_vec()),
        })
        .collect();
    for outcome in [
        db.store
            .commit_batch(std::slice::from_ref(&wide))
            .await
            .unwrap(),
        db.store
            .commit_each(std::slice::from_ref(&wide), None)
            .await
            .unwrap()
            .outcomes,
    ] {
        match &outcome[..] {
            [CommitOutcome::Rejected(why)] => {
                assert!(why.to_string().contains("66000 distinct kv keys"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(db.store.kv_get("ns", "single/0").await.unwrap().is_none());
}

/// A failover leaves the old primary read-only (SQLSTATE 25006); so does
/// `default_transaction_read_only`, which this test sets on its database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_postgres_is_unavailable() {
    let db = TestDb::postgres().await;
    db.alter_database("default_transaction_read_only = on")
        .await;
    let ro = db.second_store().await; // new sessions start read-only
    assert_unavailable("commit", ro.commit_batch(&[full_request("m-1")]).await);
    assert_unavailable(
        "commit_each",
        ro.commit_each(&[full_request("m-2")], None).await,
    );
    assert_unavailable("dead letter", ro.dead_letter_insert(&dead_letter()).await);
    assert_unavailable("mark", ro.outbox_mark_published_many(&[1]).await);
    assert_unavailable("ping (the store gate's probe)", ro.ping().await);
    db.alter_database("default_transaction_read_only = off")
        .await;
    ro.pool().close().await;
    let rw = db.second_store().await;
    assert_eq!(
        rw.commit_batch(&[full_request("m-1")]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );
    rw.pool().close().await;
    db.finish().await;
}

/// SQLite READONLY (8): the file opened read-only, as after a remount or a permission change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_sqlite_is_unavailable() {
    let db = TestDb::sqlite().await;
    let ro = Store::connect(&format!("{}?mode=ro", db.url), 2)
        .await
        .unwrap();
    assert_unavailable("commit", ro.commit_batch(&[full_request("m-1")]).await);
    assert_unavailable(
        "commit_each",
        ro.commit_each(&[full_request("m-2")], None).await,
    );
    assert_unavailable("dead letter", ro.dead_letter_insert(&dead_letter()).await);
    assert_unavailable("the store gate's write probe", ro.probe_write().await);
    ro.pool().close().await;
    db.finish().await;
}

/// Another process holding SQLite's write lock leaves reads answering: the store gate's
/// probe must be a write, or it reopens the gate at once and deliveries loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_probe_fails_while_another_process_holds_the_sqlite_write_lock() {
    use sqlx::Connection;
    let db = TestDb::sqlite().await;
    let mut holder = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut holder)
        .await
        .unwrap();
    db.store.ping().await.expect("reads still answer");
    assert_unavailable(
        "write probe behind a held lock",
        db.store.probe_write().await,
    );
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    db.store.probe_write().await.expect("the lock is gone");
    holder.close().await.unwrap();
    db.finish().await;
}

/// A role that lost its grants (42501) is the store's trouble, not the message's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_denied_is_unavailable() {
    let db = TestDb::postgres().await;
    let role = format!("carteiro_ro_{}", uuid::Uuid::now_v7().simple());
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"),
        format!("GRANT USAGE ON SCHEMA public TO {role}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(db.store.pool())
            .await
            .unwrap();
    }
    let url = db
        .url
        .replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    assert_ne!(url, db.url, "test URL must name the postgres user");
    let reader = Store::connect(&url, 2).await.unwrap();
    assert_unavailable("commit", reader.commit_batch(&[full_request("m-1")]).await);
    assert_unavailable(
        "dead letter",
        reader.dead_letter_insert(&dead_letter()).await,
    );
    reader.ping().await.expect("reads are granted");
    assert_unavailable("the store gate's write probe", reader.probe_write().await);
    reader.pool().close().await;
    db.finish().await;
    let admin = std::env::var(super::PG_ENV).unwrap();
    let admin = Store::connect(&admin, 1).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
        .execute(admin.pool())
        .await
        .unwrap();
}

/// `[store] statement_timeout` reaches the server (57014), and `lock_timeout` (55P03) is
/// classified the same: a commit stuck behind a lock fails as Unavailable, in bounded time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_and_lock_timeouts_are_unavailable() {
    let db = TestDb::postgres().await;
    let opts = StoreOptions {
        max_connections: 2,
        statement_timeout: Duration::from_millis(500),
    };
    let timed = Store::connect_with(&db.url, &opts).await.unwrap();
    let shown: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(timed.pool())
        .await
        .unwrap();
    assert_eq!(shown, "500ms");

    // Another session holds the inbox table exclusively.
    let mut locker = db.store.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    let started = Instant::now();
    unavailable_with(&timed, "m-1", "57014").await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    db.alter_database("lock_timeout = '200ms'").await;
    let locked = db.second_store().await;
    unavailable_with(&locked, "m-2", "55P03").await;
    locker.rollback().await.unwrap();

    assert_eq!(
        timed.commit_batch(&[full_request("m-1")]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );
    timed.pool().close().await;
    locked.pool().close().await;
    db.finish().await;
}

#[path = "../../../../tests/e2e/blackhole.rs"]
mod blackhole;
use blackhole::Blackhole;

/// The client-side bound: with the network blackholed, no statement timeout can fire on
/// the server, and a commit must still come back (Unavailable) within statement_timeout
/// plus the acquire timeout. Once the network is back, commits work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_database_cannot_hang_commits() {
    let db = TestDb::postgres().await;
    let (proxy, url) = Blackhole::in_front_of(&db.url).await;
    let opts = StoreOptions {
        max_connections: 2,
        statement_timeout: Duration::from_secs(1),
    };
    let store = Store::connect_with(&url, &opts).await.unwrap();
    assert_eq!(
        store.commit_batch(&[full_request("before")]).await.unwrap(),
        vec![CommitOutcome::Committed]
    );

    proxy.close();
    let bound = opts.statement_timeout + crate::store::ACQUIRE_TIMEOUT;
    let started = Instant::now();
    let commit = tokio::time::timeout(bound * 3, store.commit_batch(&[full_request("during")]))
        .await
        .expect("the commit came back");
    let took = started.elapsed();
    assert!(
        matches!(commit, Err(StoreError::Unavailable(_))),
        "{commit:?}"
    );
    assert!(took <= bound + Duration::from_secs(2), "{took:?}");
    let read = tokio::time::timeout(bound * 3, store.inbox_contains_many("r", &["x"]))
        .await
        .expect("the read came back");
    assert!(matches!(read, Err(StoreError::Unavailable(_))), "{read:?}");

    proxy.open();
    // The abandoned commit may or may not have committed (G2: its redelivery would meet
    // the inbox record); a fresh one goes through once the network is back.
    let again = tokio::time::timeout(bound * 6, async {
        loop {
            if let Ok(outcomes) = store.commit_batch(&[full_request("after")]).await {
                return outcomes;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("commits work again once the network is back");
    assert_eq!(again, vec![CommitOutcome::Committed]);
    store.pool().close().await;
    db.finish().await;
}
