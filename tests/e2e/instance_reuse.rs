//! `isolation = "per-batch"`: one instance serves several deliveries of a plugin, one after
//! another. Guest state survives between them (the point of it, and what a handler author
//! must know), nothing else does: each delivery has its own limits, deadline and effects, an
//! instance that failed is never used again, and idle instances never starve another plugin.
//! Left unset, the isolation is the component's language's: a fresh instance per delivery
//! for a compiled one (`runtime::no_guest_state_survives_*`), per-batch for Python and
//! JavaScript, whose fresh instances cost milliseconds.

use crate::live::sha256_of;
use crate::support::{
    Route, committed, json_props, plugin, plugin_limits, route_config_with, wait_for,
};
use carteiro::cli::MemoryKv;
use carteiro::common::labels::Outcome;
use carteiro::metrics::Metrics;
use carteiro::runtime::{
    Invocation, Isolation, IsolationChoice, Language, Message, Plugin, PluginFailure, PluginLimits,
    Runtime, Verdict, short_version,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Limits for these tests, with one instance serving up to `reuse` deliveries.
fn per_batch(reuse: u32, timeout: Duration) -> PluginLimits {
    PluginLimits {
        isolation: Some(Isolation::PerBatch { reuse }),
        ..plugin_limits(timeout, 32 << 20, 1_000, 10)
    }
}

/// Limits that leave the isolation to the component's language, as a `[plugins.NAME]` entry
/// that gives only `path` and `memory` does.
fn language_default(timeout: Duration) -> PluginLimits {
    PluginLimits {
        isolation: None,
        ..plugin_limits(timeout, 64 << 20, 1_000, 10)
    }
}

/// A runtime of `slots` instance slots whose instances are counted in the metrics returned
/// (components compiled once, in the default compile cache).
fn counted_runtime(slots: u32) -> (Arc<Runtime>, Arc<Metrics>) {
    let cache = carteiro::runtime::default_compile_cache();
    let runtime = Runtime::with_compile_cache(slots, cache.as_deref()).expect("runtime");
    let metrics = Arc::new(Metrics::default());
    runtime.count_instances_in(metrics.clone());
    (runtime, metrics)
}

fn load(runtime: &Arc<Runtime>, name: &str, limits: PluginLimits) -> Plugin {
    let path = plugin(name);
    Plugin::load(runtime, name, &path, None, limits, BTreeMap::new()).expect("loads")
}

/// Plugin `name` with `limits`, on a [`counted_runtime`] of `slots` instance slots.
fn load_counted(
    slots: u32,
    name: &str,
    limits: PluginLimits,
) -> (Arc<Runtime>, Arc<Metrics>, Plugin) {
    let (runtime, metrics) = counted_runtime(slots);
    let plugin = load(&runtime, name, limits);
    (runtime, metrics, plugin)
}

/// Instances of `plugin` made, and deliveries they served after their first.
fn instances(metrics: &Metrics, plugin: &Plugin) -> (u64, u64) {
    metrics.plugin_instances(plugin.name(), plugin.version())
}

fn message(id: &str, body: &str) -> Message {
    Message {
        id: Some(id.into()),
        exchange: "matriculas".into(),
        routing_key: "matricula.confirmada".into(),
        headers: Vec::new(),
        content_type: Some("application/json".into()),
        body: body.as_bytes().to_vec(),
        attempt: 1,
        redelivered: false,
    }
}

async fn run(plugin: &Plugin, id: &str, body: &str) -> Result<Invocation, PluginFailure> {
    plugin
        .handle(&message(id, body), Arc::new(MemoryKv::default()))
        .await
}

/// A delivery that ends with a verdict.
async fn verdict(plugin: &Plugin, id: &str, body: &str) -> Invocation {
    run(plugin, id, body).await.expect("a verdict")
}

/// `fixture-mixed`'s report of how many `remember` deliveries its instance ran, counted in a
/// static and in a heap buffer: `runs 1 1` on a fresh instance.
async fn remember(plugin: &Plugin) -> String {
    match verdict(plugin, "m-r", "remember").await.verdict {
        Verdict::DeadLetter(report) => report,
        other => panic!("expected the fixture's report, got {other:?}"),
    }
}

#[tokio::test]
async fn guest_state_survives_on_a_reused_instance_until_it_served_reuse_deliveries() {
    let limits = per_batch(3, Duration::from_secs(1));
    let (_, metrics, plugin) = load_counted(4, "fixture-mixed", limits);
    for (delivery, runs) in [1, 2, 3, 1, 2, 3, 1].into_iter().enumerate() {
        let report = remember(&plugin).await;
        assert_eq!(report, format!("runs {runs} {runs}"), "run {delivery}");
    }
    assert_eq!(
        instances(&metrics, &plugin),
        (3, 4),
        "instances made, deliveries on a reused one"
    );
}

#[tokio::test]
async fn a_rust_component_gets_a_fresh_instance_for_every_delivery_by_default() {
    let (_, metrics, plugin) =
        load_counted(4, "fixture-mixed", language_default(Duration::from_secs(1)));
    assert_eq!(
        plugin.isolation().to_string(),
        "per-delivery, the default for a compiled (Rust, C, Go) component"
    );
    for round in 0..5 {
        assert_eq!(remember(&plugin).await, "runs 1 1", "run {round}");
    }
    assert_eq!(instances(&metrics, &plugin), (5, 0));
}

/// A fresh Python instance costs about 10 ms of CPU, a JavaScript one about 2 ms: left
/// unset, their isolation is per-batch, found from the components' own metadata.
#[tokio::test]
async fn python_and_javascript_components_reuse_an_instance_by_default() {
    let (runtime, metrics) = counted_runtime(2);
    for (name, language) in [
        ("enrollment-py", Language::Python),
        ("enrollment-js", Language::JavaScript),
    ] {
        let plugin = load(&runtime, name, language_default(Duration::from_secs(10)));
        let expected = IsolationChoice {
            isolation: Isolation::PerBatch { reuse: 64 },
            default_for: Some(language),
        };
        assert_eq!(plugin.isolation(), expected, "{name}");
        assert_eq!(
            plugin.isolation().to_string(),
            format!("per-batch (reuse 64), the default for a {language} component")
        );
        let counts = enroll_all(&plugin, &metrics, 3).await;
        assert_eq!(counts, (1, 2), "{name}: made, reused");
    }
}

/// `isolation = "per-delivery"` set in the config holds for a Python component too.
#[tokio::test]
async fn an_explicit_per_delivery_holds_for_a_python_component() {
    let (runtime, metrics) = counted_runtime(2);
    let limits = PluginLimits {
        isolation: Some(Isolation::PerDelivery),
        ..language_default(Duration::from_secs(10))
    };
    let plugin = load(&runtime, "enrollment-py", limits);
    assert_eq!(
        plugin.isolation().to_string(),
        "per-delivery, set in the config"
    );
    let counts = enroll_all(&plugin, &metrics, 2).await;
    assert_eq!(counts, (2, 0), "made, reused");
}

#[tokio::test]
async fn verdicts_keep_the_instance_and_a_trap_drops_it() {
    let limits = per_batch(100, Duration::from_secs(1));
    let (_, metrics, plugin) = load_counted(4, "fixture-mixed", limits);
    assert_eq!(remember(&plugin).await, "runs 1 1");
    // A retry verdict (attempt 1 of 5) and an ack are verdicts like any other.
    let out = verdict(&plugin, "m-retry", "retry-until-5").await;
    assert!(matches!(out.verdict, Verdict::Retry(_)));
    let out = verdict(&plugin, "m-ack", "ok").await;
    assert!(matches!(out.verdict, Verdict::Ack), "{:?}", out.verdict);
    assert_eq!(remember(&plugin).await, "runs 2 2", "the same instance");
    match run(&plugin, "m-trap", "trap").await {
        Err(PluginFailure::Trap(why)) => assert!(why.contains("panicked"), "{why}"),
        other => panic!("expected a trap, got {other:?}"),
    }
    assert_eq!(
        remember(&plugin).await,
        "runs 1 1",
        "an instance that trapped is never used again"
    );
    assert_eq!(instances(&metrics, &plugin), (2, 4));
}

/// Runs enrollment `i` (ids `M{i}`, message `m-{i}`) and checks that its effects, and only
/// its own, came back: one kv read and write of its record, three events caused by it.
async fn enroll(plugin: &Plugin, i: u32) {
    let body = format!(r#"{{"matricula_id":"M{i}","usuario_id":"U{i}","curso_id":"C{i}"}}"#);
    let id = format!("m-{i}");
    let out = verdict(plugin, &id, &body).await;
    assert!(matches!(out.verdict, Verdict::Ack), "{:?}", out.verdict);
    let key = format!("matricula/M{i}");
    let reads: Vec<&String> = out.effects.reads.keys().collect();
    let writes: Vec<&String> = out.effects.writes.keys().collect();
    assert_eq!((reads, writes), (vec![&key], vec![&key]), "delivery {i}");
    assert_eq!(out.effects.events.len(), 3, "delivery {i}");
    for event in &out.effects.events {
        assert_eq!(
            event.headers,
            [("x-causation-id".to_owned(), id.clone())],
            "delivery {i}"
        );
        let payload = String::from_utf8_lossy(&event.payload);
        assert!(payload.contains(&format!("\"M{i}\"")), "{payload}");
    }
    assert_eq!(out.store_error, None);
}

/// Runs enrollments 1 to `n` on `plugin`; its instances made and reused so far.
async fn enroll_all(plugin: &Plugin, metrics: &Metrics, n: u32) -> (u64, u64) {
    for i in 1..=n {
        enroll(plugin, i).await;
    }
    instances(metrics, plugin)
}

#[tokio::test]
async fn effects_of_one_delivery_never_reach_the_next_on_the_same_instance() {
    let limits = per_batch(10, Duration::from_secs(1));
    let (runtime, metrics, plugin) = load_counted(4, "enrollment", limits);
    for i in 1..=3 {
        enroll(&plugin, i).await;
    }
    assert_eq!(
        instances(&metrics, &plugin),
        (1, 2),
        "all three on one instance"
    );
    // A delivery that writes nothing shows nothing, after one that wrote.
    let limits = per_batch(10, Duration::from_secs(1));
    let mixed = load(&runtime, "fixture-mixed", limits);
    let out = verdict(&mixed, "m-a", "ok").await;
    assert_eq!(out.effects.writes.keys().collect::<Vec<_>>(), ["done/m-a"]);
    let out = verdict(&mixed, "m-r", "remember").await;
    match &out.verdict {
        Verdict::DeadLetter(report) => assert_eq!(report, "runs 1 1"),
        other => panic!("expected the fixture's report, got {other:?}"),
    }
    assert!(out.effects.writes.is_empty());
    assert!(out.effects.reads.is_empty());
    assert!(out.effects.events.is_empty());
    assert_eq!(instances(&metrics, &mixed), (1, 1));
}

/// The point of it: a Python or JavaScript interpreter keeps running between deliveries. Each
/// delivery still gets its own effects.
#[tokio::test]
async fn python_and_javascript_instances_serve_several_deliveries() {
    let (runtime, metrics) = counted_runtime(2);
    for name in ["enrollment-py", "enrollment-js"] {
        let limits = PluginLimits {
            memory_bytes: 64 << 20,
            ..per_batch(3, Duration::from_secs(10))
        };
        let plugin = load(&runtime, name, limits);
        let counts = enroll_all(&plugin, &metrics, 4).await;
        assert_eq!(counts, (2, 2), "{name}: made, reused");
    }
}

#[tokio::test]
async fn per_delivery_limits_apply_afresh_on_a_reused_instance() {
    let (runtime, _) = counted_runtime(4);
    // One host call and 16 kv bytes per delivery: an ack (`kv::set("done/m-N", "1")`, 9
    // bytes) fits once per delivery, never twice.
    let mut limits = per_batch(100, Duration::from_millis(300));
    limits.max_host_calls = 1;
    limits.totals.kv_bytes = 16;
    let plugin = load(&runtime, "fixture-mixed", limits);
    assert_eq!(remember(&plugin).await, "runs 1 1");
    for i in 0..4 {
        let out = run(&plugin, &format!("m-{i}"), "ok")
            .await
            .expect("each delivery has host calls and kv bytes of its own");
        assert!(matches!(out.verdict, Verdict::Ack), "{:?}", out.verdict);
    }
    // The deadline is the delivery's, not the instance's.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(remember(&plugin).await, "runs 2 2", "same instance");
    // And it still stops a reused instance that loops.
    let started = Instant::now();
    assert_eq!(
        run(&plugin, "m-spin", "spin").await.err(),
        Some(PluginFailure::Timeout(Duration::from_millis(300)))
    );
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1_000), "late: {took:?}");
    assert_eq!(
        remember(&plugin).await,
        "runs 1 1",
        "a timed-out instance is dropped"
    );

    // The host-call cap holds on a reused instance too.
    let mut limits = per_batch(100, Duration::from_secs(1));
    limits.max_host_calls = 0;
    let capped = load(&runtime, "fixture-mixed", limits);
    assert_eq!(remember(&capped).await, "runs 1 1");
    assert_eq!(remember(&capped).await, "runs 2 2");
    assert_eq!(
        run(&capped, "m-c", "ok").await.err(),
        Some(PluginFailure::HostCallLimit(0))
    );
    assert_eq!(remember(&capped).await, "runs 1 1");
}

