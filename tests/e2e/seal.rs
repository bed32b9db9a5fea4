//! A retry copy whose seal this gateway cannot verify (the key was rotated past its window,
//! or another store's gateway made it) must not make retries unbounded: a copy that comes
//! back from the route's own retry tier keeps its attempt count.
//! A dead letter sealed with a key the archiving gateway has not read yet (another gateway
//! read a rotation first) keeps its reason, plugin and attempts.

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

/// Publishes `{}` with `props` straight to `queue` (the default exchange) and waits for the
/// broker's confirm.
async fn publish_to_queue(client: &Client, queue: &str, props: lapin::BasicProperties) {
    client
        .channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            b"{}",
            props,
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
}

/// The first dead letter archived for route `queue`, waited for (`what` names it).
async fn first_dead_letter(
    store: &carteiro::store::Store,
    queue: &str,
    what: &str,
) -> carteiro::store::DeadLetter {
    let route = DeadLetterFilter {
        route: Some(queue.to_owned()),
        ..Default::default()
    };
    wait_for(what, WAIT, || async {
        let rows = store.dead_letters_list(&route).await.ok()?;
        rows.into_iter().next()
    })
    .await
}

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
    publish_to_queue(&client, &format!("{queue}.retry.200ms"), props).await;
    let dead = first_dead_letter(&gw.store, &queue, "the copy dead-lettered").await;
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

/// Two gateways on one store after `carteiro seal rotate`: one has read the new key and seals
/// a dead letter with it (here, past its activation), the other has not read the keyring
/// since (its next read is up to 30 s away) and archives that dead letter. It must keep its
/// reason, plugin and attempts: the archiving gateway reads the keys again when a seal names
/// a key it does not know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_sealed_with_a_key_this_gateway_has_not_read_keeps_its_story() {
    let client = Client::connect().await;
    let (queue, exchange) = (unique("rotated"), unique("in"));
    client.sink(&exchange).await;
    let toml = route_config(&queue, "fixture-always-retry", &exchange, "", "");
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Gateway::start_in(dir, &toml, Arc::new(Metrics::default())).await;
    let dlq = carteiro::topology::dlq_name(&queue);
    client.wait_for_consumer(&dlq).await;

    // The other gateway: it rotated (the new key seals at once here) and read the keyring.
    let rotated = gw
        .store
        .header_seal_rotate(60_000, 0)
        .await
        .expect("rotate");
    let other =
        carteiro::broker::seal::SealKey::with_retired(&rotated.current, &rotated.verifying());
    let mut headers = FieldTable::default();
    let text = |s: &str| AMQPValue::LongString(s.into());
    headers.insert("x-carteiro-reason".into(), text("handler trapped: boom"));
    headers.insert("x-carteiro-plugin".into(), text("other-plugin"));
    headers.insert("x-carteiro-attempts".into(), AMQPValue::LongLongInt(5));
    let props = other.seal(&queue, json_props("m-rot").with_headers(headers), b"{}");
    publish_to_queue(&client, &dlq, props).await;
    let dead = first_dead_letter(&gw.store, &queue, "the dead letter archived").await;
    assert_eq!(
        (
            dead.letter.reason.as_str(),
            dead.letter.plugin.as_deref(),
            dead.letter.attempts
        ),
        ("handler trapped: boom", Some("other-plugin"), 5),
        "archived without the story its seal vouches for: {:?}",
        dead.letter.headers
    );
    gw.stop().await;
}
