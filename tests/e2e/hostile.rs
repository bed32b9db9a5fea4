//! Hostile input (issue 12), against the real broker and both databases: forged Carteiro
//! headers, dead letters the store cannot hold as they are, copies too large for a frame,
//! outbox rows AMQP cannot carry, plugins that push every per-delivery total. In each the
//! hostile message ends somewhere visible with a reason, and good messages keep flowing
//! within a latency bound meanwhile.

use crate::support::{
    Route, assert_any_reason, assert_reason_starts_with, committed, json_props, pg_database,
    unique, wait_for,
};
use carteiro::common::labels::Outcome;
use carteiro::metrics::Metrics;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);
/// Good messages must be committed within this long of their publish, whatever the
/// hostile ones beside them do.
const GOOD_LATENCY: Duration = Duration::from_secs(5);

impl Route {
    /// Publishes `n` good messages one after another and asserts each is committed (kv
    /// `done/<id>` or `ok/<id>` in `namespace`) within [`GOOD_LATENCY`].
    pub async fn good_messages_flow(&self, namespace: &str, prefix: &str, n: usize) {
        for i in 0..n {
            let id = unique(&format!("good-{i}"));
            let started = Instant::now();
            self.publish(json_props(&id), b"fine").await;
            let key = format!("{prefix}/{id}");
            wait_for(&format!("good message {id}"), GOOD_LATENCY, || async {
                self.gw.store.kv_get(namespace, &key).await.ok().flatten()
            })
            .await;
            assert!(started.elapsed() < GOOD_LATENCY);
        }
    }
}

fn text(value: &[u8]) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_carteiro_headers_are_kept_renamed_and_never_believed() {
    let extra = "[routes.retry]\nmax_attempts = 3\nbackoff = [\"100ms\"]";
    let route = Route::start("forged", "fixture-mixed", extra, None).await;
    let mut table = FieldTable::default();
    table.insert("x-carteiro-attempt".into(), AMQPValue::LongLongInt(99));
    table.insert(
        "x-carteiro-original-exchange".into(),
        text(b"forged-exchange"),
    );
    table.insert("x-carteiro-seal".into(), text(b"00ff"));
    table.insert(
        "x-carteiro-first-failure-at".into(),
        AMQPValue::LongLongInt(1),
    );
    let props = json_props("forged-1").with_headers(table);
    // Asks for retries until attempt 10: with max_attempts 3 it must run exactly 3 times.
    route.publish(props, b"retry-until-10").await;
    route.good_messages_flow("fixture-mixed", "done", 3).await;

    let rows = route.dead_letters(1).await;
    let d = &rows[0];
    assert_eq!(
        d.letter.attempts, 3,
        "the forged attempt 99 was believed: {d:?}"
    );
    assert_reason_starts_with(&d.letter.reason, "retries exhausted after 3 attempts");
    assert_eq!(d.header("x-untrusted-carteiro-attempt"), Some("99"));
    assert_eq!(
        d.header("x-untrusted-carteiro-original-exchange"),
        Some("forged-exchange")
    );
    // Carteiro's own story is its own: the original exchange is where it was published.
    assert_eq!(
        d.header("x-carteiro-original-exchange"),
        Some(route.exchange.as_str())
    );
    assert_ne!(
        d.letter.first_failed_at,
        Some(1),
        "forged first-failure time believed"
    );
    route.gw.stop().await;
}