#[tokio::test]
async fn idle_instances_never_starve_another_plugin_of_instance_slots() {
    let limits = per_batch(100, Duration::from_secs(1));
    let (runtime, metrics, reusing) = load_counted(1, "fixture-mixed", limits);
    assert_eq!(remember(&reusing).await, "runs 1 1");
    // The runtime's only slot is held by that idle instance; another plugin still runs.
    let limits = plugin_limits(Duration::from_secs(1), 32 << 20, 1_000, 10);
    let noop = load(&runtime, "noop", limits);
    let out = tokio::time::timeout(Duration::from_secs(10), run(&noop, "m-n", "{}"))
        .await
        .expect("not starved of a slot")
        .expect("no failure");
    assert!(matches!(out.verdict, Verdict::Ack), "{:?}", out.verdict);
    assert_eq!(
        remember(&reusing).await,
        "runs 1 1",
        "the idle instance gave its slot up"
    );
    assert_eq!(instances(&metrics, &reusing), (2, 0));
}

#[tokio::test]
async fn concurrent_deliveries_never_share_an_instance() {
    let limits = per_batch(1_000, Duration::from_secs(5));
    let (_, metrics, plugin) = load_counted(8, "fixture-mixed", limits);
    let plugin = Arc::new(plugin);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let plugin = plugin.clone();
        tasks.spawn(async move {
            let report = remember(&plugin).await;
            let counts: Vec<u32> = report
                .strip_prefix("runs ")
                .unwrap_or_else(|| panic!("not a report: {report}"))
                .split(' ')
                .map(|n| n.parse().expect("a count"))
                .collect();
            (report, counts)
        });
    }
    let mut runs = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (report, counts) = joined.expect("task");
        // The static and the heap agree: no two deliveries ran on one instance at once.
        assert_eq!(counts[0], counts[1], "{report}");
        runs.push(counts[0]);
    }
    let (created, reused) = instances(&metrics, &plugin);
    assert_eq!(created + reused, 32);
    // Each instance counted 1, 2, .. its deliveries: as many 1s as instances made.
    let firsts = runs.iter().filter(|&&n| n == 1).count();
    assert_eq!(firsts as u64, created, "{runs:?}");
}

