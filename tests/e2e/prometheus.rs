//! Issue 39, the operator's own stack: a real Prometheus (Debian's `prometheus`, which
//! scripts/test.sh installs) scrapes the real gateway binary with the shipped rules
//! (deploy/prometheus/carteiro-rules.yml). 100 messages dead-lettered on one route make
//! `CarteiroDeadLetters` fire within a minute, then resolve; every query of the Grafana
//! dashboard (deploy/grafana/carteiro.json) runs on that Prometheus and returns data.

use crate::live::free_port;
use crate::resilience::{Running, carteiro};
use crate::support::{
    Client, http_exchange, json_props, repo, route_config, unique, wait_for, wait_listening,
};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The shipped window of the dead-letter alert, and the one this test evaluates it over: an
/// hour would keep the alert firing for an hour. Only the window changes; the threshold,
/// labels and annotations are the shipped ones (promtool's unit tests cover the hour).
const SHIPPED_WINDOW: &str = "increase(carteiro_dead_letters_total[1h])";
const TEST_WINDOW: &str = "increase(carteiro_dead_letters_total[1m])";

/// One GET to Prometheus's HTTP API; the `data` of a `success` answer.
async fn api(port: u16, path_and_query: &str) -> Value {
    let request = format!("GET {path_and_query} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let (status, _, body) =
        http_exchange(port, &request, Duration::from_secs(30), path_and_query).await;
    let answer: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("{path_and_query}: {status} {e}: {body}"));
    assert_eq!(answer["status"], "success", "{path_and_query}: {body}");
    answer["data"].clone()
}

fn encoded(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The result of an instant query.
async fn query(port: u16, expr: &str) -> Value {
    let data = api(port, &format!("/api/v1/query?query={}", encoded(expr))).await;
    data["result"].clone()
}

/// Waits (a minute at most) until `expr`'s first sample reads `want`.
async fn wait_for_value(port: u16, what: &str, expr: &str, want: &str) {
    wait_for(what, Duration::from_secs(60), || async {
        (query(port, expr).await[0]["value"][1] == want).then_some(())
    })
    .await;
}

/// The active alerts named `name` on `route`: (state, value).
async fn alerts(port: u16, name: &str, route: &str) -> Vec<(String, String)> {
    let data = api(port, "/api/v1/alerts").await;
    data["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["labels"]["alertname"] == name && a["labels"]["route"] == route)
        .map(|a| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (text(&a["state"]), text(&a["value"]))
        })
        .collect()
}

/// Prometheus on `port` scraping the gateway's admin server every second, evaluating the
/// shipped rules (with [`TEST_WINDOW`]) every second.
fn start_prometheus(dir: &Path, port: u16, gateway_admin: u16) -> Running {
    let shipped = std::fs::read_to_string(repo().join("deploy/prometheus/carteiro-rules.yml"))
        .expect("the shipped rules");
    assert_eq!(
        shipped.matches(SHIPPED_WINDOW).count(),
        1,
        "the dead-letter window this test shortens"
    );
    std::fs::write(
        dir.join("rules.yml"),
        shipped.replace(SHIPPED_WINDOW, TEST_WINDOW),
    )
    .expect("rules");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yml]\n\
         scrape_configs:\n  - job_name: carteiro\n    static_configs:\n      - targets: ['127.0.0.1:{gateway_admin}']\n"
    );
    std::fs::write(dir.join("prometheus.yml"), config).expect("prometheus.yml");
    let Ok(binary) = which("prometheus") else {
        panic!("no `prometheus` on PATH: scripts/test.sh installs Debian's package");
    };
    let mut cmd = Command::new(binary);
    cmd.current_dir(dir)
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(std::process::Stdio::null());
    Running::spawn(cmd)
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or(())
}

/// Every query of the dashboard, with Grafana's variables set as a viewer of all routes
/// would have them.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/carteiro.json"))
        .expect("the dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let queries: Vec<(String, String)> = panels
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| {
                    (
                        title.clone(),
                        t["expr"].as_str().unwrap_or_default().to_owned(),
                    )
                })
        })
        .map(|(title, expr)| {
            let expr = expr
                .replace("$__rate_interval", "1m")
                .replace("$route", ".*");
            (title, expr)
        })
        .collect();
    assert!(queries.len() >= 13, "{queries:?}");
    queries
}

