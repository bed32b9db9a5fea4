//! Reload (SIGHUP, `POST /admin/reload`) of the real binary.

use super::{free_port, http, plugin_version, sample, settled, sha256_of, spawn_gateway};
use crate::live::ADMIN_TOKEN;
use crate::resilience::{Running, counter_value, delete_queue, queue_depth, topology_of};
use crate::support::{self, Client, json_props, load_config, plugin, unique, wait_for};
use std::path::{Path, PathBuf};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

/// A counter route whose plugin file is `plugin_path`, admin server on `port`.
fn counter_config(
    queue: &str,
    exchange: &str,
    events: &str,
    plugin_path: &Path,
    port: u16,
) -> String {
    support::counter_config(queue, exchange, events)
        .replace(
            &plugin("counter").display().to_string(),
            &plugin_path.display().to_string(),
        )
        .replace(
            "listen = \"\"",
            &format!("listen = \"127.0.0.1:{port}\"\ntoken = \"{ADMIN_TOKEN}\""),
        )
}

fn write(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("carteiro.toml");
    std::fs::write(&path, toml.replace("{dir}", &dir.display().to_string())).expect("write config");
    path
}

fn sighup(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill -HUP");
    assert!(status.success());
}

async fn metrics(port: u16) -> String {
    let (status, body) = http(port, "GET", "/metrics").await;
    assert_eq!(status, 200);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_under_load_swaps_the_plugin_with_nothing_lost_or_run_twice() {
    const BACKLOG: usize = 3000;
    const AFTER: usize = 200;
    let (queue, exchange, events) = (unique("reload"), unique("in"), unique("events"));
    let dir = tempfile::tempdir().expect("tempdir");
    let v1 = plugin_version("counter", dir.path(), "counter-v1.wasm", None);
    let v2 = plugin_version("counter", dir.path(), "counter-v2.wasm", Some("v2"));
    let (d1, d2) = (sha256_of(&v1), sha256_of(&v2));
    assert_ne!(d1, d2);
    let port = free_port();
    let path = write(
        dir.path(),
        &counter_config(&queue, &exchange, &events, &v1, port),
    );
    let config = load_config(dir.path(), &std::fs::read_to_string(&path).expect("read"));
    let client = Client::connect().await;
    client.sink(&events).await;
    carteiro::topology::declare_route(&client.conn, &topology_of(&config.routes[0]))
        .await
        .expect("declare the route");
    client
        .publish_numbered(&exchange, "before", BACKLOG, b"{}")
        .await;

    let mut gateway = spawn_gateway(&path);
    gateway.wait_stderr("consumer started", WAIT).await;
    let store = carteiro::services::open_store(&config)
        .await
        .expect("store");
    wait_for("the first commits on v1", WAIT, || async {
        (counter_value(&store, "runs").await >= 100).then_some(())
    })
    .await;
    // The new version, by rewriting the config and SIGHUP, while the backlog drains.
    write(
        dir.path(),
        &counter_config(&queue, &exchange, &events, &v2, port),
    );
    sighup(gateway.pid());
    gateway.wait_stderr("reload applied", WAIT).await;
    let at_reload = counter_value(&store, "runs").await;
    assert!(
        (at_reload as usize) < BACKLOG,
        "the backlog drained before the reload; nothing was under load"
    );
    client
        .publish_numbered(&exchange, "after", AFTER, b"{}")
        .await;
    let total = (BACKLOG + AFTER) as u64;
    wait_for("every message committed", WAIT, || async {
        (counter_value(&store, "runs").await >= total).then_some(())
    })
    .await;

    // Nothing lost, nothing run twice: one commit per message, one settled ack each.
    wait_for("a settled line for every delivery", WAIT, || async {
        (settled(&gateway.stderr()).len() >= BACKLOG + AFTER).then_some(())
    })
    .await;
    assert_eq!(counter_value(&store, "runs").await, total, "no extra runs");
    let lines = settled(&gateway.stderr());
    let (mut on_v1, mut on_v2) = (0u32, 0u32);
    for (prefix, n) in [("before", BACKLOG), ("after", AFTER)] {
        for i in 0..n {
            let id = format!("{prefix}-{i}");
            assert_eq!(
                counter_value(&store, &format!("seen/{id}")).await,
                1,
                "{id}"
            );
            let runs = lines
                .get(&id)
                .unwrap_or_else(|| panic!("{id} never settled"));
            assert_eq!(runs.len(), 1, "{id} settled more than once: {runs:?}");
            let (sha, outcome) = &runs[0];
            assert_eq!(outcome, "acked", "{id}");
            if prefix == "after" {
                assert_eq!(sha, &d2, "{id}, published after the reload, ran on v2");
            }
            match sha {
                s if *s == d1 => on_v1 += 1,
                s if *s == d2 => on_v2 += 1,
                other => panic!("{id} ran on unknown digest {other}"),
            }
        }
    }
    eprintln!(
        "reload under load: {on_v1} deliveries on v1, {on_v2} on v2 (runs at reload {at_reload})"
    );
    assert!(
        on_v1 >= 100 && on_v2 as usize > AFTER,
        "{on_v1} on v1, {on_v2} on v2"
    );

    // Metrics by version label agree with the log; /readyz names the new version.
    let m = metrics(port).await;
    let label = |d: &str| {
        format!(
            "carteiro_plugin_version_deliveries_total{{route=\"{queue}\",version=\"{}\",outcome=\"acked\"}}",
            &d[..12]
        )
    };
    assert_eq!(sample(&m, &label(&d1)), f64::from(on_v1), "{m}");
    assert_eq!(sample(&m, &label(&d2)), f64::from(on_v2), "{m}");
    assert_eq!(sample(&m, "carteiro_reloads_total"), 1.0);
    assert_eq!(sample(&m, "carteiro_config_reload_success"), 1.0);
    let (status, ready) = http(port, "GET", "/readyz").await;
    assert_eq!(status, 200);
    assert!(
        ready.contains(&format!("plugin counter: version {}", &d2[..12])),
        "{ready}"
    );
    assert!(ready.contains("last reload: applied"), "{ready}");
    gateway.kill().await;
}

/// Writes `toml` into `dir` and runs the binary on it (the `events` sink declared first)
/// until `queue` has its consumer: the gateway, a test client and the config's store.
async fn run_config(
    dir: &Path,
    toml: &str,
    events: &str,
    queue: &str,
) -> (Running, Client, carteiro::store::Store) {
    let path = write(dir, toml);
    let config = load_config(dir, &std::fs::read_to_string(&path).expect("read"));
    let client = Client::connect().await;
    client.sink(events).await;
    let gateway = spawn_gateway(&path);
    client.wait_for_consumer(queue).await;
    let store = carteiro::services::open_store(&config)
        .await
        .expect("store");
    (gateway, client, store)
}

/// Publishes message `id`, waits for its commit, and checks it settled once, acked, on the
/// plugin version `want` (sha256).
async fn publish_and_check(
    client: &Client,
    exchange: &str,
    store: &carteiro::store::Store,
    gateway: &Running,
    id: &str,
    want: &str,
) {
    client.publish(exchange, "k", json_props(id), b"{}").await;
    wait_for(&format!("{id} committed"), WAIT, || async {
        (counter_value(store, &format!("seen/{id}")).await == 1).then_some(())
    })
    .await;
    let lines = wait_for(&format!("{id} settled"), WAIT, || async {
        super::settled(&gateway.stderr()).get(id).cloned()
    })
    .await;
    assert_eq!(lines, vec![(want.to_owned(), "acked".to_owned())], "{id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_config_or_a_mismatched_digest_keeps_serving_on_the_old_version() {
    let (queue, exchange, events) = (unique("badreload"), unique("in"), unique("events"));
    let dir = tempfile::tempdir().expect("tempdir");
    let v1 = plugin_version("counter", dir.path(), "counter-v1.wasm", None);
    let v2 = plugin_version("counter", dir.path(), "counter-v2.wasm", Some("v2"));
    let (d1, d2) = (sha256_of(&v1), sha256_of(&v2));
    let port = free_port();
    let good = counter_config(&queue, &exchange, &events, &v1, port);
    let (mut gateway, client, store) = run_config(dir.path(), &good, &events, &queue).await;
    publish_and_check(&client, &exchange, &store, &gateway, "start", &d1).await;

    // 1. A config with an unknown key, by POST /admin/reload: refused, with the key named.
    let broken = good.replace("timeout = \"2s\"", "timeout = \"2s\"\ntimeot = \"3s\"");
    write(dir.path(), &broken);
    let (status, body) = http(port, "POST", "/admin/reload").await;
    assert_eq!(status, 422, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).expect("JSON report");
    assert_eq!(report["applied"], false);
    let error = report["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        error.contains("invalid config") && error.contains("timeot"),
        "{error}"
    );
    gateway.wait_stderr("reload refused", WAIT).await;
    assert!(gateway.stderr().contains("timeot"), "the log says why");
    let (status, ready) = http(port, "GET", "/readyz").await;
    assert_eq!(status, 200, "still serving: {ready}");
    assert!(
        ready.contains("last reload: FAILED") && ready.contains("timeot"),
        "{ready}"
    );
    assert!(ready.contains(&format!("version {}", &d1[..12])), "{ready}");
    let m = metrics(port).await;
    assert_eq!(sample(&m, "carteiro_reload_failures_total"), 1.0, "{m}");
    assert_eq!(sample(&m, "carteiro_config_reload_success"), 0.0, "{m}");
    publish_and_check(&client, &exchange, &store, &gateway, "after-broken", &d1).await;

    // 2. v2 pinned to v1's digest, by SIGHUP: refused, naming both digests.
    let pinned = |file: &Path, sha: &str| {
        counter_config(&queue, &exchange, &events, file, port).replace(
            "timeout = \"2s\"",
            &format!("timeout = \"2s\"\nsha256 = \"{sha}\""),
        )
    };
    write(dir.path(), &pinned(&v2, &d1));
    sighup(gateway.pid());
    wait_for("the second refusal", WAIT, || async {
        (gateway.stderr().matches("reload refused").count() >= 2).then_some(())
    })
    .await;
    let stderr = gateway.stderr();
    let mismatch = format!("has sha256 {d2}, but the config pins {d1}");
    assert!(stderr.contains(&mismatch), "{stderr}");
    let (_, ready) = http(port, "GET", "/readyz").await;
    assert!(
        ready.contains("FAILED") && ready.contains(&mismatch),
        "{ready}"
    );
    assert!(ready.contains(&format!("version {}", &d1[..12])), "{ready}");
    assert_eq!(
        sample(&metrics(port).await, "carteiro_reload_failures_total"),
        2.0
    );
    publish_and_check(&client, &exchange, &store, &gateway, "after-mismatch", &d1).await;

    // 3. The right pin: applied, and deliveries run on v2.
    write(dir.path(), &pinned(&v2, &d2));
    let (status, body) = http(port, "POST", "/admin/reload").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!("{} -> {}", &d1[..12], &d2[..12])),
        "{body}"
    );
    let m = metrics(port).await;
    assert_eq!(sample(&m, "carteiro_config_reload_success"), 1.0);
    assert_eq!(sample(&m, "carteiro_reloads_total"), 1.0);
    publish_and_check(&client, &exchange, &store, &gateway, "after-fix", &d2).await;
    gateway.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_starts_an_added_route_and_stops_a_removed_one() {
    let (qa, qb) = (unique("routea"), unique("routeb"));
    let (xa, xb, events) = (unique("in"), unique("in"), unique("events"));
    let dir = tempfile::tempdir().expect("tempdir");
    let v1 = plugin_version("counter", dir.path(), "counter.wasm", None);
    let port = free_port();
    let only_a = counter_config(&qa, &xa, &events, &v1, port);
    let route_b = format!(
        "\n[[routes]]\nqueue = \"{qb}\"\nplugin = \"counter\"\nprefetch = 4\n[[routes.bindings]]\nexchange = \"{xb}\"\nrouting_key = \"#\"\n"
    );
    let (mut gateway, client, store) = run_config(dir.path(), &only_a, &events, &qa).await;
    let committed = |id: &'static str| {
        let store = store.clone();
        async move {
            wait_for(&format!("{id} committed"), WAIT, || async {
                (counter_value(&store, &format!("seen/{id}")).await == 1).then_some(())
            })
            .await;
        }
    };
    client.publish(&xa, "k", json_props("a-1"), b"{}").await;
    committed("a-1").await;

    // Added: the route's topology is declared and it consumes.
    write(dir.path(), &format!("{only_a}{route_b}"));
    let (status, body) = http(port, "POST", "/admin/reload").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("route `{qb}`: started")), "{body}");
    client.wait_for_consumer(&qb).await;
    client.publish(&xb, "k", json_props("b-1"), b"{}").await;
    committed("b-1").await;
    client.publish(&xa, "k", json_props("a-2"), b"{}").await;
    committed("a-2").await;

    // Removed: route A stops consuming (its queue stays, messages wait there); B goes on.
    let without_a = write_without_route(&only_a, &route_b, &qa);
    write(dir.path(), &without_a);
    let (status, body) = http(port, "POST", "/admin/reload").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("route `{qa}`: stopped")), "{body}");
    gateway.wait_stderr("route removed by reload", WAIT).await;
    wait_for("no consumer on the removed route", WAIT, || async {
        let state = client.queue_state(&qa).await.ok()?;
        (state.consumer_count() == 0).then_some(())
    })
    .await;
    client.publish(&xa, "k", json_props("a-3"), b"{}").await;
    client.publish(&xb, "k", json_props("b-2"), b"{}").await;
    committed("b-2").await;
    assert_eq!(
        queue_depth(&client, &qa).await,
        1,
        "a-3 waits in the removed route's queue"
    );
    assert_eq!(counter_value(&store, "seen/a-3").await, 0);
    let (_, ready) = http(port, "GET", "/readyz").await;
    assert!(ready.contains(&format!("routes: {qb}\n")), "{ready}");
    gateway.kill().await;
    delete_queue(&client, &qa).await;
}

/// The config of `only_a` plus `route_b`, with route `qa` (the first route) taken out.
fn write_without_route(only_a: &str, route_b: &str, qa: &str) -> String {
    let start = only_a
        .find(&format!("[[routes]]\nqueue = \"{qa}\""))
        .expect("route A in the config");
    format!("{}{route_b}", &only_a[..start])
}
