//! Canaries (`[plugins.NAME.canary]`) of the real binary: a failing one rolled back by
//! itself, a healthy one promoted by `carteiro canary promote`.

use super::{free_port, http, plugin_version, sample, settled, sha256_of, spawn_gateway};
use crate::live::ADMIN_TOKEN;
use crate::resilience::{Running, carteiro};
use crate::support::{
    Client, dead_letter_route, json_props, load_config, plugin, unique, wait_for,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

/// A fixture-mixed route with a canary at `canary` taking `percent`, admin on `port`.
fn canary_config(
    queue: &str,
    exchange: &str,
    canary: &Path,
    percent: u32,
    min: u32,
    port: u16,
) -> String {
    dead_letter_route(queue, "fixture-mixed", exchange)
        .replacen(
            "[[routes]]",
            &format!(
                "[plugins.fixture-mixed.canary]\npath = \"{}\"\npercent = {percent}\nrollback_on = {{ failure_rate = 0.05, min_deliveries = {min}, window = \"5m\" }}\n\n[[routes]]",
                canary.display()
            ),
            1,
        )
        .replace(
        "listen = \"\"",
        &format!("listen = \"127.0.0.1:{port}\"\ntoken = \"{ADMIN_TOKEN}\""),
    )
}

fn write(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("carteiro.toml");
    std::fs::write(&path, toml).expect("write config");
    path
}

/// The kv value fixture-mixed(-v2) records for an acked message.
async fn done(store: &carteiro::store::Store, id: &str) -> Option<String> {
    store
        .kv_get("fixture-mixed", &format!("done/{id}"))
        .await
        .expect("kv")
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
}

/// Publishes `n` messages `boom` (ids `PREFIX-0..n`) and waits until each is acked: run by
/// the stable version, on which `boom` does not trap (the canary traps on it).
async fn boom_acked_by_stable(
    client: &Client,
    exchange: &str,
    store: &carteiro::store::Store,
    prefix: &str,
    n: usize,
) {
    client.publish_numbered(exchange, prefix, n, b"boom").await;
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        let value = wait_for(&format!("{id} acked"), WAIT, || done(store, &id)).await;
        assert_eq!(value, "1", "{id} ran on the stable version");
    }
}