#[tokio::test]
async fn the_dead_letter_alert_fires_and_resolves_in_a_real_prometheus() {
    let (queue, exchange) = (unique("prom-dlq"), unique("in"));
    let client = Client::connect().await;
    client.sink(&exchange).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (admin, prom_port) = (free_port(), free_port());
    let toml = route_config(
        &queue,
        "fixture-mixed",
        &exchange,
        "",
        "on_plugin_failure = \"dead-letter\"",
    )
    .replace(
        "[admin]\nlisten = \"\"",
        &format!("[admin]\nlisten = \"127.0.0.1:{admin}\""),
    )
    .replace("{dir}", &dir.path().display().to_string());
    let config = dir.path().join("carteiro.toml");
    std::fs::write(&config, toml).expect("config");
    let mut cmd = carteiro();
    cmd.args(["run", "-c"]).arg(&config);
    let mut gateway = Running::spawn(cmd);
    gateway
        .wait_stderr("gateway running", Duration::from_secs(60))
        .await;
    client.wait_for_consumer(&queue).await;

    let prom_dir = tempfile::tempdir().expect("tempdir");
    let _prometheus = start_prometheus(prom_dir.path(), prom_port, admin);
    wait_listening("Prometheus", prom_port, Duration::from_secs(60)).await;
    // It listens before its storage is open, answering 503 until then.
    wait_for(
        "Prometheus to be ready",
        Duration::from_secs(60),
        || async {
            let request = "GET /-/ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
            let (status, _, _) =
                http_exchange(prom_port, request, Duration::from_secs(10), "/-/ready").await;
            (status == 200).then_some(())
        },
    )
    .await;
    // The route's counters exist at 0 before any delivery: the burst's first sample has a
    // zero before it, so `increase()` counts all of it.
    let zero = format!("carteiro_dead_letters_total{{route=\"{queue}\",reason_class=\"trap\"}}");
    wait_for_value(prom_port, "Prometheus to scrape the zero", &zero, "0").await;
    assert!(
        alerts(prom_port, "CarteiroDeadLetters", &queue)
            .await
            .is_empty()
    );

    // Some good and retried traffic too, for the dashboard's latency and retry panels.
    let bodies = ["ok"; 10].into_iter().chain(["retry-until-2"; 5]);
    for body in bodies.chain(["trap"; 100]) {
        let id = unique(body);
        client
            .publish(&exchange, "k", json_props(&id), body.as_bytes())
            .await;
    }
    let dead = format!("sum(carteiro_dead_letters_total{{route=\"{queue}\"}})");
    wait_for_value(prom_port, "100 dead letters scraped", &dead, "100").await;
    let counted = Instant::now();
    let firing = wait_for(
        "CarteiroDeadLetters to fire",
        Duration::from_secs(60),
        || async {
            let found = alerts(prom_port, "CarteiroDeadLetters", &queue).await;
            found.into_iter().find(|(state, _)| state == "firing")
        },
    )
    .await;
    assert!(
        counted.elapsed() < Duration::from_secs(60),
        "{:?}",
        counted.elapsed()
    );
    let value: f64 = firing.1.parse().expect("a number");
    assert!(value >= 100.0, "{firing:?}");

    // Every dashboard query runs, and has data for this running gateway.
    for (title, expr) in dashboard_queries() {
        let result = query(prom_port, &expr).await;
        let series = result.as_array().map_or(0, Vec::len);
        assert!(
            series > 0,
            "panel `{title}`: `{expr}` returned no data: {result}"
        );
    }
    let routes = api(
        prom_port,
        &format!(
            "/api/v1/label/route/values?match[]={}",
            encoded("carteiro_deliveries_total")
        ),
    )
    .await;
    assert!(
        routes
            .as_array()
            .is_some_and(|r| r.iter().any(|v| v == queue.as_str())),
        "the dashboard's route variable: {routes}"
    );

    wait_for(
        "CarteiroDeadLetters to resolve",
        Duration::from_secs(150),
        || async {
            alerts(prom_port, "CarteiroDeadLetters", &queue)
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    gateway.kill().await;
}
