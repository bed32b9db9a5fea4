//! wasi:messaging@0.2.0-draft components (world `messaging-core`) run unchanged beside
//! carteiro:handler ones: through the real gateway, broker and SQLite store (`ok` acks and
//! its `producer.send` is relayed once from the outbox; `timeout` retries into the DLQ;
//! `other` follows the route's `standard_errors`), in process (the same limits and instance
//! reuse), at load (request-reply refused by name) and in `carteiro plugin test`.

use crate::support::{
    Client, Route, assert_contains_all, assert_reason_starts_with, message_header, plugin,
    plugin_limits, repo, retry_table, route_config_with, run_ok, unique, wait_for,
};
use carteiro::broker::field_table::to_text_pairs;
use carteiro::runtime::{
    Isolation, KvSource, LoadError, MemoryKv, Message, Plugin, PluginFailure, Runtime,
    StandardError, Verdict, World,
};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const RUST: &str = "fixture-standard-messaging";
const PYTHON: &str = "fixture-standard-py";
const WAIT: Duration = Duration::from_secs(30);
/// A Python component compiles slowly in a debug build.
const PYTHON_WAIT: Duration = Duration::from_secs(240);

/// Properties with a message id and a `tenant` header, which the fixture echoes.
fn props(id: &str) -> lapin::BasicProperties {
    let mut headers = lapin::types::FieldTable::default();
    headers.insert(
        "tenant".into(),
        lapin::types::AMQPValue::LongString("acme".into()),
    );
    lapin::BasicProperties::default()
        .with_message_id(id.into())
        .with_headers(headers)
        .with_delivery_mode(2)
}

/// A route on `fixture` whose sends go to a new exchange with a sink queue bound to it.
struct StandardRoute {
    route: Route,
    sink: String,
}

impl StandardRoute {
    async fn start(fixture: &str, route_extra: &str, plugin_extra: &str) -> Self {
        let out = unique("standard-out");
        let client = Client::connect().await;
        let sink = client.sink(&out).await;
        let plugin_lines = format!("standard_exchange = \"{out}\"\n{plugin_extra}");
        let route = Route::start_from("standard", Arc::default(), |queue, exchange| {
            route_config_with(queue, fixture, exchange, "", &plugin_lines, route_extra)
        })
        .await;
        Self { route, sink }
    }