async fn hostile_dead_letter_is_archived(store_url: Option<&str>) {
    let route = Route::start("nuldl", "fixture-mixed", "", store_url).await;
    let mut table = FieldTable::default();
    table.insert("x-carteiro-plugin".into(), text(b"plug\0in"));
    table.insert("x-carteiro-reason".into(), text(b"bad\0reason\xff"));
    table.insert("x-carteiro-attempts".into(), AMQPValue::LongLongInt(99));
    table.insert("x-first-death-queue".into(), text(b"q\0ueue"));
    table.insert("x-na\0me".into(), text(b"v\0alue"));
    let props = BasicProperties::default()
        .with_message_id("m\0id".into())
        .with_headers(table);
    // Straight to the route's dead-letter exchange, as a hostile client can.
    route
        .client
        .publish(&format!("{}.dlx", route.queue), "", props, b"b\0dy\xfe")
        .await;
    route.good_messages_flow("fixture-mixed", "done", 3).await;

    let rows = route.dead_letters(1).await;
    // Archived with a reason of its own.
    assert_any_reason(&rows, &["dead-letter"]);
    let d = &rows[0];
    assert_eq!(d.letter.attempts, 0, "unsealed attempts are not believed");
    assert_eq!(
        d.letter.plugin, None,
        "unsealed plugin name is not believed"
    );
    assert_eq!(
        d.letter.body, b"b\0dy\xfe",
        "the body is kept byte for byte"
    );
    assert!(
        d.letter
            .headers
            .iter()
            .any(|(k, _)| k.starts_with("x-untrusted-carteiro-reason")),
        "{:?}",
        d.letter.headers
    );
    // Still archiving: a second one lands too, and good messages still flow.
    route
        .client
        .publish(
            &format!("{}.dlx", route.queue),
            "",
            BasicProperties::default(),
            b"second",
        )
        .await;
    route.dead_letters(2).await;
    route.good_messages_flow("fixture-mixed", "done", 2).await;
    route.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_with_nul_bytes_everywhere_is_archived_on_sqlite() {
    hostile_dead_letter_is_archived(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_with_nul_bytes_everywhere_is_archived_on_postgres() {
    let url = pg_database().await;
    hostile_dead_letter_is_archived(Some(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_too_large_for_the_frame_is_archived_directly() {
    let route = Route::start(
        "bigframe",
        "fixture-mixed",
        "on_plugin_failure = \"dead-letter\"",
        None,
    )
    .await;
    // Fits the broker's 128 KiB frame as received, but not with a dead letter's headers.
    let mut table = FieldTable::default();
    table.insert("x-padding".into(), text(&vec![b'p'; 130_500]));
    route
        .publish(json_props("big-1").with_headers(table), b"trap")
        .await;
    route.good_messages_flow("fixture-mixed", "done", 3).await;
    let rows = route.dead_letters(1).await;
    assert_any_reason(&rows, &["plugin trapped", "archived directly"]);
    let d = &rows[0];
    assert_eq!(d.header("x-padding").map(str::len), Some(130_500));
    route.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_row_amqp_cannot_carry_is_parked_and_the_relay_goes_on() {
    let events = unique("events");
    let route = Route::start("parkrow", "fixture-hostile", "", None).await;
    let sink = route.client.sink(&events).await;
    // A row written before the host refused such events (or by hand): 300-byte content type.
    let mut bad = crate::support::seed_request(&events, "bad-key", 0);
    bad.outbox[0].content_type = Some("x".repeat(300));
    let good: Vec<_> = (0..5)
        .map(|i| crate::support::seed_request(&events, &format!("good-{i}"), 0))
        .collect();
    let mut batch = vec![bad];
    batch.extend(good);
    route.gw.store.commit_batch(&batch).await.expect("seed");
    let deadline = Instant::now() + WAIT;
    let mut all = Vec::new();
    let status = loop {
        all.extend(route.client.drain(&sink).await);
        let status = route.gw.store.outbox_status().await.expect("outbox status");
        // Pending: the bad row only, once the good ones are confirmed and marked.
        if status.with_errors == 1 && status.pending == 1 && all.len() >= 5 {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "good rows relayed and the bad one parked: {} relayed, {status:?}",
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // A moment more: the bad row must not go out late either.
    tokio::time::sleep(Duration::from_millis(500)).await;
    all.extend(route.client.drain(&sink).await);
    assert_eq!(status.leased, 0, "the bad row is not in flight: {status:?}");
    assert_eq!(all.len(), 5, "each good row once, the bad one never");
    // The plugin path: the host refuses such an event at emit, with the reason.
    route
        .publish(json_props("ct-1"), b"long-content-type")
        .await;
    let rows = route.dead_letters(1).await;
    assert_any_reason(&rows, &["content type is 300 bytes"]);
    route.good_messages_flow("fixture-hostile", "ok", 3).await;
    route.gw.stop().await;
}

/// Regression (found by `hostile_props`): RabbitMQ 3.10 crashes the retry tier's queue
/// process when it dead-letters a message whose `x-death` holds a non-table, and on restart
/// dead-letters it again: one retry became several. Retry copies never carry the
/// publisher's `x-death`, so the message runs exactly twice and commits once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_x_death_does_not_crash_the_retry_tier_into_duplicates() {
    use lapin::types::FieldArray;
    let metrics = Arc::new(Metrics::default());
    let extra = "[routes.retry]\nmax_attempts = 3\nbackoff = [\"100ms\"]";
    let route = Route::start_with_metrics("xdeath", "fixture-mixed", extra, metrics.clone()).await;
    let mut table = FieldTable::default();
    table.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::Boolean(true)])),
    );
    table.insert("x-first-death-reason".into(), AMQPValue::Boolean(true));
    route
        .publish(json_props("xd-1").with_headers(table), b"retry-until-2")
        .await;
    let attempt = committed(&route.gw.store, "fixture-mixed", "done/xd-1").await;
    assert_eq!(attempt.value, b"2", "committed on its second attempt");
    route.good_messages_flow("fixture-mixed", "done", 2).await;
    // Two runs of the retried message, one of each good one: no run came back again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(metrics.handler_runs(&route.queue), 4);
    assert_eq!(metrics.delivered(&route.queue, Outcome::Duplicate), 0);
    route.gw.stop().await;
}
