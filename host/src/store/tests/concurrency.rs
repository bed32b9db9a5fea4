//! Group commit under contention: optimistic kv versions plus re-run on Conflict must give
//! exactly one effect per delivery (G2), within one instance and across two.
//!
//! All deliveries are spawned at once, but like the pipeline (bounded by prefetch) only
//! `IN_FLIGHT` run their handler at a time. Unbounded, every commit to the one hot key makes
//! every queued request stale and the test spends minutes on conflicts: optimistic versions
//! give about one commit per batch on a single hot key.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::{TestDb, both_backends, event, read, request, write};
use crate::store::{CommitOutcome, CommitterConfig, CommitterHandle, GroupCommitter, Store};

both_backends!(
    thousand_increments,
    two_instances_increment,
    committer_wakes_relay_and_fails_whole_batch
);

/// Deliveries handled at once, as a route's prefetch would allow.
const IN_FLIGHT: usize = 32;

/// One delivery: read the counter, add one, commit; re-run the "handler" on Conflict.
async fn increment(
    store: Store,
    committer: CommitterHandle,
    id: String,
    prefetch: Arc<Semaphore>,
) -> u32 {
    let _slot = prefetch.acquire_owned().await.unwrap();
    let mut runs = 0;
    loop {
        runs += 1;
        let current = store.kv_get("ns", "counter").await.unwrap();
        let (value, version) = match current {
            Some(e) => (
                String::from_utf8(e.value).unwrap().parse::<u64>().unwrap(),
                Some(e.version),
            ),
            None => (0, None),
        };
        let mut req = request("counter", &id);
        req.reads = vec![read("counter", version)];
        req.writes = vec![write("counter", Some((value + 1).to_string().as_bytes()))];
        match committer.commit(req).await.unwrap() {
            CommitOutcome::Committed => return runs,
            CommitOutcome::Conflict => continue,
            other => panic!("delivery {id}: unexpected {other:?}"),
        }
    }
}

async fn counter(store: &Store) -> (u64, i64) {
    let e = store.kv_get("ns", "counter").await.unwrap().unwrap();
    (
        String::from_utf8(e.value).unwrap().parse().unwrap(),
        e.version,
    )
}

async fn thousand_increments(db: &TestDb) {
    // Four batches commit at once: they must still serialise on the hot key.
    let committer = GroupCommitter::spawn_with(
        db.store.clone(),
        CommitterConfig {
            max_batch: 32,
            linger: Duration::ZERO,
            queue: 128,
            concurrency: 4,
        },
    );
    let prefetch = Arc::new(Semaphore::new(IN_FLIGHT));
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let id = format!("m-{i}");
            tokio::spawn(increment(
                db.store.clone(),
                committer.clone(),
                id,
                prefetch.clone(),
            ))
        })
        .collect();
    let mut runs = 0;
    for t in tasks {
        runs += t.await.unwrap();
    }
    assert_eq!(counter(&db.store).await, (1000, 1000));
    assert!(runs >= 1000);
    // Every delivery is recorded once; a redelivery is a Duplicate and changes nothing.
    assert!(db.store.inbox_contains("counter", "m-999").await.unwrap());
    let mut again = request("counter", "m-0");
    again.writes = vec![write("counter", Some(b"0"))];
    assert_eq!(
        committer.commit(again).await.unwrap(),
        CommitOutcome::Duplicate
    );
    assert_eq!(counter(&db.store).await.0, 1000);
}

async fn two_instances_increment(db: &TestDb) {
    // Two pools on one database, as two gateway processes would have.
    let other = db.second_store().await;
    let c1 = GroupCommitter::spawn(db.store.clone(), 16);
    let c2 = GroupCommitter::spawn(other.clone(), 16);
    let (p1, p2) = (
        Arc::new(Semaphore::new(IN_FLIGHT)),
        Arc::new(Semaphore::new(IN_FLIGHT)),
    );
    let mut tasks = Vec::new();
    for i in 0..150 {
        let (a, b) = (format!("a-{i}"), format!("b-{i}"));
        tasks.push(tokio::spawn(increment(
            db.store.clone(),
            c1.clone(),
            a,
            p1.clone(),
        )));
        tasks.push(tokio::spawn(increment(
            other.clone(),
            c2.clone(),
            b,
            p2.clone(),
        )));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(counter(&db.store).await, (300, 300));
    other.pool().close().await;
}

async fn committer_wakes_relay_and_fails_whole_batch(db: &TestDb) {
    let committer = GroupCommitter::spawn(db.store.clone(), 8);
    let wake = committer.outbox_committed();
    assert_eq!(
        committer.commit(request("r", "no-events")).await.unwrap(),
        CommitOutcome::Committed
    );
    let mut req = request("r", "with-event");
    req.outbox = vec![event("rk", b"x")];
    assert_eq!(
        committer.commit(req).await.unwrap(),
        CommitOutcome::Committed
    );
    tokio::time::timeout(Duration::from_secs(5), wake.notified())
        .await
        .unwrap();

    // A store that cannot commit fails every request of the batch, transiently.
    let broken = db.second_store().await;
    broken.pool().close().await;
    let committer = GroupCommitter::spawn(broken, 8);
    let (a, b) = tokio::join!(
        committer.commit(request("r", "a")),
        committer.commit(request("r", "b"))
    );
    assert!(a.unwrap_err().is_transient());
    assert!(b.unwrap_err().is_transient());
    assert!(!db.store.inbox_contains("r", "a").await.unwrap());
}
