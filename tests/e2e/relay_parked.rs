//! Rows AMQP can never carry (a content type over 255 bytes, which the relay refuses; a
//! routing key over 255 bytes, which the publisher refuses), polled on SQLite and PostgreSQL
//! and read from the slot: each is parked with its error and attempts counted, once; a keyed
//! one holds its own key's later rows; everything else, unordered rows first of all, is
//! published once.

use crate::support::{
    Client, RelayTask, amqp_url, load_config, message_id, migrated_store, pg_database, receive,
    run_relay, seed_request, spawn_relay, sqlite_url, unique, wait_for,
};
use carteiro::metrics::Metrics;
use carteiro::store::{CommitRequest, Store};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);
/// Published: six unordered rows, K/0 and L/0..2.
const GOOD: usize = 10;

/// The rows, in commit order, one commit each: good and bad, unordered and keyed.
fn rows(exchange: &str) -> Vec<CommitRequest> {
    let long = "x".repeat(300);
    let bad_content_type = |key: &str, seq: usize| {
        let mut r = seed_request(exchange, key, seq);
        r.outbox[0].content_type = Some(long.clone());
        r
    };
    let bad_routing_key = |key: &str, seq: usize| {
        let mut r = seed_request(exchange, key, seq);
        r.outbox[0].routing_key = long.clone();
        r
    };
    vec![
        seed_request(exchange, "", 0),
        seed_request(exchange, "K", 0),
        bad_content_type("", 100),
        seed_request(exchange, "", 1),
        bad_content_type("K", 1),
        seed_request(exchange, "", 2),
        seed_request(exchange, "L", 0),
        bad_routing_key("", 101),
        seed_request(exchange, "", 3),
        seed_request(exchange, "K", 2),
        seed_request(exchange, "", 4),
        seed_request(exchange, "L", 1),
        seed_request(exchange, "", 5),
        seed_request(exchange, "L", 2),
    ]
}

async fn outbox_row(reader: &sqlx::AnyPool, payload: &str) -> (i64, Option<String>, bool) {
    let (attempts, error, published): (i64, Option<String>, Option<i64>) =
        sqlx::query_as("SELECT attempts, last_error, published_at FROM outbox WHERE payload = $1")
            .bind(payload.as_bytes().to_vec())
            .fetch_one(reader)
            .await
            .expect("outbox row");
    (attempts, error, published.is_some())
}

/// Seeds the rows for `relay` (running on `store`) and checks the outcome.
async fn parks_only_what_it_must(store_url: &str, store: &Store, relay: RelayTask) {
    let client = Client::connect().await;
    let exchange = unique("parked");
    let sink = client.sink(&exchange).await;
    store.commit_batch(&rows(&exchange)).await.expect("seed");
    let got = receive(&client, &sink, GOOD, WAIT).await;

    sqlx::any::install_default_drivers();
    let reader = sqlx::AnyPool::connect(store_url).await.expect("reader");
    for bad in ["/100", "K/1", "/101"] {
        let (attempts, error) = wait_for(&format!("{bad} parked with its error"), WAIT, || async {
            let (attempts, error, published) = outbox_row(&reader, bad).await;
            assert!(!published, "{bad} can never be published");
            error.map(|e| (attempts, e))
        })
        .await;
        assert!(error.contains("cannot be published"), "{bad}: {error}");
        assert_eq!(attempts, 1, "{bad}: parked at its first attempt");
    }
    // Nothing loops and nothing more goes out: K/2 waits behind K/1.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut all = got;
    all.extend(client.drain(&sink).await);
    let payloads: Vec<String> = all
        .iter()
        .map(|m| String::from_utf8_lossy(&m.delivery.data).into_owned())
        .collect();
    let mut expected: Vec<String> = (0..6).map(|i| format!("/{i}")).collect();
    expected.extend(["K/0", "L/0", "L/1", "L/2"].map(String::from));
    let mut sorted = payloads.clone();
    sorted.sort();
    expected.sort();
    assert_eq!(
        sorted, expected,
        "every good row once, K/2 held: {payloads:?}"
    );
    let ids: HashSet<String> = all.iter().map(message_id).collect();
    assert_eq!(ids.len(), GOOD);
    for bad in ["/100", "K/1", "/101"] {
        assert_eq!(outbox_row(&reader, bad).await.0, 1, "{bad}: not retried");
    }
    assert!(!outbox_row(&reader, "K/2").await.2, "K/2 held behind K/1");
    reader.close().await;
    relay.0.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), relay.1).await;
}

fn poll_config(dir: &std::path::Path, store_url: &str) -> carteiro::config::Config {
    load_config(
        dir,
        &format!(
            "version = 1\n[broker]\nurl = \"{}\"\n[store]\nurl = \"{store_url}\"\n[relay]\npoll_interval = \"100ms\"\n",
            amqp_url()
        ),
    )
}

async fn polled(store_url: &str) {
    let store = migrated_store(store_url).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = poll_config(dir.path(), store_url);
    let relay = spawn_relay(&config, store.clone());
    parks_only_what_it_must(store_url, &store, relay).await;
}

#[tokio::test]
async fn unpublishable_rows_are_parked_and_hold_only_their_key_polled_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    polled(&sqlite_url(dir.path())).await;
}

/// REL-10: on PostgreSQL the park overflowed `bigint`, so the row was never parked and the
/// relay's session restarted for ever.
#[tokio::test]
async fn unpublishable_rows_are_parked_and_hold_only_their_key_polled_on_postgres() {
    polled(&pg_database().await).await;
}

/// The CDC relay parked every unordered row behind an unpublishable one.
#[tokio::test]
async fn unpublishable_rows_are_parked_and_hold_only_their_key_read_from_the_slot() {
    let url = pg_database().await;
    let store = migrated_store(&url).await;
    let slot = format!("e2e_parked_{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().expect("tempdir");
    let config = load_config(
        dir.path(),
        &format!(
            "version = 1\n[broker]\nurl = \"{}\"\n[store]\nurl = \"{url}\"\n[relay]\nmode = \"cdc\"\nslot = \"{slot}\"\npublication = \"{slot}\"\n",
            amqp_url()
        ),
    );
    let metrics = Arc::new(Metrics::default());
    let relay = run_relay(carteiro::relay::Relay::new(
        &config.broker,
        &config.relay,
        &config.store.url,
        store.clone(),
        metrics.clone(),
        None,
    ));
    // Rows committed from now on come through the slot, not the start's backlog drain.
    crate::cdc::wait_active(&metrics).await;
    parks_only_what_it_must(&url, &store, relay).await;
    crate::cdc::drop_slot(&url, &slot).await;
}
