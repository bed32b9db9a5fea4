//! Group commit under contention: optimistic kv versions plus re-run on Conflict must give
//! exactly one effect per delivery (G2), within one instance and across two.

use std::time::Duration;

use super::{TestDb, both_backends, event, read, request, write};
use crate::store::{CommitOutcome, CommitterHandle, GroupCommitter, Store};

both_backends!(thousand_increments, two_instances_increment, committer_wakes_relay_and_fails_whole_batch);

/// One delivery: read the counter, add one, commit; re-run the "handler" on Conflict.
async fn increment(store: Store, committer: CommitterHandle, id: String) -> u32 {
    let mut runs = 0;
    loop {
        runs += 1;
        let current = store.kv_get("ns", "counter").await.unwrap();
        let (value, version) = match current {
            Some(e) => (String::from_utf8(e.value).unwrap().parse::<u64>().unwrap(), Some(e.version)),
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
    (String::from_utf8(e.value).unwrap().parse().unwrap(), e.version)
}

async fn thousand_increments(db: &TestDb) {
    let committer = GroupCommitter::spawn(db.store.clone(), 32);
    let tasks: Vec<_> = (0..1000)
        .map(|i| tokio::spawn(increment(db.store.clone(), committer.clone(), format!("m-{i}"))))
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
    assert_eq!(committer.commit(again).await.unwrap(), CommitOutcome::Duplicate);
    assert_eq!(counter(&db.store).await.0, 1000);
}

async fn two_instances_increment(db: &TestDb) {
    // Two pools on one database, as two gateway processes would have.
    let other = db.second_store().await;
    let c1 = GroupCommitter::spawn(db.store.clone(), 16);
    let c2 = GroupCommitter::spawn(other.clone(), 16);
    let mut tasks = Vec::new();
    for i in 0..150 {
        tasks.push(tokio::spawn(increment(db.store.clone(), c1.clone(), format!("a-{i}"))));
        tasks.push(tokio::spawn(increment(other.clone(), c2.clone(), format!("b-{i}"))));
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
    assert_eq!(committer.commit(request("r", "no-events")).await.unwrap(), CommitOutcome::Committed);
    let mut req = request("r", "with-event");
    req.outbox = vec![event("rk", b"x")];
    assert_eq!(committer.commit(req).await.unwrap(), CommitOutcome::Committed);
    tokio::time::timeout(Duration::from_secs(5), wake.notified()).await.unwrap();

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
