//! G1/G2 end to end: effects commit exactly once under concurrency, duplicates, competing
//! consumers, crashes (SIGKILL of the real binary) and a database outage; hostile keys are
//! stored verbatim or refused.

use crate::support::{
    Client, Gateway, assert_any_reason, assert_once_or_resent, crash_at_fault, dead_letters_within,
    drain_after_kill, json_props, pg_database, receive, unique, wait_for, wait_published,
    with_store,
};
use carteiro::common::labels::Outcome;
use carteiro::metrics::Metrics;
use carteiro::store::Store;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

async fn kv_number(store: &Store, key: &str) -> Option<i64> {
    let entry = store.kv_get("counter", key).await.ok()??;
    String::from_utf8(entry.value).ok()?.trim().parse().ok()
}

async fn wait_runs(store: &Store, expected: i64) {
    wait_for(&format!("runs == {expected}"), WAIT, || async {
        (kv_number(store, "runs").await? >= expected).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        kv_number(store, "runs").await,
        Some(expected),
        "no extra effects"
    );
}

/// [`crate::support::counter_config`] with a deeper prefetch.
fn counter_config(queue: &str, exchange: &str, events: &str) -> String {
    crate::support::counter_config(queue, exchange, events)
        .replace("prefetch = 16", "prefetch = 64")
}

async fn counter_route(client: &Client) -> (String, String, String, String) {
    let queue = unique("count");
    let exchange = unique("in");
    let events = unique("events");
    client.sink(&exchange).await;
    let sink = client.sink(&events).await;
    (queue, exchange, events, sink)
}

async fn many_increments(url: Option<String>) {
    let client = Client::connect().await;
    let (queue, exchange, events, sink) = counter_route(&client).await;
    let mut toml = counter_config(&queue, &exchange, &events);
    if let Some(url) = &url {
        toml = with_store(&toml, url);
    }
    let gw = Gateway::start(&toml).await;
    client.wait_for_consumer(&queue).await;
    for i in 0..1000 {
        client
            .publish(&exchange, "k", json_props(&format!("m-{i}")), b"{}")
            .await;
    }
    wait_runs(&gw.store, 1000).await;
    for i in [0, 499, 999] {
        assert_eq!(kv_number(&gw.store, &format!("seen/m-{i}")).await, Some(1));
    }
    let relayed = receive(&client, &sink, 1000, WAIT).await;
    assert_eq!(relayed.len(), 1000, "one event per message");
    gw.stop().await;
}

#[tokio::test]
async fn a_thousand_concurrent_increments_count_exactly_a_thousand_on_sqlite() {
    many_increments(None).await;
}

#[tokio::test]
async fn a_thousand_concurrent_increments_count_exactly_a_thousand_on_postgres() {
    many_increments(Some(pg_database().await)).await;
}

#[tokio::test]
async fn competing_consumers_and_duplicates_commit_once_on_postgres() {
    let client = Client::connect().await;
    let (queue, exchange, events, _sink) = counter_route(&client).await;
    let toml = with_store(
        &counter_config(&queue, &exchange, &events),
        &pg_database().await,
    );
    let a = Gateway::start(&toml).await;
    let b = Gateway::start(&toml).await;
    client.wait_for_consumer(&queue).await;
    // Every message twice, back to back: the two copies usually land on different consumers.
    for i in 0..200 {
        let props = json_props(&format!("dup-{i}"));
        client.publish(&exchange, "k", props.clone(), b"{}").await;
        client.publish(&exchange, "k", props, b"{}").await;
    }
    wait_runs(&a.store, 200).await;
    for i in 0..200 {
        assert_eq!(
            kv_number(&a.store, &format!("seen/dup-{i}")).await,
            Some(1),
            "dup-{i}"
        );
    }
    a.stop().await;
    b.stop().await;
}

/// Runs the real binary with a fault point, waits until it hangs there, SIGKILLs it, then
/// lets a fresh gateway finish the job: one effect, one outbox event, and `handler_runs` runs
/// of the handler on the redelivery, for the reason `why`.
async fn crash_then_recover(fault: &str, handler_runs: u64, why: &str) {
    let client = Client::connect().await;
    let (queue, exchange, events, sink) = counter_route(&client).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = counter_config(&queue, &exchange, &events)
        .replace("{dir}", &dir.path().display().to_string());
    let config = dir.path().join("carteiro.toml");
    std::fs::write(&config, &toml).expect("config");

    // Publish once the doomed gateway consumes; it hangs at the fault point, then dies.
    let publisher = async {
        client.wait_for_consumer(&queue).await;
        client
            .publish(&exchange, "k", json_props("crash-1"), b"{}")
            .await;
    };
    let crash = tokio::task::spawn_blocking({
        let config = config.clone();
        let fault = fault.to_owned();
        move || crash_at_fault("run", &config, &fault)
    });
    publisher.await;
    crash.await.expect("crash task");
    let before_kill = drain_after_kill(&client, &sink).await;

    let metrics = Arc::new(Metrics::default());
    let gw = Gateway::start_in(dir, &toml, metrics.clone()).await;
    wait_for("the redelivered message settled", WAIT, || async {
        (metrics.delivered(&queue, Outcome::Acked) + metrics.delivered(&queue, Outcome::Duplicate)
            > 0)
        .then_some(())
    })
    .await;
    let runs = kv_number(&gw.store, "runs").await.unwrap_or(0);
    wait_published("the outbox event published", &gw.store, WAIT).await;
    let after = client.drain(&sink).await;
    let handler_ran = metrics.handler_runs(&queue);
    gw.stop().await;
    assert_eq!(runs, 1, "effects exactly once");
    assert_eq!(handler_ran, handler_runs, "{why}");
    assert_once_or_resent("one outbox event", 1, &before_kill, &after);
}

#[tokio::test]
async fn sigkill_before_commit_redelivers_and_commits_once() {
    crash_then_recover(
        "hang-before-commit",
        1,
        "the redelivery ran the handler (nothing was committed)",
    )
    .await;
}

#[tokio::test]
async fn sigkill_after_commit_does_not_run_the_handler_again() {
    crash_then_recover(
        "hang-after-commit",
        0,
        "the redelivery found the inbox record and skipped the handler",
    )
    .await;
}

#[tokio::test]
async fn hostile_keys_are_stored_verbatim_or_refused_and_the_schema_survives() {
    let client = Client::connect().await;
    let (queue, exchange, events, _sink) = counter_route(&client).await;
    let gw = Gateway::start(&counter_config(&queue, &exchange, &events)).await;
    client.wait_for_consumer(&queue).await;
    let verbatim = [
        "'); DROP TABLE outbox;--",
        "\"quoted\" and 'single'",
        "ünïcödé ✉",
    ];
    for (i, key) in verbatim.iter().enumerate() {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(
            "x-counter-key".into(),
            lapin::types::AMQPValue::LongString((*key).into()),
        );
        let props = json_props(&format!("{key}-{i}")).with_headers(headers);
        client.publish(&exchange, "k", props, b"{}").await;
    }
    for refused in ["nul\0inside".to_owned(), "k".repeat(2048)] {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(
            "x-counter-key".into(),
            lapin::types::AMQPValue::LongString(refused.as_str().into()),
        );
        client
            .publish(
                &exchange,
                "k",
                json_props(&unique("refused")).with_headers(headers),
                b"{}",
            )
            .await;
    }
    wait_runs(&gw.store, 3).await;
    for key in verbatim {
        assert_eq!(
            kv_number(&gw.store, &format!("counter/{key}")).await,
            Some(1),
            "{key}"
        );
    }
    // The two refused keys.
    let dead = dead_letters_within(&gw.store, &queue, 2, WAIT).await;
    assert_any_reason(&dead, &["NUL"]);
    assert_any_reason(&dead, &["1024"]);
    gw.store
        .outbox_status()
        .await
        .expect("the outbox table is intact");
    gw.stop().await;
}
