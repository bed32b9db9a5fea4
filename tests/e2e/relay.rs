//! G3 end to end: the relay publishes every committed row with its event id as message_id,
//! marks rows only after their confirm, survives SIGKILL and broker outages, reports
//! unroutable rows, and two relays on PostgreSQL share one table without duplicates.

use crate::support::{
    Client, Gateway, amqp_url, assert_applied_once, assert_once_in_key_order, crash_at_fault,
    load_config, message_id, migrated_store, pg_database, plugin_route, receive, seed_outbox,
    seed_request, spawn_relay, sqlite_config_head, sqlite_url, stop_relay, unique, wait_for,
    wait_published,
};
use carteiro::metrics::Metrics;
use carteiro::store::Store;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

fn relay_config(dir: &std::path::Path, store_url: &str, amqp: &str) -> carteiro::config::Config {
    load_config(
        dir,
        &format!(
            "version = 1\n[broker]\nurl = \"{amqp}\"\n[store]\nurl = \"{store_url}\"\n[relay]\npoll_interval = \"100ms\"\nmax_in_flight = 128\n"
        ),
    )
}

#[tokio::test]
async fn two_relays_on_postgres_publish_each_row_once_in_key_order() {
    let client = Client::connect().await;
    let exchange = unique("out");
    let sink = client.sink(&exchange).await;
    let url = pg_database().await;
    let store = Store::connect(&url, 8).await.expect("store");
    store.migrate().await.expect("migrate");
    seed_outbox(&store, &exchange, 50, 10_000).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = relay_config(dir.path(), &url, &amqp_url());
    let a = spawn_relay(&config, store.clone());
    let b = spawn_relay(&config, Store::connect(&url, 8).await.expect("store"));
    let all = receive(&client, &sink, 10_000, WAIT).await;
    stop_relay(a).await;
    stop_relay(b).await;

    assert_once_in_key_order(&all, 10_000);
    assert_eq!(store.outbox_status().await.expect("status").pending, 0);
}

#[tokio::test]
async fn rows_wait_for_an_unroutable_destination_with_a_clear_error() {
    let client = Client::connect().await;
    let exchange = client.unbound_exchange("nobody-bound", false).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = sqlite_url(dir.path());
    let store = migrated_store(&url).await;
    seed_outbox(&store, &exchange, 1, 1).await;
    let relay = spawn_relay(&relay_config(dir.path(), &url, &amqp_url()), store.clone());
    let status = wait_for("the row marked failed", WAIT, || async {
        let status = store.outbox_status().await.ok()?;
        (status.with_errors == 1).then_some(status)
    })
    .await;
    stop_relay(relay).await;
    assert_eq!(status.pending, 1, "an unroutable row stays pending");
    let pool = sqlx::SqlitePool::connect(&url).await.expect("sqlite");
    let (error, attempts): (String, i64) =
        sqlx::query_as("SELECT last_error, attempts FROM outbox")
            .fetch_one(&pool)
            .await
            .expect("row");
    assert!(error.contains("unroutable"), "{error}");
    assert!(attempts >= 1);
}