/// Publishes 40 `fine` messages `PREFIX-0..40` and waits until the gateway's log shows each
/// of them settled; returns their ids and what the log says of every settled message.
async fn publish_until_settled(
    client: &Client,
    exchange: &str,
    gateway: &Running,
    prefix: &str,
) -> (Vec<String>, BTreeMap<String, Vec<(String, String)>>) {
    let ids: Vec<String> = (0..40).map(|i| format!("{prefix}-{i}")).collect();
    for id in &ids {
        client.publish(exchange, "k", json_props(id), b"fine").await;
    }
    let lines = wait_for(
        &format!("every {prefix}-* delivery settled"),
        WAIT,
        || async {
            let s = settled(&gateway.stderr());
            ids.iter().all(|id| s.contains_key(id)).then_some(s)
        },
    )
    .await;
    (ids, lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_failing_a_fifth_of_its_deliveries_is_rolled_back_within_its_window() {
    let (queue, exchange) = (unique("canaryfail"), unique("in"));
    let dir = tempfile::tempdir().expect("tempdir");
    let canary = plugin("fixture-mixed-v2");
    let stable = sha256_of(&plugin("fixture-mixed"));
    let port = free_port();
    let path = write(
        dir.path(),
        &canary_config(&queue, &exchange, &canary, 50, 20, port),
    );
    let config = load_config(dir.path(), &std::fs::read_to_string(&path).expect("read"));
    let client = Client::connect().await;
    let mut gateway = spawn_gateway(&path);
    client.wait_for_consumer(&queue).await;
    let (_, ready) = http(port, "GET", "/readyz").await;
    assert!(ready.contains("(50% of deliveries): active"), "{ready}");
    // One message in five fails on the canary (it traps on `boom`); none on the stable one.
    for i in 0..200 {
        let body: &[u8] = if i % 5 == 0 { b"boom" } else { b"fine" };
        client
            .publish(&exchange, "k", json_props(&format!("m-{i}")), body)
            .await;
    }
    gateway.wait_stderr("canary rolled back", WAIT).await;
    let stderr = gateway.stderr();
    let rolled = stderr
        .lines()
        .find(|l| l.contains("canary rolled back"))
        .unwrap_or_default();
    eprintln!("canary: {rolled}");
    assert!(rolled.contains("\"level\":\"ERROR\""), "{rolled}");
    assert!(rolled.contains("against the stable version"), "{rolled}");
    let (status, ready) = http(port, "GET", "/readyz").await;
    assert_eq!(status, 200);
    assert!(ready.contains("ROLLED BACK: failure rate"), "{ready}");
    let (_, m) = http(port, "GET", "/metrics").await;
    assert_eq!(
        sample(
            &m,
            "carteiro_canary_rollbacks_total{plugin=\"fixture-mixed\"}"
        ),
        1.0,
        "{m}"
    );
    let v2 = &sha256_of(&canary)[..12];
    assert_eq!(
        sample(
            &m,
            &format!("carteiro_canary_percent{{plugin=\"fixture-mixed\",version=\"{v2}\"}}")
        ),
        0.0
    );

    // From now on every delivery runs on the stable version: `boom` acks again.
    let store = carteiro::services::open_store(&config)
        .await
        .expect("store");
    boom_acked_by_stable(&client, &exchange, &store, "after", 40).await;
    let lines = wait_for("the settled lines of the later messages", WAIT, || async {
        let s = settled(&gateway.stderr());
        (0..40)
            .all(|i| s.contains_key(&format!("after-{i}")))
            .then_some(s)
    })
    .await;
    for i in 0..40 {
        let runs = &lines[&format!("after-{i}")];
        assert_eq!(
            runs,
            &vec![(stable.clone(), "acked".to_owned())],
            "after-{i}"
        );
    }
    gateway.kill().await;

    // The rollback is kept in the store: a restarted gateway (or any other on that store)
    // does not start the same canary again, nor does a reload that changes its settings.
    let mut gateway = spawn_gateway(&path);
    client.wait_for_consumer(&queue).await;
    let (_, ready) = http(port, "GET", "/readyz").await;
    assert!(
        ready.contains("ROLLED BACK: failure rate"),
        "after a restart: {ready}"
    );
    let changed = std::fs::read_to_string(&path)
        .expect("read")
        .replace("timeout = \"2s\"", "timeout = \"3s\"");
    std::fs::write(&path, changed).expect("write");
    let (status, report) = http(port, "POST", "/admin/reload").await;
    assert_eq!(status, 200, "{report}");
    assert!(
        report.contains("fixture-mixed"),
        "the plugin's settings changed: {report}"
    );
    let (_, ready) = http(port, "GET", "/readyz").await;
    assert!(
        ready.contains("ROLLED BACK: failure rate"),
        "after a reload: {ready}"
    );
    boom_acked_by_stable(&client, &exchange, &store, "restarted", 20).await;
    gateway
        .wait_stderr("canary already decided in the store", WAIT)
        .await;
    gateway.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_canary_takes_its_share_by_key_and_is_promoted_by_canary_promote() {
    let (queue, exchange) = (unique("canaryok"), unique("in"));
    let dir = tempfile::tempdir().expect("tempdir");
    let canary = plugin_version("fixture-mixed", dir.path(), "mixed-next.wasm", Some("next"));
    let (stable, next) = (sha256_of(&plugin("fixture-mixed")), sha256_of(&canary));
    let port = free_port();
    let path = write(
        dir.path(),
        &canary_config(&queue, &exchange, &canary, 50, 1000, port),
    );
    let client = Client::connect().await;
    let gateway = spawn_gateway(&path);
    client.wait_for_consumer(&queue).await;
    let (ids, lines) = publish_until_settled(&client, &exchange, &gateway, "p").await;
    let mut on_canary = 0;
    for id in &ids {
        // The share is by the idempotency key's hash: the same key, the same version.
        let want = if carteiro::pipeline::canary::bucket(id) < 50.0 {
            &next
        } else {
            &stable
        };
        assert_eq!(lines[id], vec![(want.clone(), "acked".to_owned())], "{id}");
        on_canary += usize::from(want == &next);
    }
    assert!(
        on_canary > 0 && on_canary < ids.len(),
        "{on_canary} of {} on the canary",
        ids.len()
    );

    let mut cmd = carteiro();
    cmd.args(["canary", "-c"])
        .arg(&path)
        .args(["promote", "fixture-mixed"]);
    let out = Running::spawn(cmd).finish(WAIT).await;
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("promoted by hand"), "{}", out.stdout);
    let (_, ready) = http(port, "GET", "/readyz").await;
    assert!(ready.contains("promoted by hand"), "{ready}");

    let (later, lines) = publish_until_settled(&client, &exchange, &gateway, "q").await;
    for id in &later {
        assert_eq!(
            lines[id],
            vec![(next.clone(), "acked".to_owned())],
            "{id} on the promoted canary"
        );
    }
    let (_, m) = http(port, "GET", "/metrics").await;
    assert_eq!(
        sample(
            &m,
            &format!(
                "carteiro_canary_percent{{plugin=\"fixture-mixed\",version=\"{}\"}}",
                &next[..12]
            )
        ),
        100.0
    );
    assert_eq!(
        sample(
            &m,
            "carteiro_canary_rollbacks_total{plugin=\"fixture-mixed\"}"
        ),
        0.0
    );
    gateway.kill().await;
}
