//! The set-based fast path must decide exactly what the savepoint path decides. Random
//! batches over a few hot keys (stale and fresh reads, creates, deletes, duplicate inbox
//! keys) go through both paths — each in its own route and namespace of one database — and
//! every outcome, kv row (tombstones included) and outbox count must match.

use super::{TestDb, both_backends, event, read, write};
use crate::store::{CommitRequest, Store};

both_backends!(fast_path_matches_savepoint_path);

/// xorshift64: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

const KEYS: [&str; 4] = ["a", "b", "c", "d"];

fn random_request(rng: &mut Rng, n: usize) -> CommitRequest {
    let mut req = super::request("route", &format!("m-{}", rng.below(n as u64 * 2)));
    for _ in 0..rng.below(3) {
        let key = KEYS[rng.below(4) as usize];
        let observed = match rng.below(4) {
            0 => None,
            v => Some(v as i64),
        };
        req.reads.push(read(key, observed));
    }
    for _ in 0..rng.below(3) {
        let key = KEYS[rng.below(4) as usize];
        let value = match rng.below(4) {
            0 => None,
            1 => Some(Vec::new()), // live but empty: must not turn into a tombstone
            _ => Some(vec![b'0' + rng.below(10) as u8]),
        };
        req.writes.push(write(key, value.as_deref()));
    }
    for _ in 0..rng.below(2) {
        req.outbox.push(event("k", b"e"));
    }
    req
}

/// The same request in another route and namespace, with fresh event ids.
fn renamed(req: &CommitRequest, tag: &str) -> CommitRequest {
    let mut out = req.clone();
    out.route = format!("{}-{tag}", req.route);
    out.namespace = format!("{}-{tag}", req.namespace);
    for e in &mut out.outbox {
        e.event_id = uuid::Uuid::now_v7().to_string();
        e.route = out.route.clone();
    }
    out
}

async fn kv_rows(store: &Store, namespace: &str) -> Vec<(String, Option<Vec<u8>>, i64)> {
    sqlx::query_as("SELECT key, value, version FROM kv WHERE namespace = $1 ORDER BY key")
        .bind(namespace)
        .fetch_all(store.pool())
        .await
        .unwrap()
}

async fn outbox_count(store: &Store, route: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM outbox WHERE route = $1")
        .bind(route)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

async fn fast_path_matches_savepoint_path(db: &TestDb) {
    let s = &db.store;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut outcomes_seen = std::collections::BTreeSet::new();
    for round in 0..60 {
        let n = 1 + rng.below(12) as usize;
        let batch: Vec<CommitRequest> = (0..n).map(|_| random_request(&mut rng, n)).collect();
        let fast: Vec<_> = batch.iter().map(|r| renamed(r, "fast")).collect();
        let slow: Vec<_> = batch.iter().map(|r| renamed(r, "slow")).collect();
        let fast_outcomes = match s.commit_set(&fast, None).await {
            Ok(o) => o.outcomes,
            Err(_) => panic!("round {round}: the fast path fell back on {fast:?}"),
        };
        let slow_outcomes = s.commit_each(&slow, None).await.unwrap().outcomes;
        assert_eq!(fast_outcomes, slow_outcomes, "round {round}: {batch:?}");
        assert_eq!(
            kv_rows(s, "ns-fast").await,
            kv_rows(s, "ns-slow").await,
            "round {round}: {batch:?}"
        );
        for o in fast_outcomes {
            outcomes_seen.insert(format!("{o:?}"));
        }
    }
    assert_eq!(
        outbox_count(s, "route-fast").await,
        outbox_count(s, "route-slow").await
    );
    // The random batches did exercise every decision.
    for kind in ["Committed", "Duplicate", "Conflict"] {
        assert!(
            outcomes_seen.contains(kind),
            "{kind} never happened: {outcomes_seen:?}"
        );
    }
}
