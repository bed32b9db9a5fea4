//! Routes with `batch = { max, wait }`: deliveries gathered and handed to the plugin's
//! `handle-batch` in one call, each settled by its own verdict. The real gateway, broker and
//! store; the `counter-batch` fixture's body picks each message's verdict.

use crate::support::{
    Client, Route, assert_any_reason, committed, json_props, load_config, retry_table,
    route_config, unique, wait_for,
};
use carteiro::common::labels::Outcome;
use carteiro::metrics::Metrics;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// `counter-batch` on its own route with `batch`, emitting its events to a sink; returns the
/// route, the sink queue and the metrics.
async fn batch_route(batch: &str, extra: &str) -> (Route, Client, String, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let events = unique("batch-events");
    let sink_client = Client::connect().await;
    let sink = sink_client.sink(&events).await;
    let extra = format!("batch = {batch}\n{extra}");
    let route = Route::start_from("batch", metrics.clone(), |queue, exchange| {
        let vars = format!("out_exchange = \"{events}\"");
        route_config(queue, "counter-batch", exchange, &vars, &extra)
    })
    .await;
    (route, sink_client, sink, metrics)
}

async fn kv_text(store: &carteiro::store::Store, key: &str) -> Option<String> {
    store
        .kv_get("counter-batch", key)
        .await
        .expect("kv read")
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
}

/// Event message ids received on `sink` until `count` arrived (30 s at most), by id.
async fn events(client: &Client, sink: &str, count: usize) -> BTreeMap<String, usize> {
    let seen = std::sync::Mutex::new(BTreeMap::new());
    wait_for(
        &format!("{count} events"),
        Duration::from_secs(30),
        || async {
            let batch = client.drain(sink).await;
            let mut seen = seen.lock().expect("lock");
            for m in batch {
                let payload: serde_json::Value =
                    serde_json::from_slice(&m.delivery.data).expect("a JSON event");
                let id = payload["message_id"]
                    .as_str()
                    .expect("message_id")
                    .to_owned();
                *seen.entry(id).or_insert(0) += 1;
            }
            (seen.values().sum::<usize>() >= count).then_some(())
        },
    )
    .await;
    seen.into_inner().expect("lock")
}

#[tokio::test]
async fn a_mixed_batch_settles_each_message_by_its_own_verdict_and_keeps_only_acked_effects() {
    let (route, client, sink, metrics) =
        batch_route("{ max = 8, wait = \"500ms\" }", &retry_table(3, &["1s"])).await;
    // One batch: two acks, two retries (acked on their second attempt), two dead letters,
    // and a duplicate of the first message inside the batch.
    for (id, body) in [
        ("a0", "ok"),
        ("a1", "ok"),
        ("r0", "retry"),
        ("r1", "retry"),
        ("d0", "dead"),
        ("d1", "dead"),
        ("a0", "ok"),
    ] {
        route.publish(json_props(id), body.as_bytes()).await;
    }
    let dead = route.dead_letters(2).await;
    assert_any_reason(&dead, &["asked to dead-letter"]);
    assert_eq!(dead.len(), 2, "only d0 and d1 are dead letters");
    wait_for(
        "4 acks and a duplicate",
        Duration::from_secs(30),
        || async {
            (metrics.delivered(&route.queue, Outcome::Acked) >= 4
                && metrics.delivered(&route.queue, Outcome::Duplicate) >= 1)
                .then_some(())
        },
    )
    .await;
    let store = &route.gw.store;
    for id in ["a0", "a1", "r0", "r1"] {
        committed(store, "counter-batch", &format!("done/{id}")).await;
        assert_eq!(
            kv_text(store, &format!("done/{id}")).await.as_deref(),
            Some("1"),
            "{id} applied once (the duplicate of a0 included)"
        );
    }
    for id in ["d0", "d1"] {
        assert_eq!(
            kv_text(store, &format!("done/{id}")).await,
            None,
            "{id} kept no effect"
        );
    }
    // The batch really formed: a0 ran in a call of more than one message.
    let len: usize = kv_text(store, "batch-len/a0")
        .await
        .and_then(|t| t.parse().ok())
        .expect("batch-len/a0");
    assert!(len > 1, "a0 ran in a batch of {len}");
    assert_eq!(metrics.delivered(&route.queue, Outcome::Retried), 2);
    assert!(metrics.encode().contains("carteiro_batch_size_count"));
    // Only the acked messages' events are published, each once; the retried ones' first
    // attempt published nothing.
    let seen = events(&client, &sink, 4).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut seen = seen;
    for m in client.drain(&sink).await {
        let payload: serde_json::Value = serde_json::from_slice(&m.delivery.data).expect("json");
        *seen
            .entry(payload["message_id"].as_str().unwrap_or("?").to_owned())
            .or_insert(0) += 1;
    }
    let expected: BTreeMap<String, usize> = ["a0", "a1", "r0", "r1"]
        .into_iter()
        .map(|id| (id.to_owned(), 1))
        .collect();
    assert_eq!(seen, expected);
    route.gw.stop().await;
}