    /// Everything that reaches the sink within `within` after the first message arrived.
    async fn sent(
        &self,
        within: Duration,
        first_within: Duration,
    ) -> Vec<lapin::message::BasicGetMessage> {
        let client = &self.route.client;
        let mut all = wait_for("a relayed send", first_within, || async {
            let got = client.drain(&self.sink).await;
            (!got.is_empty()).then_some(got)
        })
        .await;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            all.extend(client.drain(&self.sink).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        all
    }
}

#[tokio::test]
async fn ok_acks_and_its_send_is_relayed_once_with_topic_and_metadata() {
    let standard = StandardRoute::start(RUST, "", "").await;
    let route = &standard.route;
    // The same message twice: one commit, one relayed send.
    for _ in 0..2 {
        route.publish(props("s-ok"), b"ok").await;
    }
    let sent = standard.sent(Duration::from_secs(2), WAIT).await;
    assert_eq!(sent.len(), 1, "exactly one send for one committed delivery");
    let m = &sent[0].delivery;
    assert_eq!(
        m.routing_key.as_str(),
        "standard.done",
        "topic -> routing key"
    );
    assert_eq!(m.data, b"done");
    assert_eq!(
        m.properties.content_type().as_ref().map(|c| c.as_str()),
        Some("text/plain")
    );
    assert!(
        m.properties.message_id().is_some(),
        "event id as message_id"
    );
    let headers = to_text_pairs(&m.properties.headers().clone().unwrap_or_default());
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(
        header("tenant"),
        Some("acme"),
        "metadata -> headers: {headers:?}"
    );
    // The delivery's routing key was the component's topic.
    assert_eq!(header("x-standard-topic"), Some("k"), "{headers:?}");

    let store = &route.gw.store;
    assert!(
        store
            .inbox_contains(&route.queue, "s-ok")
            .await
            .expect("inbox")
    );
    assert_eq!(store.outbox_status().await.expect("status").pending, 0);
    assert!(
        store
            .dead_letters_list(&carteiro::store::DeadLetterFilter {
                route: Some(route.queue.clone()),
                ..Default::default()
            })
            .await
            .expect("list")
            .is_empty()
    );
    standard.route.gw.stop().await;
}

#[tokio::test]
async fn timeout_is_retried_with_backoff_until_the_limit_then_dead_lettered() {
    let extra = retry_table(3, &["200ms"]);
    let standard = StandardRoute::start(RUST, &extra, "").await;
    let route = &standard.route;
    let (rows, took) = route
        .dead_letter_timed(props("s-timeout"), b"timeout")
        .await;
    assert!(
        took >= Duration::from_millis(400),
        "two backoffs honoured: {took:?}"
    );
    let letter = &rows[0].letter;
    assert_eq!(letter.attempts, 3);
    assert_reason_starts_with(
        &letter.reason,
        "retries exhausted after 3 attempts: wasi:messaging error: timeout",
    );
    assert!(
        !route
            .gw
            .store
            .inbox_contains(&route.queue, "s-timeout")
            .await
            .expect("inbox")
    );
    standard.route.gw.stop().await;
}

#[tokio::test]
async fn other_dead_letters_at_once_when_the_route_says_so_and_retries_by_default() {
    let extra = format!(
        "standard_errors = \"dead-letter\"\n{}",
        retry_table(3, &["100ms"])
    );
    let at_once = StandardRoute::start(RUST, &extra, "").await;
    at_once.route.publish(props("s-other-1"), b"other").await;
    let rows = at_once.route.dead_letters(1).await;
    assert_eq!(
        rows[0].letter.attempts, 1,
        "dead-lettered on the first attempt"
    );
    let reason = &rows[0].letter.reason;
    assert!(
        reason.contains("wasi:messaging error: other: fixture: other failure")
            && !reason.contains("retries exhausted"),
        "{reason}"
    );
    at_once.route.gw.stop().await;

    let by_default = StandardRoute::start(RUST, &retry_table(3, &["100ms"]), "").await;
    by_default.route.publish(props("s-other-2"), b"other").await;
    let rows = by_default.route.dead_letters(1).await;
    assert_eq!(rows[0].letter.attempts, 3, "retried until the limit");
    assert_reason_starts_with(
        &rows[0].letter.reason,
        "retries exhausted after 3 attempts: wasi:messaging error: other",
    );
    by_default.route.gw.stop().await;
}

#[tokio::test]
async fn a_python_standard_component_acks_and_sends() {
    // Compiled once into the default compile cache before the gateway loads it.
    tokio::task::spawn_blocking(|| {
        let runtime =
            Runtime::with_compile_cache(1, carteiro::runtime::default_compile_cache().as_deref())
                .expect("runtime");
        Plugin::load(
            &runtime,
            PYTHON,
            &plugin(PYTHON),
            None,
            limits(),
            BTreeMap::new(),
        )
        .unwrap_or_else(|e| panic!("{PYTHON} loads: {e}"));
    })
    .await
    .expect("warm");
    let standard = StandardRoute::start(PYTHON, "", "timeout = \"10s\"\nmemory = \"64MiB\"").await;
    standard.route.publish(props("py-ok"), b"ok").await;
    let sent = standard.sent(Duration::from_secs(1), PYTHON_WAIT).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].delivery.routing_key.as_str(), "standard.done");
    assert_eq!(sent[0].delivery.data, b"done-py");
    let store = &standard.route.gw.store;
    assert!(
        store
            .inbox_contains(&standard.route.queue, "py-ok")
            .await
            .expect("inbox")
    );
    standard.route.gw.stop().await;
}

fn limits() -> carteiro::runtime::PluginLimits {
    plugin_limits(Duration::from_secs(10), 64 << 20, 10_000, 100)
}

fn message(body: &[u8]) -> Message {
    Message {
        id: Some("m-1".into()),
        exchange: "in".into(),
        routing_key: "orders.created".into(),
        headers: vec![
            message_header("tenant", "acme"),
            message_header("x-carteiro-attempt", "2"),
        ],
        content_type: None,
        body: body.to_vec(),
        attempt: 1,
        redelivered: false,
    }
}

fn load(limits: carteiro::runtime::PluginLimits, exchange: Option<&str>) -> Plugin {
    let runtime = Runtime::new(4).expect("runtime");
    Plugin::load(
        &runtime,
        "std",
        &plugin(RUST),
        None,
        limits,
        BTreeMap::new(),
    )
    .expect("a messaging-core component loads")
    .with_standard_exchange(exchange.map(str::to_owned))
}

