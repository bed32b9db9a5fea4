//! The gateway against a real RabbitMQ and SQLite: verdicts, retries, dead letters,
//! idempotency and the relay, each test on its own queues and database.

use crate::support::{
    Client, Gateway, Route, assert_any_reason, assert_reason_starts_with, committed, json_props,
    retry_table, route_config, unique, wait_for,
};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

fn enrollment_body(id: &str) -> Vec<u8> {
    format!(r#"{{"matricula_id":"{id}","usuario_id":"U1","curso_id":"C1"}}"#).into_bytes()
}

#[tokio::test]
async fn enrollment_commits_effects_once_and_relays_its_events() {
    let queue = unique("matriculas");
    let exchange = unique("in");
    let events = unique("events");
    let client = Client::connect().await;
    let sink = client.sink(&events).await;
    let vars = format!("events_exchange = \"{events}\"");
    let gw = Gateway::start(&route_config(&queue, "enrollment", &exchange, &vars, "")).await;
    client.sink(&exchange).await; // make sure the exchange exists before publishing

    client.wait_for_consumer(&queue).await;
    // The same message twice: one set of effects, the second acked as a duplicate.
    for _ in 0..2 {
        client
            .publish(
                &exchange,
                "matricula.confirmada",
                json_props("msg-1"),
                &enrollment_body("M1"),
            )
            .await;
    }

    let received = wait_for("three relayed events", WAIT, || async {
        let got = client.drain(&sink).await;
        (!got.is_empty()).then_some(got)
    })
    .await;
    let mut all = received;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        all.extend(client.drain(&sink).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let keys: Vec<String> = all
        .iter()
        .map(|m| m.delivery.routing_key.to_string())
        .collect();
    assert_eq!(keys.len(), 3, "exactly one set of events, got {keys:?}");
    for key in ["acesso.liberado", "fatura.solicitada", "email.solicitado"] {
        assert!(keys.iter().any(|k| k == key), "{key} missing from {keys:?}");
    }
    assert!(
        all.iter()
            .all(|m| m.delivery.properties.message_id().is_some()),
        "event_id travels as message_id"
    );

    let record = gw
        .store
        .kv_get("enrollment", "matricula/M1")
        .await
        .expect("kv")
        .expect("enrollment recorded");
    assert_eq!(record.version, 1, "written exactly once");
    assert!(
        gw.store
            .inbox_contains(&queue, "msg-1")
            .await
            .expect("inbox")
    );
    let status = gw.store.outbox_status().await.expect("status");
    assert_eq!(status.pending, 0);
    gw.stop().await;
}

#[tokio::test]
async fn malformed_payload_is_dead_lettered_with_reason_and_no_effects() {
    let route = Route::start("matriculas", "enrollment", "", None).await;
    route
        .client
        .publish(
            &route.exchange,
            "matricula.confirmada",
            json_props("bad-1"),
            br#"{"matricula_id":"M9"}"#,
        )
        .await;
    let rows = route.dead_letters(1).await;
    assert!(
        rows[0].letter.reason.contains("usuario_id") || rows[0].letter.reason.contains("curso_id"),
        "{}",
        rows[0].letter.reason
    );
    assert_eq!(rows[0].letter.plugin.as_deref(), Some("enrollment"));
    assert_eq!(rows[0].letter.attempts, 1);
    let store = &route.gw.store;
    assert!(
        store
            .kv_get("enrollment", "matricula/M9")
            .await
            .expect("kv")
            .is_none()
    );
    assert!(
        !store
            .inbox_contains(&route.queue, "bad-1")
            .await
            .expect("inbox")
    );
    route.gw.stop().await;
}

#[tokio::test]
async fn retries_back_off_then_exhaust_into_the_dlq() {
    let extra = retry_table(3, &["300ms"]);
    let route = Route::start("retry", "fixture-always-retry", &extra, None).await;
    let (rows, took) = route.dead_letter_timed(json_props("r-1"), b"{}").await;
    assert!(
        took >= Duration::from_millis(600),
        "two backoffs of 300ms must be honoured, took {took:?}"
    );
    let row = &rows[0];
    assert_reason_starts_with(&row.letter.reason, "retries exhausted after 3 attempts");
    assert_eq!(row.letter.attempts, 3);
    assert!(
        row.letter
            .headers
            .iter()
            .any(|(k, v)| k == "x-carteiro-original-exchange" && v == &route.exchange)
    );
    route.gw.stop().await;
}

#[tokio::test]
async fn guards_and_traps_end_in_the_dlq_while_good_messages_flow() {
    let extra = format!("max_body_size = \"1KiB\"\n{}", retry_table(2, &["100ms"]));
    let route = Route::start("guards", "enrollment", &extra, None).await;
    route.publish(json_props("big"), &vec![b'x'; 4096]).await;
    route
        .publish(lapin::BasicProperties::default(), &enrollment_body("M2"))
        .await;
    route
        .publish(json_props("ok-3"), &enrollment_body("M3"))
        .await;
    let rows = route.dead_letters(2).await;
    assert_any_reason(&rows, &["max_body_size"]);
    assert_any_reason(&rows, &["missing idempotency key"]);
    committed(&route.gw.store, "enrollment", "matricula/M3").await;
    route.gw.stop().await;
}

#[tokio::test]
async fn a_trapping_plugin_is_dead_lettered_after_its_attempt_limit() {
    let extra = retry_table(2, &["100ms"]);
    let route = Route::start("trap", "fixture-trap", &extra, None).await;
    route.publish(json_props("t-1"), b"{}").await;
    let rows = route.dead_letters(1).await;
    let trapped = [
        "retries exhausted after 2 attempts: plugin trapped",
        "panicked",
    ];
    assert_any_reason(&rows, &trapped);
    route.gw.stop().await;
}

#[tokio::test]
async fn a_retried_message_succeeds_on_a_later_attempt_after_its_backoff() {
    let extra = retry_table(5, &["200ms", "1s"]);
    let route = Route::start("later", "fixture-mixed", &extra, None).await;
    let started = Instant::now();
    route.publish(json_props("later-1"), b"retry-until-3").await;
    let done = committed(&route.gw.store, "fixture-mixed", "done/later-1").await;
    let took = started.elapsed();
    assert_eq!(done.value, b"3", "acked on the third attempt");
    // The handler asked for 200 ms each time: the 200 ms tier, twice.
    assert!(
        took >= Duration::from_millis(400),
        "backoff not honoured: {took:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "backoff far too long: {took:?}"
    );
    route.gw.stop().await;
}

#[tokio::test]
async fn trapping_and_looping_messages_are_dead_lettered_while_others_flow() {
    let extra = retry_table(2, &["100ms"]);
    let route = Route::start_from("mixed", Default::default(), |queue, exchange| {
        route_config(queue, "fixture-mixed", exchange, "", &extra)
            .replace("timeout = \"2s\"", "timeout = \"300ms\"")
    })
    .await;
    route.publish(json_props("bad-trap"), b"trap").await;
    route.publish(json_props("bad-spin"), b"spin").await;
    for i in 0..20 {
        route.publish(json_props(&format!("good-{i}")), b"ok").await;
    }
    for i in 0..20 {
        committed(&route.gw.store, "fixture-mixed", &format!("done/good-{i}")).await;
    }
    let rows = route.dead_letters(2).await;
    let trapped = ["after 2 attempts: plugin trapped", "fixture asked to trap"];
    assert_any_reason(&rows, &trapped);
    assert_any_reason(&rows, &["after 2 attempts: plugin exceeded its timeout"]);
    route.gw.stop().await;
}
