//! The CDC relay as a separate `carteiro relay` process: its memory stays within the window
//! whatever a transaction's size, and once paused (SIGSTOP) past a takeover it publishes
//! nothing after it resumes, since the slot is no longer read through its connection.

use crate::blackhole::Blackhole;
use crate::cdc::{drop_slot, slot_reader, wait_active};
use crate::resilience::hostile::{peak_rss, signal};
use crate::resilience::{Running, carteiro};
use crate::support::{
    Client, amqp_url, load_config, migrated_store, pg_database, receive, run_relay, seed_request,
    unique, wait_for, wait_published,
};
use carteiro::metrics::Metrics;
use carteiro::store::{CommitRequest, Store};
use sqlx::Connection;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

/// A CDC relay's config on `slot` of the database at `url` (written to `dir/carteiro.toml`).
fn cdc_toml(url: &str, slot: &str, extra: &str) -> String {
    format!(
        "version = 1\n[broker]\nurl = \"{}\"\nreconnect_max_backoff = \"1s\"\n[store]\nurl = \"{url}\"\n[relay]\nmode = \"cdc\"\nslot = \"{slot}\"\npublication = \"{slot}\"\n{extra}",
        amqp_url()
    )
}

/// Writes `config` to `dir/carteiro.toml`, starts `carteiro relay` on it and waits until it
/// reads `slot` of the database at `url`.
async fn relay_process(dir: &std::path::Path, config: &str, url: &str, slot: &str) -> Running {
    std::fs::write(dir.join("carteiro.toml"), config).expect("config");
    let mut cmd = carteiro();
    cmd.args(["relay", "-c"]).arg(dir.join("carteiro.toml"));
    let mut relay = Running::spawn(cmd);
    relay.wait_stderr("CDC relay active", WAIT).await;
    wait_for("the slot read by the relay", WAIT, || async {
        slot_reader(url, slot).await
    })
    .await;
    relay
}

/// One commit of `rows` rows of `size` bytes each, one ordering key per row.
fn one_big_commit(exchange: &str, rows: usize, size: usize) -> CommitRequest {
    let mut request = seed_request(exchange, "big-0", 0);
    request.outbox = (0..rows)
        .map(|i| {
            let mut row = seed_request(exchange, &format!("big-{i}"), 0)
                .outbox
                .remove(0);
            row.payload = vec![b'x'; size];
            row
        })
        .collect();
    request
}

/// The audit's case: one commit of 160 rows of 512 KiB against a 1 MiB window grew the
/// relay by 153 MiB, the whole transaction held in memory before any row went out.
#[tokio::test]
async fn a_transaction_larger_than_the_window_is_held_no_more_than_the_window() {
    const ROWS: usize = 160;
    const SIZE: usize = 512 << 10;
    const WINDOW: u64 = 1 << 20;
    /// The replication client's read-ahead (2 rows, 1 MiB each as pgoutput's hex text),
    /// the copies a publish makes, and what the allocator keeps: 13–14 MiB measured.
    const SLACK: u64 = 16 << 20;
    let client = Client::connect().await;
    let exchange = unique("cdc-big");
    let sink = client.sink(&exchange).await;
    let url = pg_database().await;
    let store = migrated_store(&url).await;
    let slot = format!("e2e_big_{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().expect("tempdir");
    let config = cdc_toml(&url, &slot, "max_in_flight_bytes = \"1MiB\"\n");
    let relay = relay_process(dir.path(), &config, &url, &slot).await;
    // Settled after start-up: the backlog drain, the first slot reads.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = peak_rss(relay.pid());
    store
        .commit_batch(&[one_big_commit(&exchange, ROWS, SIZE)])
        .await
        .expect("one big commit");
    wait_published("the big commit published", &store, WAIT).await;
    let grew = peak_rss(relay.pid()).saturating_sub(before);
    let arrived = receive(&client, &sink, ROWS, WAIT).await.len();
    relay.kill().await;
    drop_slot(&url, &slot).await;
    assert_eq!(arrived, ROWS);
    eprintln!("peak RSS grew by {:.1} MiB", grew as f64 / (1 << 20) as f64);
    assert!(
        grew <= WINDOW + SLACK,
        "the relay's peak RSS grew by {:.1} MiB for a 1 MiB window",
        grew as f64 / (1 << 20) as f64
    );
}

/// The audit's case: a relay paused (SIGSTOP) past the takeover, then resumed, published a
/// row that the new reader had published and marked already. Here the paused relay holds a
/// row it failed to publish (unroutable) and waits to retry it. Its database connections run
/// through a blackholed proxy, so on resuming it cannot learn from the stream that the
/// server ended its walsender: only the fence can stop the retry. The new reader publishes
/// and marks the row once a queue is bound; the resumed relay must not send it again.
#[tokio::test]
async fn a_relay_resumed_after_a_takeover_publishes_nothing() {
    let client = Client::connect().await;
    let exchange = client.unbound_exchange("cdc-fence", true).await;
    let url = pg_database().await;
    let store = migrated_store(&url).await;
    let slot = format!("e2e_fence_{}", uuid::Uuid::now_v7().simple());
    let (hole, proxied) = Blackhole::in_front_of(&url).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = cdc_toml(&proxied, &slot, "");
    let paused = relay_process(dir.path(), &config, &url, &slot).await;
    let standby_metrics = Arc::new(Metrics::default());
    let standby_dir = tempfile::tempdir().expect("tempdir");
    let config = load_config(standby_dir.path(), &cdc_toml(&url, &slot, ""));
    let standby = run_relay(carteiro::relay::Relay::new(
        &config.broker,
        &config.relay,
        &config.store.url,
        Store::connect(&url, 4).await.expect("store"),
        standby_metrics.clone(),
        None,
    ));

    store
        .commit_batch(&[seed_request(&exchange, "K", 0)])
        .await
        .expect("seed");
    wait_for("the row returned to the first relay", WAIT, || async {
        (store.outbox_status().await.ok()?.with_errors == 1).then_some(())
    })
    .await;
    signal(paused.pid(), "STOP");
    hole.close();
    // The server lets the slot go (as wal_sender_timeout would, later).
    let reader = slot_reader(&url, &slot)
        .await
        .expect("the paused relay's walsender");
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("pg");
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(i32::try_from(reader).expect("a pid"))
        .execute(&mut conn)
        .await
        .expect("terminate the walsender");
    wait_active(&standby_metrics).await;
    let sink = unique("sink");
    client.durable_queue(&sink).await;
    client.bind(&sink, &exchange, "#").await;
    wait_published("the row published by the new reader", &store, WAIT).await;
    let first = receive(&client, &sink, 1, WAIT).await;
    assert_eq!(first.len(), 1);

    signal(paused.pid(), "CONT");
    // Its retry was due a second after the failure: it runs as soon as the process resumes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let again = client.drain(&sink).await;
    let stopped = paused.kill().await;
    hole.open();
    standby.0.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), standby.1).await;
    drop_slot(&url, &slot).await;
    assert!(
        again.is_empty(),
        "the resumed relay sent the row again ({} copies); its log:\n{}",
        again.len(),
        stopped.stderr
    );
}