#[tokio::test]
async fn in_process_the_standard_world_gets_the_same_caps_and_instance_reuse() {
    let kv = || -> Arc<dyn KvSource> { Arc::new(MemoryKv::default()) };
    let mut reused = limits();
    reused.isolation = Some(Isolation::PerBatch { reuse: 4 });
    let plugin = load(reused, Some("out"));
    assert_eq!(plugin.world(), World::Standard);
    for _ in 0..3 {
        let done = plugin.handle(&message(b"ok"), kv()).await.expect("ok");
        assert!(matches!(done.verdict, Verdict::Ack));
        assert_eq!(done.standard_error, None);
        let [event] = done.effects.events.as_slice() else {
            panic!("one send per delivery: {:?}", done.effects.events);
        };
        assert_eq!(event.exchange, "out");
        assert_eq!(event.routing_key, "standard.done", "topic -> routing key");
        assert!(event.headers.contains(&("tenant".into(), "acme".into())));
        assert!(
            event
                .headers
                .contains(&("x-standard-topic".into(), "orders.created".into()))
        );
        assert!(
            event
                .headers
                .iter()
                .all(|(k, _)| !k.starts_with("x-carteiro-")),
            "Carteiro's own headers are not metadata: {:?}",
            event.headers
        );
    }

    // Without a standard_exchange the component may not send: its error is the verdict.
    let denied = load(limits(), None);
    let answer = denied
        .handle(&message(b"ok"), kv())
        .await
        .expect("answered");
    let denied_for_want_of_an_exchange = matches!(
        &answer.standard_error,
        Some(StandardError::PermissionDenied(why)) if why.contains("standard_exchange")
    );
    assert!(
        denied_for_want_of_an_exchange,
        "{:?}",
        answer.standard_error
    );
    assert!(answer.effects.events.is_empty());

    // The host-call cap traps a standard component like any other.
    let capped = load(
        plugin_limits(Duration::from_secs(10), 64 << 20, 3, 100),
        Some("out"),
    );
    let failure = capped
        .handle(&message(b"ok"), kv())
        .await
        .expect_err("capped");
    assert_eq!(failure, PluginFailure::HostCallLimit(3));
}

#[test]
fn a_component_importing_request_reply_is_refused_naming_the_import() {
    let runtime = Runtime::new(2).expect("runtime");
    let err = Plugin::load(
        &runtime,
        "rr",
        &plugin("fixture-standard-request-reply"),
        None,
        limits(),
        BTreeMap::new(),
    )
    .err()
    .expect("refused");
    assert!(matches!(err, LoadError::UnsupportedImport { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("wasi:messaging/request-reply@0.2.0-draft")
            && text.contains("messaging-core"),
        "{text}"
    );

    // A carteiro:handler component is still recognised as such.
    let noop = Plugin::load(
        &runtime,
        "noop",
        &plugin("noop"),
        None,
        limits(),
        BTreeMap::new(),
    )
    .expect("loads");
    assert_eq!(noop.world(), World::Carteiro);
}

fn carteiro_plugin_test(args: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_carteiro"));
    cmd.env("CARTEIRO_LOG", "warn")
        .env("XDG_CACHE_HOME", repo().join("target/standard-e2e/cache"))
        .args(["plugin", "test"])
        .args(args);
    run_ok("carteiro plugin test", &mut cmd)
}

#[test]
fn plugin_test_runs_both_worlds() {
    let standard = plugin(RUST).display().to_string();
    let ok = carteiro_plugin_test(&[
        &standard,
        "--body",
        "ok",
        "--header",
        "tenant=acme",
        "--standard-exchange",
        "out",
        "--expect",
        "ack",
    ]);
    let acked = [
        "world    wasi:messaging@0.2.0-draft",
        "answer   ok",
        "verdict  ack",
        "exchange \"out\" routing key \"standard.done\"",
    ];
    assert_contains_all(&ok, &acked);
    let other = carteiro_plugin_test(&[
        &standard,
        "--body",
        "other",
        "--standard-errors",
        "dead-letter",
        "--expect",
        "dead-letter",
    ]);
    assert!(
        other.contains("answer   wasi:messaging error: other"),
        "{other}"
    );
    let retried = carteiro_plugin_test(&[&standard, "--body", "timeout", "--expect", "retry"]);
    assert!(retried.contains("verdict  retry"), "{retried}");

    let noop = plugin("noop").display().to_string();
    let carteiro = carteiro_plugin_test(&[&noop, "--expect", "ack"]);
    assert!(
        carteiro.contains("world    carteiro:handler@0.1.0"),
        "{carteiro}"
    );
}
