//! The Python helper's side of `[[outboxes]]`: the block `python -m carteiro_outbox config`
//! prints for an `OutboxMixin` model passes `carteiro check` against the table
//! `create_all()` made, and the rows `add_event` writes are relayed with their event ids.

use std::collections::HashSet;
use std::process::Command;

use super::{AppDb, WAIT, exchange_name, python, receive_all, relay};
use crate::resilience::{carteiro, run_to_end};
use crate::support::{Client, amqp_url, repo};

fn helper(db: &AppDb, args: &[&str]) -> String {
    let out = Command::new(python())
        .arg(repo().join("tests/e2e/python/helper_model.py"))
        .arg(&db.sqlalchemy)
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[tokio::test]
async fn the_helpers_printed_block_checks_and_relays_its_model() {
    let db = AppDb::sqlite();
    helper(&db, &["create"]);
    let client = Client::connect().await;
    let exchange = exchange_name();
    let sink = client.sink(&exchange).await;
    let printed = Command::new(python())
        .args([
            "-m",
            "carteiro_outbox",
            "config",
            "--model",
            "helper_model:Evento",
        ])
        .args(["--url", &db.sqlalchemy, "--exchange", &exchange])
        .env("PYTHONPATH", repo().join("tests/e2e/python"))
        .output()
        .expect("python runs");
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let block = String::from_utf8(printed.stdout).expect("utf-8");
    assert!(block.contains("key = \"key\""), "{block}");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("carteiro.toml");
    std::fs::write(
        &config,
        format!(
            "version = 1\n[broker]\nurl = \"{}\"\n[store]\nurl = \"sqlite://{}/carteiro.db\"\n\
             [relay]\nenabled = false\n\n{block}",
            amqp_url(),
            dir.path().display()
        ),
    )
    .expect("config");
    let mut check = carteiro();
    check.args(["check", "-c"]).arg(&config);
    let checked = run_to_end(check, WAIT).await;
    assert_eq!(
        checked.code,
        Some(0),
        "{}\n{}",
        checked.stdout,
        checked.stderr
    );
    let running = relay(&config, "(active)").await;
    let ids: HashSet<String> = helper(&db, &["write", "30"])
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(ids.len(), 30);
    let seen = receive_all(&client, &sink, &ids).await;
    assert!(seen.keys().all(|id| ids.contains(id)));
    running.kill().await;
}