#[tokio::test]
async fn a_trap_fails_every_message_of_the_batch_and_commits_nothing() {
    let (route, _client, _sink, metrics) = batch_route(
        "{ max = 3, wait = \"3s\" }",
        "on_plugin_failure = \"dead-letter\"",
    )
    .await;
    for (id, body) in [("t0", "ok"), ("t1", "trap"), ("t2", "ok")] {
        route.publish(json_props(id), body.as_bytes()).await;
    }
    let dead = route.dead_letters(3).await;
    assert_eq!(dead.len(), 3, "the whole batch failed with the trap");
    for row in &dead {
        assert!(
            row.letter.reason.contains("trapped"),
            "{}",
            row.letter.reason
        );
    }
    for id in ["t0", "t1", "t2"] {
        assert_eq!(kv_text(&route.gw.store, &format!("done/{id}")).await, None);
    }
    assert_eq!(metrics.delivered(&route.queue, Outcome::Acked), 0);
    route.gw.stop().await;
}

#[tokio::test]
async fn the_python_batch_handler_records_each_enrollment_of_a_batch() {
    let metrics = Arc::new(Metrics::default());
    let route = Route::start_from("batch-py", metrics.clone(), |queue, exchange| {
        route_config(
            queue,
            "enrollment-py-batch",
            exchange,
            "",
            "batch = { max = 8, wait = \"300ms\" }\non_plugin_failure = \"dead-letter\"",
        )
    })
    .await;
    for i in 0..5 {
        let body = format!(r#"{{"matricula_id":"M{i}","usuario_id":"U{i}","curso_id":"C{i}"}}"#);
        route
            .publish(json_props(&format!("py-{i}")), body.as_bytes())
            .await;
    }
    route
        .publish(json_props("py-bad"), br#"{"matricula_id":"M9"}"#)
        .await;
    for i in 0..5 {
        let entry = committed(
            &route.gw.store,
            "enrollment-py-batch",
            &format!("matricula/M{i}"),
        )
        .await;
        assert!(String::from_utf8_lossy(&entry.value).contains(&format!("\"C{i}\"")));
    }
    let dead = route.dead_letters(1).await;
    assert_any_reason(&dead, &["invalid matricula.confirmada", "usuario_id"]);
    let missing = route
        .gw
        .store
        .kv_get("enrollment-py-batch", "matricula/M9")
        .await
        .expect("kv");
    assert!(
        missing.is_none(),
        "the dead-lettered message kept no effect"
    );
    route.gw.stop().await;
}

#[tokio::test]
async fn batch_on_a_plugin_without_handle_batch_is_a_config_error_naming_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = unique("batch-plain");
    let toml = route_config(&queue, "counter", &unique("in"), "", "batch = { max = 4 }")
        .replace("{dir}", &dir.path().display().to_string());
    let config = load_config(dir.path(), &toml);
    let options = carteiro::gateway::LiveOptions {
        metrics: Arc::default(),
        config_path: None,
        signals: None,
        native_handlers: Default::default(),
    };
    let run = carteiro::gateway::run_live(config, options, std::future::pending::<()>());
    let outcome = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the gateway refuses the config within 60s");
    let error = outcome
        .expect_err("a route with batch on a plain plugin")
        .to_string();
    assert!(
        error.contains(&queue) && error.contains("`counter`") && error.contains("handle-batch"),
        "{error}"
    );
    // `carteiro check` refuses it too, before anything is consumed.
    let mut check = crate::resilience::carteiro();
    check
        .args(["check", "--no-environment", "-c"])
        .arg(dir.path().join("carteiro.toml"));
    let out = crate::resilience::run_to_end(check, Duration::from_secs(60)).await;
    assert_ne!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains(&queue)
            && out.stderr.contains("`counter`")
            && out.stderr.contains("handle-batch"),
        "{}",
        out.stderr
    );
}
