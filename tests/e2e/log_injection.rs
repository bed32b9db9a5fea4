//! Issue 23 §2.9, log injection: text from a plugin (its log lines, its dead-letter reasons)
//! and from a publisher (a message id) reaches the real binary's text logs escaped, so a
//! newline, a carriage return or a terminal escape cannot start a forged entry.

use crate::resilience::{Running, carteiro};
use crate::support::{Client, json_props, route_config, unique, wait_for};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
/// What a forged entry would start its own line with.
const FORGED: &str = "2099-01-01T00:00:00.000000Z ERROR carteiro: forged";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_and_publisher_text_cannot_forge_log_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (queue, exchange) = (unique("loginj"), unique("in"));
    let client = Client::connect().await;
    client.sink(&exchange).await;
    let toml = route_config(&queue, "fixture-hostile", &exchange, "", "")
        .replace("{dir}", &dir.path().display().to_string());
    let config = dir.path().join("carteiro.toml");
    std::fs::write(&config, toml).expect("write config");
    let mut cmd = carteiro();
    cmd.arg("run").arg("-c").arg(&config);
    let mut gateway = Running::spawn(cmd);
    client.wait_for_consumer(&queue).await;

    let say = format!("say:hello\n{FORGED} by a plugin\u{1b}[2K");
    client
        .publish(&exchange, "k", json_props("say-1"), say.as_bytes())
        .await;
    let reason = format!("reason:bad\r\n{FORGED} by a reason");
    client
        .publish(&exchange, "k", json_props("reason-1"), reason.as_bytes())
        .await;
    // The same hostile message id twice: the second is a duplicate, logged with its key.
    let id = format!("dup\n{FORGED} by a publisher");
    client
        .publish(&exchange, "k", json_props(&id), b"fine")
        .await;
    let store = carteiro::store::Store::connect(
        &format!("sqlite://{}", dir.path().join("carteiro.db").display()),
        1,
    )
    .await
    .expect("open the gateway's store");
    wait_for("the first copy's commit", WAIT, || async {
        store
            .kv_get("fixture-hostile", &format!("ok/{id}"))
            .await
            .ok()
            .flatten()
    })
    .await;
    client
        .publish(&exchange, "k", json_props(&id), b"fine")
        .await;

    for needle in ["by a plugin", "by a reason", "by a publisher"] {
        gateway.wait_stderr(needle, WAIT).await;
    }
    // The archiver logs the reason too; let it.
    gateway.wait_stderr("dead letter archived", WAIT).await;
    let out = gateway.kill().await;
    let forged: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("2099-01-01"))
        .collect();
    assert!(
        forged.is_empty(),
        "forged entries: {forged:?}\n{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("\u{1b}[2K"),
        "a raw terminal escape:\n{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains('\r'),
        "a raw carriage return:\n{}",
        out.stderr
    );
    for escaped in [
        format!("hello\\n{FORGED} by a plugin\\u{{1b}}[2K"),
        format!("bad\\r\\n{FORGED} by a reason"),
        format!("dup\\n{FORGED} by a publisher"),
    ] {
        assert!(
            out.stderr.contains(&escaped),
            "{escaped:?} not in:\n{}",
            out.stderr
        );
    }
}
