//! The sandbox with real components: every fixture ends as a classified failure within its
//! budget, the host stays healthy, and bad components are refused at load with clear errors.

use crate::support::{message_header, plugin, plugin_limits};
use carteiro::cli::MemoryKv;
use carteiro::runtime::{
    LoadError, Message, Plugin, PluginFailure, PluginLimits, Runtime, Verdict,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn limits(timeout_ms: u64) -> PluginLimits {
    plugin_limits(Duration::from_millis(timeout_ms), 32 << 20, 1_000, 10)
}

fn load(runtime: &Arc<Runtime>, name: &str, vars: &[(&str, &str)]) -> Plugin {
    let vars: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Plugin::load(runtime, name, &plugin(name), None, limits(1_000), vars).expect("plugin loads")
}

fn message(body: &str) -> Message {
    Message {
        id: Some("m-1".into()),
        exchange: "matriculas".into(),
        routing_key: "matricula.confirmada".into(),
        headers: vec![message_header("x-test", "1")],
        content_type: Some("application/json".into()),
        body: body.as_bytes().to_vec(),
        attempt: 1,
        redelivered: false,
    }
}

async fn run(plugin: &Plugin, body: &str) -> Result<carteiro::runtime::Invocation, PluginFailure> {
    plugin
        .handle(&message(body), Arc::new(MemoryKv::default()))
        .await
}

const GOOD: &str = r#"{"matricula_id":"M1","usuario_id":"U1","curso_id":"C1"}"#;

#[tokio::test]
async fn enrollment_acks_with_kv_record_and_three_events() {
    let runtime = Runtime::new(8).expect("runtime");
    let plugin = load(&runtime, "enrollment", &[]);
    let out = run(&plugin, GOOD).await.expect("no failure");
    assert!(matches!(out.verdict, Verdict::Ack), "{:?}", out.verdict);
    assert!(
        out.effects.writes.contains_key("matricula/M1"),
        "{:?}",
        out.effects.writes.keys()
    );
    let keys: Vec<&str> = out
        .effects
        .events
        .iter()
        .map(|e| e.routing_key.as_str())
        .collect();
    assert_eq!(
        keys,
        ["acesso.liberado", "fatura.solicitada", "email.solicitado"]
    );
    assert!(
        out.effects
            .events
            .iter()
            .all(|e| e.exchange == "carteiro.events")
    );
    assert!(
        out.effects
            .events
            .iter()
            .all(|e| e.event_id.get_version_num() == 7)
    );
}

#[tokio::test]
async fn enrollment_dead_letters_malformed_payload_naming_the_field() {
    let runtime = Runtime::new(8).expect("runtime");
    let plugin = load(&runtime, "enrollment", &[]);
    let out = run(&plugin, r#"{"matricula_id":"M1","usuario_id":"U1"}"#)
        .await
        .expect("no failure");
    match out.verdict {
        Verdict::DeadLetter(reason) => assert!(reason.contains("curso_id"), "{reason}"),
        other => panic!("expected dead-letter, got {other:?}"),
    }
    let out = run(&plugin, "not json").await.expect("no failure");
    assert!(matches!(out.verdict, Verdict::DeadLetter(_)));
    assert!(out.effects.events.is_empty());
}

#[tokio::test]
async fn enrollment_retries_while_content_service_is_down() {
    let runtime = Runtime::new(8).expect("runtime");
    let plugin = load(&runtime, "enrollment", &[("content_service", "down")]);
    let out = run(&plugin, GOOD).await.expect("no failure");
    match out.verdict {
        Verdict::Retry(r) => assert!(r.reason.contains("content service"), "{}", r.reason),
        other => panic!("expected retry, got {other:?}"),
    }
}

/// G5: a fresh instance per delivery. Pool slots keep their memory mapped between
/// instances (reset page by page), so prove that no static or heap state of an earlier run
/// is visible to a later one, on one slot and across several.
#[tokio::test]
async fn no_guest_state_survives_from_one_delivery_to_the_next() {
    let runtime = Runtime::new(2).expect("runtime");
    let plugin = load(&runtime, "fixture-mixed", &[]);
    for round in 0..20 {
        let out = run(&plugin, "remember").await.expect("no failure");
        match out.verdict {
            Verdict::DeadLetter(reason) => assert_eq!(reason, "runs 1 1", "run {round}"),
            other => panic!("expected the fixture's report, got {other:?}"),
        }
    }
    let runs: Vec<_> = (0..8).map(|_| run(&plugin, "remember")).collect();
    for out in futures::future::join_all(runs).await {
        let verdict = out.expect("no failure").verdict;
        assert!(
            matches!(&verdict, Verdict::DeadLetter(r) if r == "runs 1 1"),
            "{verdict:?}"
        );
    }
}

#[tokio::test]
async fn fixtures_fail_classified_and_the_host_stays_healthy() {
    let runtime = Runtime::new(8).expect("runtime");
    let noop = load(&runtime, "noop", &[]);

    let trap = load(&runtime, "fixture-trap", &[]);
    match run(&trap, "{}").await {
        Err(PluginFailure::Trap(msg)) => assert!(msg.contains("panicked"), "{msg}"),
        other => panic!("trap: {other:?}"),
    }

    let spin = Plugin::load(
        &runtime,
        "fixture-spin",
        &plugin("fixture-spin"),
        None,
        limits(300),
        BTreeMap::new(),
    )
    .expect("load");
    let started = Instant::now();
    assert_eq!(
        run(&spin, "{}").await.err(),
        Some(PluginFailure::Timeout(Duration::from_millis(300)))
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(300 + 700),
        "timeout fired late: {took:?}"
    );

    match run(&load(&runtime, "fixture-hog", &[]), "{}").await {
        Err(PluginFailure::Memory(msg)) => assert!(msg.contains("memory limit"), "{msg}"),
        other => panic!("hog: {other:?}"),
    }
    match run(&load(&runtime, "fixture-recurse", &[]), "{}").await {
        Err(PluginFailure::Trap(msg)) => assert!(msg.contains("stack overflow"), "{msg}"),
        other => panic!("recurse: {other:?}"),
    }
    assert_eq!(
        run(&load(&runtime, "fixture-flood", &[]), "{}").await.err(),
        Some(PluginFailure::HostCallLimit(1_000))
    );

    // After all of that, the same runtime still serves healthy plugins.
    let out = run(&noop, "{}").await.expect("noop still runs");
    assert!(matches!(out.verdict, Verdict::Ack));
}

#[tokio::test]
async fn concurrent_deliveries_get_isolated_instances() {
    let runtime = Runtime::new(8).expect("runtime");
    let plugin = Arc::new(load(&runtime, "enrollment", &[]));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..32 {
        let plugin = plugin.clone();
        tasks.spawn(async move {
            let body = format!(r#"{{"matricula_id":"M{i}","usuario_id":"U","curso_id":"C"}}"#);
            let out = plugin
                .handle(&message(&body), Arc::new(MemoryKv::default()))
                .await
                .expect("ok");
            (i, out.effects.writes.keys().cloned().collect::<Vec<_>>())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (i, keys) = joined.expect("task");
        assert_eq!(keys, [format!("matricula/M{i}")]);
    }
}

#[test]
fn digest_mismatch_is_refused_at_load() {
    let runtime = Runtime::new(2).expect("runtime");
    let wrong = "0".repeat(64);
    let err = Plugin::load(
        &runtime,
        "noop",
        &plugin("noop"),
        Some(&wrong),
        limits(100),
        BTreeMap::new(),
    )
    .err()
    .expect("must refuse");
    assert!(matches!(err, LoadError::DigestMismatch { .. }));
    let text = err.to_string();
    assert!(text.contains("sha256") && text.contains(&wrong), "{text}");
}

#[test]
fn core_module_and_wrong_world_are_refused_with_clear_errors() {
    let runtime = Runtime::new(2).expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").expect("write");
    let err = Plugin::load(&runtime, "core", &core, None, limits(100), BTreeMap::new())
        .err()
        .expect("refused");
    assert!(matches!(err, LoadError::NotAComponent { .. }), "{err}");
    assert!(err.to_string().contains("wasm32-wasip2"), "{err}");

    // An empty component is a valid component that exports nothing.
    let empty = dir.path().join("empty.wasm");
    std::fs::write(&empty, b"\0asm\x0d\0\x01\0").expect("write");
    let err = Plugin::load(
        &runtime,
        "empty",
        &empty,
        None,
        limits(100),
        BTreeMap::new(),
    )
    .err()
    .expect("refused");
    assert!(matches!(err, LoadError::WrongWorld { .. }), "{err}");
    assert!(err.to_string().contains("carteiro:handler@0.1.0"), "{err}");
}

#[test]
fn the_compile_cache_serves_the_second_load_and_misses_a_changed_component() {
    let dir = tempfile::tempdir().expect("tempdir");
    let load_in = |path: &std::path::Path| {
        let runtime = Runtime::with_compile_cache(2, Some(dir.path())).expect("runtime");
        Plugin::load(&runtime, "p", path, None, limits(1000), BTreeMap::new()).expect("load");
        runtime.compile_cache_stats().expect("cache on")
    };
    let noop = plugin("noop");
    assert_eq!(load_in(&noop), (0, 1), "first start compiles");
    assert_eq!(load_in(&noop), (1, 0), "second start reuses the artifact");
    // One byte more (a custom section) is another component: compiled afresh.
    let mut bytes = std::fs::read(&noop).expect("read");
    bytes.extend_from_slice(&[0x00, 0x04, 0x01, b'x', 0x00, 0x00]);
    let changed = dir.path().join("changed.wasm");
    std::fs::write(&changed, bytes).expect("write");
    assert_eq!(load_in(&changed), (0, 1), "a changed component misses");
    assert!(
        Runtime::new(2)
            .expect("runtime")
            .compile_cache_stats()
            .is_none()
    );
}

/// What a run decided and did, without the random event ids.
fn outcome(out: &carteiro::runtime::Invocation) -> (String, String, String) {
    let verdict = match &out.verdict {
        Verdict::Ack => "ack".to_owned(),
        Verdict::Retry(r) => format!("retry {}", r.reason),
        // Both word it from serde's error; only the kind has to agree.
        Verdict::DeadLetter(_) => "dead-letter".to_owned(),
    };
    let events: Vec<_> = out
        .effects
        .events
        .iter()
        .map(|e| {
            let payload = String::from_utf8_lossy(&e.payload).into_owned();
            (
                &e.exchange,
                &e.routing_key,
                &e.headers,
                &e.content_type,
                payload,
            )
        })
        .collect();
    (
        verdict,
        format!("{:?} {:?}", out.effects.reads, out.effects.writes),
        format!("{events:?}"),
    )
}

#[tokio::test]
async fn the_native_enrollment_handler_decides_and_emits_what_the_component_does() {
    use carteiro::runtime::KvValue;
    use native_enrollment::Enrollment;
    let runtime = Runtime::new(8).expect("runtime");
    let numeric = r#"{"matricula_id":7,"usuario_id":8,"curso_id":"C9"}"#;
    let cases: [(&str, &str, Option<&str>); 7] = [
        (GOOD, "up", None),
        (numeric, "up", None),
        (GOOD, "down", None),
        (r#"{"matricula_id":"M1","usuario_id":"U1"}"#, "up", None),
        ("{oops", "up", None),
        // The same enrollment recorded already, and recorded with other ids.
        (
            GOOD,
            "up",
            Some(r#"{"matricula_id":"M1","usuario_id":"U1","curso_id":"C1"}"#),
        ),
        (
            GOOD,
            "up",
            Some(r#"{"matricula_id":"M1","usuario_id":"U2","curso_id":"C1"}"#),
        ),
    ];
    for (body, service, recorded) in cases {
        let vars = [
            ("events_exchange", "escola.eventos"),
            ("content_service", service),
        ];
        let wasm = load(&runtime, "enrollment", &vars);
        let variables = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let native = Plugin::native(
            &runtime,
            "enrollment",
            Arc::new(Enrollment),
            limits(1_000),
            variables,
        );
        let kv = || {
            let kv = MemoryKv::default();
            if let Some(record) = recorded {
                let value = KvValue {
                    value: record.as_bytes().to_vec(),
                    version: 3,
                };
                kv.preset("enrollment", "matricula/M1", Some(value));
            }
            Arc::new(kv)
        };
        let a = wasm
            .handle(&message(body), kv())
            .await
            .expect("component runs");
        let b = native
            .handle(&message(body), kv())
            .await
            .expect("native runs");
        assert_eq!(
            outcome(&a),
            outcome(&b),
            "body {body}, content_service {service}, recorded {recorded:?}"
        );
    }
}

#[path = "../../host/benches/native_enrollment.rs"]
mod native_enrollment;