/// The gateway: a per-batch route with `reuse = 4`, one delivery at a time, runs 10 messages
/// on 3 instances (4 + 4 + 2) and acks each once.
#[tokio::test]
async fn a_per_batch_route_acks_every_message_once_on_few_instances() {
    let metrics = Arc::new(Metrics::default());
    let route = Route::start_from("reuse", metrics.clone(), |queue, exchange| {
        let plugin_lines = "isolation = \"per-batch\"\nreuse = 4\nmax_concurrency = 1";
        route_config_with(queue, "fixture-mixed", exchange, "", plugin_lines, "")
    })
    .await;
    for i in 0..10 {
        route.publish(json_props(&format!("r-{i}")), b"ok").await;
    }
    wait_for("10 deliveries acked", Duration::from_secs(30), || async {
        (metrics.delivered(&route.queue, Outcome::Acked) >= 10).then_some(())
    })
    .await;
    for i in 0..10 {
        let done = committed(&route.gw.store, "fixture-mixed", &format!("done/r-{i}")).await;
        assert_eq!(done.value, b"1", "r-{i}");
        assert_eq!(done.version, 1, "r-{i} applied once");
    }
    assert_eq!(metrics.delivered(&route.queue, Outcome::Acked), 10);
    let version = sha256_of(&plugin("fixture-mixed"));
    assert_eq!(
        metrics.plugin_instances("fixture-mixed", short_version(&version)),
        (3, 7),
        "instances made, deliveries on a reused one"
    );
    let text = metrics.encode();
    assert!(
        text.contains("carteiro_plugin_instances_created_total{plugin=\"fixture-mixed\""),
        "{text}"
    );
    route.gw.stop().await;
}

