//! A retry copy whose seal this gateway cannot verify (the key was rotated past its window,
//! or another store's gateway made it) must not make retries unbounded: a copy that comes
//! back from the route's own retry tier keeps its attempt count.

use crate::support::{
    Client, Gateway, assert_reason_starts_with, json_props, route_config, unique, wait_for,
};
use carteiro::metrics::Metrics;
use carteiro::store::DeadLetterFilter;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_sealed_with_another_key_still_counts_towards_the_attempt_limit() {
    let client = Client::connect().await;
    let (queue, exchange) = (unique("sealed"), unique("in"));
    client.sink(&exchange).await;
    let extra = "[routes.retry]\nmax_attempts = 3\nbackoff = [\"200ms\"]";
    let toml = route_config(&queue, "fixture-always-retry", &exchange, "", extra);
    let metrics = Arc::new(Metrics::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Gateway::start_in(dir, &toml, metrics.clone()).await;
    client.wait_for_consumer(&queue).await;

    // What another gateway's retry copy of attempt 3 looks like, sealed with a key this
    // store does not hold: it waits out the route's own tier, then comes back to the queue.
    let mut headers = FieldTable::default();
    headers.insert("x-carteiro-attempt".into(), AMQPValue::LongLongInt(3));
    let foreign = carteiro::broker::seal::SealKey::new(b"another store's key, 32 bytes!!!");
    let props = foreign.seal(&queue, json_props("m-1").with_headers(headers), b"{}");
    let seal = props
        .headers()
        .as_ref()
        .and_then(|t| t.inner().get("x-carteiro-seal").cloned());
    assert!(matches!(seal, Some(AMQPValue::LongString(ref s)) if s.as_bytes().contains(&b':')));
    client
        .channel
        .basic_publish(
            "".into(),
            format!("{queue}.retry.200ms").as_str().into(),
            BasicPublishOptions::default(),
            b"{}",
            props,
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");

    let route = DeadLetterFilter {
        route: Some(queue.clone()),
        ..Default::default()
    };
    let dead = wait_for("the copy dead-lettered", WAIT, || async {
        let rows = gw.store.dead_letters_list(&route).await.ok()?;
        rows.into_iter().next()
    })
    .await;
    assert_reason_starts_with(&dead.letter.reason, "retries exhausted");
    assert_eq!(
        dead.letter.attempts, 3,
        "counted from the copy's own attempt"
    );
    assert_eq!(
        metrics.handler_runs(&queue),
        1,
        "attempt 3 of 3 runs once, then dead-letters"
    );
    // The untrusted header is kept for the record, renamed.
    assert!(
        dead.letter
            .headers
            .iter()
            .any(|(k, _)| k == "x-untrusted-carteiro-attempt"),
        "{:?}",
        dead.letter.headers
    );
    gw.stop().await;
}
