//! Immediate dispatch on the store's side: rows a commit hands to the in-process relay are
//! leased to its session in their own transaction, so no other relay can claim them; a key
//! with an earlier unpublished row goes to the table; a rolled-back request hands nothing;
//! closing the hand-off waits for the commits leasing to it.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::{TestDb, both_backends, event, request};
use crate::store::commit::Committed;
use crate::store::commit::handoff::{HandoffLease, handed_rows};
use crate::store::{CommitOutcome, CommitRequest, GroupCommitter, Handoff, NewOutboxRow, Room};

both_backends!(
    handed_rows_are_leased_to_the_session_in_their_commit,
    a_key_with_an_earlier_unpublished_row_goes_to_the_table,
    a_rolled_back_request_hands_nothing,
);

const LEASE: HandoffLease<'static> = HandoffLease {
    owner: "relay-here",
    lease_ms: 60_000,
};

fn room(max_rows: usize) -> Room {
    Room {
        window: Arc::default(),
        bytes: Arc::default(),
        queued: Arc::default(),
        max_rows,
        max_bytes: 1 << 20,
    }
}

fn emitting(key: &str, events: Vec<NewOutboxRow>) -> CommitRequest {
    let mut req = request("orders", key);
    req.outbox = events;
    req
}

/// The routing keys of the rows `committed` handed over, in id order.
fn routing_keys(committed: &Committed, batch: &[CommitRequest]) -> Vec<String> {
    handed_rows(&committed.handed, committed.at, batch.to_vec())
        .into_iter()
        .map(|r| r.event.routing_key)
        .collect()
}

fn keyed(routing_key: &str, ordering_key: &str) -> NewOutboxRow {
    let mut e = event(routing_key, b"p");
    e.ordering_key = ordering_key.into();
    e
}

async fn handed_rows_are_leased_to_the_session_in_their_commit(db: &TestDb) {
    let s = &db.store;
    let committer = GroupCommitter::spawn(s.clone(), 16);
    let handoff = committer.handoff();
    let mut rows = handoff
        .open(LEASE.owner, Duration::from_secs(60), room(100))
        .await;
    let events = vec![keyed("a", "q/m-1"), keyed("b", "q/m-1"), event("c", b"u")];
    let outcome = committer
        .commit(emitting("m-1", events.clone()))
        .await
        .unwrap();
    assert_eq!(outcome, CommitOutcome::Committed);
    let handed = tokio::time::timeout(Duration::from_secs(5), rows.recv())
        .await
        .expect("handed over at once")
        .expect("open");
    let got: Vec<_> = handed.rows.iter().map(|r| r.event.clone()).collect();
    assert_eq!(got, events, "every row, verbatim, in id order");
    assert!(handed.rows.windows(2).all(|w| w[0].id < w[1].id));

    // Leased to the session: another relay claims none of them, and they count as in flight.
    assert!(
        s.outbox_pending(10, "relay-other", 60_000)
            .await
            .unwrap()
            .is_empty()
    );
    let status = s.outbox_status().await.unwrap();
    assert_eq!((status.pending, status.leased), (3, 3));
    let ids: Vec<i64> = handed.rows.iter().map(|r| r.id).collect();
    assert_eq!(s.outbox_mark_published_many(&ids).await.unwrap(), 3);
    assert_eq!(s.outbox_status().await.unwrap().pending, 0);

    // Closed: the next commit's rows go to the table, for any relay to claim.
    handoff.close(LEASE.owner).await;
    committer
        .commit(emitting("m-2", vec![event("d", b"t")]))
        .await
        .unwrap();
    assert!(rows.try_recv().is_err(), "nothing handed after closing");
    assert_eq!(
        s.outbox_pending(10, "relay-other", 60_000)
            .await
            .unwrap()
            .len(),
        1
    );
}

async fn a_key_with_an_earlier_unpublished_row_goes_to_the_table(db: &TestDb) {
    let s = &db.store;
    // Waiting in the table (a parked or backed-off row would hold its key the same way).
    s.commit_batch(&[emitting("m-1", vec![keyed("first", "k")])])
        .await
        .unwrap();
    let batch = [emitting(
        "m-2",
        vec![
            keyed("second", "k"),
            keyed("other", "j"),
            event("loose", b"u"),
        ],
    )];
    let committed = s.commit_handing(&batch, Some(LEASE)).await.unwrap();
    assert_eq!(
        routing_keys(&committed, &batch),
        ["other", "loose"],
        "keys with nothing waiting"
    );
    assert_eq!(committed.unleased, 1);
    // Key k's rows are claimed in order, behind each other, by whoever claims.
    let claimed = s.outbox_pending(10, "relay-other", 60_000).await.unwrap();
    let claimed: Vec<&str> = claimed
        .iter()
        .map(|r| r.event.routing_key.as_str())
        .collect();
    assert_eq!(claimed, ["first", "second"]);
}

async fn a_rolled_back_request_hands_nothing(db: &TestDb) {
    let s = &db.store;
    s.commit_batch(&[request("orders", "m-1")]).await.unwrap();
    let batch = [
        emitting("m-1", vec![event("duplicate", b"d")]),
        emitting("m-2", vec![event("fresh", b"f")]),
    ];
    // The savepoint path, where a request is undone inside the transaction.
    let committed = s.commit_each(&batch, Some(LEASE)).await.unwrap();
    assert_eq!(
        committed.outcomes,
        [CommitOutcome::Duplicate, CommitOutcome::Committed]
    );
    assert_eq!(routing_keys(&committed, &batch), ["fresh"]);
    assert_eq!(s.outbox_status().await.unwrap().pending, 1);
}

#[tokio::test]
async fn closing_waits_for_the_commits_leasing_to_the_session() {
    let handoff = Handoff::default();
    let _rows = handoff
        .open("relay-a", Duration::from_secs(30), room(10))
        .await;
    let permit = handoff.permit(1).expect("open, with room");
    let closing = tokio::spawn({
        let handoff = handoff.clone();
        async move { handoff.close("relay-a").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!closing.is_finished(), "a commit still leases to relay-a");
    assert!(
        handoff.permit(1).is_none(),
        "a closing session takes no new commit"
    );
    drop(permit);
    tokio::time::timeout(Duration::from_secs(5), closing)
        .await
        .expect("closed once the commit is done")
        .unwrap();
    assert!(handoff.permit(1).is_none(), "closed");
}

#[tokio::test]
async fn a_full_session_takes_no_more_and_an_old_owner_cannot_close_a_new_one() {
    let handoff = Handoff::default();
    let full = room(10);
    full.window.store(8, std::sync::atomic::Ordering::Relaxed);
    let _a = handoff.open("relay-a", Duration::from_secs(30), full).await;
    assert!(handoff.permit(2).is_some(), "8 + 2 fit in 10");
    assert!(handoff.permit(3).is_none(), "8 + 3 do not: to the table");
    let queued = Arc::new(AtomicUsize::new(0));
    let _b = handoff
        .open(
            "relay-b",
            Duration::from_secs(30),
            Room { queued, ..room(10) },
        )
        .await;
    handoff.close("relay-a").await;
    assert!(handoff.permit(1).is_some(), "relay-b's hand-off stays open");
}
