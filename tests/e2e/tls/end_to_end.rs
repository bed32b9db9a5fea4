//! The gateway, its relay and its CLI over TLS to both servers, with client certificates.

use super::{BROKER_USER, Servers, servers};
use crate::resilience::{Running, carteiro, run_to_end};
use crate::support::{
    Client, assert_contains_all, json_props, plugin_route, receive, unique, wait_for,
};
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// A config in `dir` whose TLS files are named relative to it (copied there), as an operator
/// would write it: the broker over amqps with EXTERNAL, the store with verify-full.
pub fn tls_config(servers: &Servers, dir: &Path, database: &str, route: &str) -> String {
    servers.pki.copy_to(
        dir,
        &[
            "ca.pem",
            "mq-client.pem",
            "mq-client.key",
            "pg-client.pem",
            "pg-client.key",
        ],
    );
    format!(
        r#"
version = 1
[broker]
url = "amqps://localhost:{tls}/%2f?auth_mechanism=external"
heartbeat = "5s"
connect_timeout = "10s"
[broker.tls]
ca_file = "ca.pem"
cert_file = "mq-client.pem"
key_file = "mq-client.key"
[store]
url = "{store}"
[admin]
listen = ""
[relay]
poll_interval = "200ms"
{route}
"#,
        tls = servers.mq_tls_port,
        store = servers.pg_url(
            "localhost",
            database,
            "sslmode=verify-full&sslrootcert=ca.pem&sslcert=pg-client.pem&sslkey=pg-client.key"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_processed_and_its_event_relayed_over_tls_to_both_servers() {
    let servers = servers().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let database = servers.database().await;
    let (queue, exchange, events) = (unique("tls-q"), unique("tls-in"), unique("tls-events"));
    let variables = format!("out_exchange = \"{events}\"");
    let route = plugin_route("counter", "counter", &variables, &queue, &exchange);
    let config = dir.path().join("carteiro.toml");
    std::fs::write(&config, tls_config(&servers, dir.path(), &database, &route)).expect("write");

    // The CLI first: `check` opens the store and the broker with the same settings.
    let mut check = carteiro();
    check.arg("check").arg("-c").arg(&config);
    let checked = run_to_end(check, WAIT).await;
    assert_eq!(
        checked.code,
        Some(0),
        "carteiro check over TLS:\n{}{}",
        checked.stdout,
        checked.stderr
    );
    assert_contains_all(
        &checked.stdout,
        &["store    postgres://", "topology declared"],
    );

    // The test's own client publishes on the broker's plain listener; the gateway never does.
    let client = Client::connect_to(&servers.plain_amqp_url()).await;
    let sink = client.sink(&events).await;
    let mut cmd = carteiro();
    // The relay's LISTEN connection says at debug when it cannot connect.
    cmd.env("CARTEIRO_LOG", "info,carteiro::relay=debug");
    cmd.arg("run").arg("-c").arg(&config);
    let gateway = Running::spawn(cmd);
    client.wait_for_consumer(&queue).await;
    client
        .publish(&exchange, "order.created", json_props("tls-1"), b"{}")
        .await;

    let store = carteiro::store::Store::connect(&servers.pg_admin_url(&database), 2)
        .await
        .expect("the test reads the store over TLS");
    wait_for("the delivery's kv effect", WAIT, || async {
        let entry = store.kv_get("counter", "seen/tls-1").await.ok()??;
        (entry.value == b"1").then_some(())
    })
    .await;
    let relayed = wait_for("the relayed event", WAIT, || async {
        let got = client.drain(&sink).await;
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(relayed.len(), 1, "one event, relayed once");

    // Every connection but the test's own client (guest, plain) is the gateway's: TLS,
    // logged in by its certificate (EXTERNAL).
    let conns = servers.connections(&["user", "ssl", "auth_mechanism"]);
    let gateway_conns: Vec<Vec<&str>> = conns
        .iter()
        .map(|c| c.split_whitespace().collect::<Vec<_>>())
        .filter(|cols| cols.first() != Some(&"guest"))
        .collect();
    assert!(
        gateway_conns.len() >= 2,
        "the routes' and the relay's connections: {conns:?}"
    );
    for cols in &gateway_conns {
        assert_eq!(
            cols.as_slice(),
            &[BROKER_USER, "true", "EXTERNAL"],
            "a gateway connection that is not TLS + EXTERNAL: {conns:?}"
        );
    }
    let out = gateway.kill().await;
    assert!(
        !out.stderr.contains("LISTEN connection lost"),
        "the relay's LISTEN connection failed over TLS:\n{}",
        out.stderr
    );

    // `carteiro relay` alone publishes rows committed meanwhile, over the same settings.
    crate::support::seed_outbox(&store, &events, 1, 3).await;
    let mut relay = carteiro();
    relay.arg("relay").arg("-c").arg(&config);
    let relay = Running::spawn(relay);
    receive(&client, &sink, 3, WAIT).await;
    relay.kill().await;

    // A dead-letter command of the CLI reads the same store over TLS.
    let mut stats = carteiro();
    stats.args(["dlq", "stats", "-c"]).arg(&config);
    let stats = run_to_end(stats, WAIT).await;
    assert_eq!(stats.code, Some(0), "dlq stats over TLS:\n{}", stats.stderr);
}