/// `carteiro check` says which isolation each plugin got and why, from the config or the
/// component's language (the same words as the `plugin loaded` log line).
#[tokio::test]
async fn check_names_each_plugins_isolation_and_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("carteiro.toml");
    let toml = format!(
        "version = 1\n[broker]\nurl = \"amqp://127.0.0.1:1/%2f\"\n[store]\nurl = \"sqlite://{db}\"\n\
         [plugins.py]\npath = \"{py}\"\nmemory = \"64MiB\"\n\
         [plugins.js]\npath = \"{js}\"\nisolation = \"per-delivery\"\n\
         [plugins.rust]\npath = \"{rust}\"\n",
        db = dir.path().join("store.db").display(),
        py = plugin("enrollment-py").display(),
        js = plugin("enrollment-js").display(),
        rust = plugin("enrollment").display(),
    );
    std::fs::write(&config, toml).expect("config");
    let mut check = crate::resilience::carteiro();
    check.args(["check", "--no-environment", "-c"]).arg(&config);
    let out = crate::resilience::run_to_end(check, Duration::from_secs(240)).await;
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    for line in [
        "plugin   py: loads",
        "isolation per-batch (reuse 64), the default for a Python component",
        "isolation per-delivery, set in the config",
        "isolation per-delivery, the default for a compiled (Rust, C, Go) component",
    ] {
        assert!(out.stdout.contains(line), "{line}: {}", out.stdout);
    }
}