#[tokio::test]
async fn chained_gateways_deliver_every_event_and_absorb_a_relay_crash() {
    let client = Client::connect().await;
    let input = unique("in");
    let events = unique("events");
    let upstream_q = unique("upstream");
    let downstream_q = unique("downstream");
    client.sink(&input).await;
    let tap = client.sink(&events).await;
    let toml = |relay_enabled: bool| {
        let upstream = format!("out_exchange = \"{events}\"");
        let downstream = format!("out_exchange = \"{input}-unused\"");
        sqlite_config_head("")
            + &format!("[relay]\nenabled = {relay_enabled}\npoll_interval = \"100ms\"")
            + &plugin_route("upstream", "counter", &upstream, &upstream_q, &input)
            + &plugin_route("downstream", "counter", &downstream, &downstream_q, &events)
    };
    client.sink(&format!("{input}-unused")).await;

    // 1. Upstream commits five events; no relay runs yet.
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Gateway::start_in(dir, &toml(false), Arc::new(Metrics::default())).await;
    client.wait_for_consumer(&upstream_q).await;
    client.publish_numbered(&input, "up", 5, b"{}").await;
    wait_for("five outbox rows", WAIT, || async {
        (first.store.outbox_status().await.ok()?.pending == 5).then_some(())
    })
    .await;
    let dir = first.stop().await;

    // 2. A standalone relay publishes a row, gets its confirm, and is SIGKILLed before marking it.
    let config_path = dir.path().join("carteiro.toml");
    std::fs::write(
        &config_path,
        toml(true).replace("{dir}", &dir.path().display().to_string()),
    )
    .expect("config");
    crash_at_fault("relay", &config_path, "relay-hang-after-confirm");

    // 3. The full gateway: its relay republishes (same message_id), the downstream inbox absorbs it.
    let second = Gateway::start_in(dir, &toml(true), Arc::new(Metrics::default())).await;
    // The killed relay's leases expire (30 s) before its rows are taken again.
    wait_published("every row marked published", &second.store, WAIT).await;
    let runs = wait_for("downstream processed five events", WAIT, || async {
        let entry = second.store.kv_get("downstream", "runs").await.ok()??;
        let runs: i64 = String::from_utf8(entry.value).ok()?.parse().ok()?;
        (runs >= 5).then_some(runs)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tapped = client.drain(&tap).await;
    let ids: Vec<String> = tapped.iter().map(message_id).collect();
    let unique_ids: HashSet<&String> = ids.iter().collect();
    assert_eq!(unique_ids.len(), 5, "every event arrived: {ids:?}");
    assert!(
        ids.len() > 5,
        "the crashed relay's confirmed row was republished: {ids:?}"
    );
    assert_eq!(runs, 5, "the downstream inbox absorbed the duplicate");
    for id in unique_ids {
        assert_applied_once(&second.store, "downstream", id).await;
    }
    assert_eq!(
        second.store.outbox_status().await.expect("status").pending,
        0
    );
    second.stop().await;
}

/// Rows `key/0..n` of one ordering key; row `key/fail_at` goes to `bad_exchange`.
fn chain_rows(
    key: &str,
    n: usize,
    exchange: &str,
    fail_at: Option<(usize, &str)>,
) -> Vec<carteiro::store::CommitRequest> {
    (0..n)
        .map(|i| {
            let target = match fail_at {
                Some((at, bad)) if at == i => bad,
                _ => exchange,
            };
            seed_request(target, key, i)
        })
        .collect()
}

/// Payloads of `key` in arrival order.
fn arrivals_of(all: &[lapin::message::BasicGetMessage], key: &str) -> Vec<usize> {
    all.iter()
        .filter_map(|m| {
            let text = String::from_utf8(m.delivery.data.clone()).ok()?;
            let (k, seq) = text.split_once('/')?;
            (k == key).then(|| seq.parse().ok()).flatten()
        })
        .collect()
}

/// A row that fails in the middle of a key's chain (while later rows of that key are
/// already leased behind it) holds back every later row of its key until it is published;
/// other keys are not held up.
async fn failure_mid_chain_keeps_key_order(store_url: &str) {
    let client = Client::connect().await;
    let exchange = unique("out");
    let sink = client.sink(&exchange).await;
    let unbound = client.unbound_exchange("unbound", true).await;
    let store = migrated_store(store_url).await;
    // Interleaved like real traffic: K's rows between other keys' rows.
    let mut rows = Vec::new();
    let k = chain_rows("K", 40, &exchange, Some((5, &unbound)));
    let others: Vec<_> = (0..4)
        .map(|o| chain_rows(&format!("O{o}"), 40, &exchange, None))
        .collect();
    for i in 0..40 {
        rows.push(k[i].clone());
        rows.extend(others.iter().map(|o| o[i].clone()));
    }
    for batch in rows.chunks(50) {
        store.commit_batch(batch).await.expect("seed");
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let relay = spawn_relay(
        &relay_config(dir.path(), store_url, &amqp_url()),
        store.clone(),
    );
    // Everything but K/5..K/39 goes out; K/5 is returned and waits with an error.
    wait_for("K/5 failed, the rest of K held back", WAIT, || async {
        let status = store.outbox_status().await.ok()?;
        (status.pending == 35 && status.with_errors == 1).then_some(())
    })
    .await;
    let before = receive(&client, &sink, 165, WAIT).await;
    assert_eq!(before.len(), 165, "only rows outside K/5.. were published");
    assert_eq!(arrivals_of(&before, "K"), (0..5).collect::<Vec<_>>());
    for o in 0..4 {
        assert_eq!(
            arrivals_of(&before, &format!("O{o}")),
            (0..40).collect::<Vec<_>>()
        );
    }

    // The destination appears: K/5 goes out on a retry, then K/6.. in order.
    client
        .channel
        .queue_bind(
            sink.as_str().into(),
            unbound.as_str().into(),
            "#".into(),
            lapin::options::QueueBindOptions::default(),
            Default::default(),
        )
        .await
        .expect("bind");
    let after = receive(&client, &sink, 35, WAIT).await;
    stop_relay(relay).await;
    assert_eq!(arrivals_of(&after, "K"), (5..40).collect::<Vec<_>>());
    assert_eq!(after.len(), 35, "nothing published twice");
    assert_eq!(store.outbox_status().await.expect("status").pending, 0);
}

/// An unroutable row in the middle of a key's pipelined run (an event type nobody has bound
/// yet): the rows confirmed behind it in that run are marked, never sent again on its
/// retries; it follows them once routed; every row of the key arrives exactly once.
async fn an_unroutable_row_mid_pipeline_neither_loops_nor_duplicates(store_url: &str) {
    let client = Client::connect().await;
    let exchange = unique("out");
    let sink = client
        .bound_sink(&exchange, lapin::ExchangeKind::Direct, "seeded")
        .await;
    let store = migrated_store(store_url).await;
    let mut rows = chain_rows("K", 40, &exchange, None);
    rows[5].outbox[0].routing_key = "nowhere".into();
    store.commit_batch(&rows).await.expect("seed");

    let dir = tempfile::tempdir().expect("tempdir");
    let relay = spawn_relay(
        &relay_config(dir.path(), store_url, &amqp_url()),
        store.clone(),
    );
    // Several retries of K/5, each returned: with the old rule each one sent its run again.
    sqlx::any::install_default_drivers();
    let reader = sqlx::AnyPool::connect(store_url).await.expect("reader");
    wait_for("K/5 returned three times", WAIT, || async {
        let attempts: i64 =
            sqlx::query_scalar("SELECT attempts FROM outbox WHERE routing_key = 'nowhere'")
                .fetch_one(&reader)
                .await
                .ok()?;
        (attempts >= 3).then_some(())
    })
    .await;
    reader.close().await;
    let pending = store.outbox_status().await.expect("status").pending;
    let before = arrivals_of(&client.drain(&sink).await, "K");
    assert_eq!(before[..5], [0, 1, 2, 3, 4], "{before:?}");
    let overtook: Vec<usize> = (6..(6 + before.len() - 5)).collect();
    assert_eq!(
        before[5..],
        overtook[..],
        "rows behind K/5 arrive once each, in order: {before:?}"
    );
    assert_eq!(
        pending as usize,
        40 - before.len(),
        "exactly the rows that arrived are marked"
    );

    client.bind(&sink, &exchange, "nowhere").await;
    // K/5 next, then the rows that waited behind it, in order; nothing twice.
    let after: Vec<usize> = std::iter::once(5).chain(before.len() + 1..40).collect();
    let seen = std::sync::Mutex::new(Vec::new());
    wait_for("K/5 and then the rest", WAIT, || async {
        let drained = arrivals_of(&client.drain(&sink).await, "K");
        let mut all = seen.lock().expect("lock");
        all.extend(drained);
        (all.len() >= after.len()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut all = seen.into_inner().expect("lock");
    all.extend(arrivals_of(&client.drain(&sink).await, "K"));
    assert_eq!(all, after, "after routing: K/5, then the rest once each");
    stop_relay(relay).await;
    assert_eq!(store.outbox_status().await.expect("status").pending, 0);
}

/// Each scenario `(store_url)` as two tests: on a SQLite file of its own (`$on_sqlite`) and
/// on a PostgreSQL database of its own (`$on_postgres`).
macro_rules! on_both_stores {
    ($($scenario:ident => $on_sqlite:ident, $on_postgres:ident;)*) => {$(
        #[tokio::test]
        async fn $on_sqlite() {
            let dir = tempfile::tempdir().expect("tempdir");
            $scenario(&sqlite_url(dir.path())).await;
        }

        #[tokio::test]
        async fn $on_postgres() {
            $scenario(&pg_database().await).await;
        }
    )*};
}

on_both_stores! {
    failure_mid_chain_keeps_key_order =>
        failure_mid_chain_keeps_key_order_on_sqlite,
        failure_mid_chain_keeps_key_order_on_postgres;
    an_unroutable_row_mid_pipeline_neither_loops_nor_duplicates =>
        an_unroutable_row_mid_pipeline_neither_loops_nor_duplicates_on_sqlite,
        an_unroutable_row_mid_pipeline_neither_loops_nor_duplicates_on_postgres;
}
