//! Immediate dispatch (G3): the rows a commit writes go to the in-process relay in memory,
//! leased to its session in their own transaction. Beside a second relay polling the same
//! store every 100 ms (both with a window of 1,024 rows):
//! - rows of keys with nothing waiting (a delivery's own key, as the pipeline writes them)
//!   all go straight from their commit, and the other relay never gets one;
//! - rows of a key whose earlier rows are still unpublished go through the table, in order;
//! - when the in-process relay stops mid-stream, the rows it was handed and had not
//!   published go back to the table and the other relay publishes them.
//!
//! Every row is published exactly once and in key order.

use crate::support::{
    Client, amqp_url, assert_once_in_key_order, load_config, migrated_store, pg_database, receive,
    run_relay, seed_request, spawn_relay, sqlite_url, stop_relay, unique,
};
use carteiro::metrics::Metrics;
use carteiro::relay::Relay;
use carteiro::store::{CommitOutcome, GroupCommitter};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);
/// Requests of a key of their own, then requests sharing `KEYS` keys.
const OWN_KEYS: usize = 400;
const KEYS: usize = 40;
const ROWS: usize = 1_600;

async fn beside_a_polling_relay(store_url: &str) {
    let client = Client::connect().await;
    let exchange = unique("immediate");
    let sink = client.sink(&exchange).await;
    let store = migrated_store(store_url).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = load_config(
        dir.path(),
        &format!(
            "version = 1\n[broker]\nurl = \"{}\"\n[store]\nurl = \"{store_url}\"\n[relay]\npoll_interval = \"100ms\"\nmax_in_flight = 1024\n",
            amqp_url()
        ),
    );
    let committer = GroupCommitter::spawn(store.clone(), 64);
    let metrics = Arc::new(Metrics::default());
    let here = Relay::new(
        &config.broker,
        &config.relay,
        store_url,
        store.clone(),
        metrics.clone(),
        Some(committer.outbox_committed()),
    )
    .with_handoff(committer.handoff(), &config.relay);
    let here = run_relay(here);
    let other = spawn_relay(&config, migrated_store(store_url).await);
    // Let both sessions start, so the first commits are handed over.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Each request is one row of a key, `key/seq`; commits run 32 at a time.
    let commit_range = |range: std::ops::Range<usize>, keys: usize| {
        let committer = committer.clone();
        let exchange = exchange.clone();
        async move {
            let mut rows = range.into_iter();
            loop {
                let chunk: Vec<usize> = rows.by_ref().take(32).collect();
                if chunk.is_empty() {
                    break;
                }
                let commits = chunk.iter().map(|i| {
                    let req =
                        seed_request(&exchange, &format!("key-{}-{}", keys, i % keys), i / keys);
                    let committer = committer.clone();
                    async move { committer.commit(req).await.expect("commit") }
                });
                for outcome in futures::future::join_all(commits).await {
                    assert_eq!(outcome, CommitOutcome::Committed);
                }
            }
        }
    };
    commit_range(0..OWN_KEYS, OWN_KEYS).await;
    let mut first = receive(&client, &sink, OWN_KEYS, WAIT).await;
    let (handed, claimed) = (metrics.outbox.handed.get(), metrics.outbox.claimed.get());
    assert_eq!(
        (handed, claimed),
        (OWN_KEYS as u64, 0),
        "rows of keys with nothing waiting all go straight from their commit (handed, claimed)"
    );
    commit_range(0..ROWS / 2, KEYS).await;
    first.extend(receive(&client, &sink, ROWS / 2, WAIT).await);
    assert!(
        metrics.outbox.claimed.get() > 0,
        "a key's rows behind unpublished ones go through the table"
    );
    // Stop the in-process relay while rows are being handed to it: what it holds goes back.
    let rest = tokio::spawn(commit_range(ROWS / 2..ROWS, KEYS));
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop_relay(here).await;
    rest.await.expect("commits");
    let mut all = first;
    all.extend(receive(&client, &sink, OWN_KEYS + ROWS - all.len(), WAIT).await);
    // Anything published twice would arrive meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    all.extend(client.drain(&sink).await);
    stop_relay(other).await;

    assert_once_in_key_order(&all, OWN_KEYS + ROWS);
    assert_eq!(store.outbox_status().await.expect("status").pending, 0);
}

#[tokio::test]
async fn immediate_dispatch_beside_a_polling_relay_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    beside_a_polling_relay(&sqlite_url(dir.path())).await;
}

#[tokio::test]
async fn immediate_dispatch_beside_a_polling_relay_on_postgres() {
    beside_a_polling_relay(&pg_database().await).await;
}
