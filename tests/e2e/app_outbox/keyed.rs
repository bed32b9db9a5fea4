//! `[[outboxes]]` on a table of its own design: an ordering key, a routing key that may be
//! NULL, a jsonb payload, a header column, rows deleted once published, and the outbox run
//! inside `carteiro run` with its metrics.

use std::time::Duration;

use super::{AppDb, WAIT};
use crate::resilience::{Running, carteiro, run_to_end};
use crate::support::{Client, amqp_url, http_exchange, message_id, unique, wait_for};

const TABLE: &str = "CREATE TABLE eventos (
    seq bigserial PRIMARY KEY,
    event_id uuid NOT NULL DEFAULT gen_random_uuid(),
    aggregate text,
    topic text,
    body jsonb NOT NULL,
    tenant text,
    created timestamptz NOT NULL DEFAULT now())";

fn config(dir: &std::path::Path, db: &AppDb, exchange: &str, port: u16) -> std::path::PathBuf {
    let toml = format!(
        r#"version = 1
[broker]
url = "{amqp}"
[store]
url = "sqlite://{dir}/carteiro.db"
[admin]
listen = "127.0.0.1:{port}"

[[outboxes]]
name = "eventos"
url = "{url}"
table = "public.eventos"
exchange = "{exchange}"
after_publish = "delete"
poll_interval = "50ms"

[outboxes.columns]
id = "seq"
event_id = "event_id"
key = "aggregate"
routing_key = "topic"
payload = "body"
created_at = "created"
headers = ["tenant"]
"#,
        amqp = amqp_url(),
        dir = dir.display(),
        url = db.url,
    );
    let path = dir.join("carteiro.toml");
    std::fs::write(&path, toml).expect("config");
    path
}

/// The order `messages` arrived in, as `aggregate:n` bodies.
fn bodies(messages: &[lapin::message::BasicGetMessage]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_slice(&m.data).expect("json body");
            v["n"].as_str().expect("n").to_owned()
        })
        .collect()
}

#[tokio::test]
async fn a_parked_row_holds_only_its_key_and_goes_out_first_once_fixed() {
    let db = AppDb::postgres().await;
    db.execute(TABLE).await;
    let client = Client::connect().await;
    let exchange = unique("eventos");
    let sink = client.sink(&exchange).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let port = portpicker();
    let path = config(dir.path(), &db, &exchange, port);
    let mut cmd = carteiro();
    cmd.args(["run", "-c"]).arg(&path);
    let mut gateway = Running::spawn(cmd);
    gateway.wait_stderr("(active)", WAIT).await;
    // a:1 cannot be routed (NULL topic) and holds a:2, a:3; b's rows go out.
    for (aggregate, n, topic) in [
        ("a", "a:1", "NULL"),
        ("a", "a:2", "'t'"),
        ("b", "b:1", "'t'"),
        ("a", "a:3", "'t'"),
        ("b", "b:2", "'t'"),
    ] {
        db.execute(&format!(
            "INSERT INTO eventos (aggregate, topic, body, tenant) \
             VALUES ('{aggregate}', {topic}, '{{\"n\": \"{n}\"}}', 'acme')"
        ))
        .await;
    }
    let first = crate::support::receive(&client, &sink, 2, WAIT).await;
    assert_eq!(bodies(&first), ["b:1", "b:2"], "only key b goes out");
    let m = &first[0];
    assert_eq!(
        m.properties.content_type().as_ref().map(|c| c.as_str()),
        Some("application/json"),
        "a jsonb payload is JSON"
    );
    let headers = carteiro::broker::field_table::to_text_pairs(
        &m.properties.headers().clone().unwrap_or_default(),
    );
    assert!(
        headers.contains(&("tenant".to_owned(), "acme".to_owned())),
        "{headers:?}"
    );
    assert_eq!(
        message_id(m).len(),
        36,
        "the uuid event id is the message id"
    );
    let metrics = wait_for("the parked row in /metrics", WAIT, || async {
        let request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        let (_, _, body) = http_exchange(port, request, Duration::from_secs(10), "/metrics").await;
        body.contains("carteiro_app_outbox_parked{outbox=\"eventos\"} 1")
            .then_some(body)
    })
    .await;
    assert!(metrics.contains("carteiro_app_outbox_active{outbox=\"eventos\"} 1"));
    assert!(
        metrics.contains("carteiro_app_outbox_publish_failures_total{outbox=\"eventos\"} 1"),
        "the parked row's failure, under the outbox's name"
    );
    assert!(
        metrics.contains("carteiro_outbox_published_total 0"),
        "Carteiro's own outbox counts only its own rows"
    );
    let request = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let (code, _, page) = http_exchange(port, request, Duration::from_secs(10), "/").await;
    assert_eq!(code, 200);
    let section = page
        .split("id=\"app-outboxes\"")
        .nth(1)
        .expect("the routes page lists application outboxes");
    assert!(
        section.contains("<td>eventos</td>") && section.contains("active"),
        "{section}"
    );
    let mut status = carteiro();
    status.args(["outbox", "status", "-c"]).arg(&path);
    let shown = run_to_end(status, WAIT).await.stdout;
    assert!(
        shown.contains("row 1 (event ") && shown.contains("column topic is NULL"),
        "{shown}"
    );
    // Fixed in the table and released: a's rows go out in order.
    db.execute("UPDATE eventos SET topic = 't' WHERE seq = 1")
        .await;
    let mut retry = carteiro();
    retry
        .args(["outbox", "retry", "-c"])
        .arg(&path)
        .args(["eventos", "1"]);
    let retried = run_to_end(retry, WAIT).await;
    assert_eq!(retried.code, Some(0), "{}", retried.stdout);
    let rest = crate::support::receive(&client, &sink, 3, WAIT).await;
    assert_eq!(bodies(&rest), ["a:1", "a:2", "a:3"]);
    wait_for("published rows deleted", WAIT, || async {
        (db.count("SELECT CAST(COUNT(*) AS BIGINT) FROM eventos")
            .await
            == 0)
            .then_some(())
    })
    .await;
    gateway.kill().await;
}

fn portpicker() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}
