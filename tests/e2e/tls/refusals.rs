//! What TLS must refuse, each through the real CLI with an error naming what to fix: a CA
//! that did not sign the server's certificate, a certificate for another name, and TLS
//! required of servers that only speak plain text (never a fallback to clear text).

use super::{Servers, servers};
use crate::resilience::{Finished, carteiro, run_to_end};
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// Writes a config with `broker` (the `[broker]` table's body) and `store` (the store URL)
/// into `dir`, with every certificate copied beside it, and runs `carteiro ARGS -c` on it.
async fn cli(servers: &Servers, dir: &Path, args: &[&str], broker: &str, store: &str) -> Finished {
    servers.pki.copy_to(
        dir,
        &[
            "ca.pem",
            "other-ca.pem",
            "mq-client.pem",
            "mq-client.key",
            "pg-client.pem",
            "pg-client.key",
        ],
    );
    let config = dir.join(format!("{}.toml", crate::support::unique("cfg")));
    let toml = format!(
        "version = 1\n[admin]\nlisten = \"\"\n[store]\nurl = \"{store}\"\n[broker]\n{broker}\n"
    );
    std::fs::write(&config, toml).expect("write config");
    let mut cmd = carteiro();
    cmd.args(args).arg("-c").arg(&config);
    run_to_end(cmd, WAIT).await
}

const CLIENT_CERT: &str = "sslcert=pg-client.pem&sslkey=pg-client.key";

/// A fresh database on the TLS server, verified in full (`verify-full`, the test CA, a client
/// certificate): the store of the tests that are about something else.
async fn verified_store(servers: &Servers) -> String {
    let db = servers.database().await;
    let params = format!("sslmode=verify-full&sslrootcert=ca.pem&{CLIENT_CERT}");
    servers.pg_url("localhost", &db, &params)
}

fn refused(out: &Finished, needles: &[&str]) {
    assert_ne!(
        out.code,
        Some(0),
        "should have failed:\n{}{}",
        out.stdout,
        out.stderr
    );
    let text = out.stderr.to_lowercase();
    for needle in needles {
        assert!(
            text.contains(&needle.to_lowercase()),
            "expected {needle:?} in the error:\n{}",
            out.stderr
        );
    }
}

fn succeeded(out: &Finished) {
    assert_eq!(
        out.code,
        Some(0),
        "should have worked:\n{}{}",
        out.stdout,
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_wrong_ca_and_verify_full_refuses_a_name_mismatch() {
    let servers = servers().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let db = servers.database().await;
    let broker = "url = \"amqp://guest:guest@127.0.0.1:1/%2f\"";
    let store =
        |host: &str, params: &str| servers.pg_url(host, &db, &format!("{params}&{CLIENT_CERT}"));

    let wrong_ca = store("localhost", "sslmode=verify-full&sslrootcert=other-ca.pem");
    let out = cli(&servers, dir.path(), &["migrate"], broker, &wrong_ca).await;
    refused(
        &out,
        &[
            "TLS with the database failed",
            "UnknownIssuer",
            "sslrootcert",
        ],
    );

    // The certificate names `localhost` only: 127.0.0.1 is another name.
    let mismatch = store("127.0.0.1", "sslmode=verify-full&sslrootcert=ca.pem");
    let out = cli(&servers, dir.path(), &["migrate"], broker, &mismatch).await;
    refused(
        &out,
        &["TLS with the database failed", "not valid for name"],
    );

    // The controls: the same address with verify-ca (CA checked, name not), and the name.
    let ca_only = store("127.0.0.1", "sslmode=verify-ca&sslrootcert=ca.pem");
    succeeded(&cli(&servers, dir.path(), &["migrate"], broker, &ca_only).await);
    let full = store("localhost", "sslmode=verify-full&sslrootcert=ca.pem");
    succeeded(&cli(&servers, dir.path(), &["migrate"], broker, &full).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_refuses_a_wrong_ca_and_a_name_mismatch() {
    let servers = servers().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = verified_store(&servers).await;
    let port = servers.mq_tls_port;
    let broker = |host: &str, tls: &str| {
        format!(
            "url = \"amqps://{host}:{port}/%2f?auth_mechanism=external\"\n[broker.tls]\n\
             cert_file = \"mq-client.pem\"\nkey_file = \"mq-client.key\"\n{tls}"
        )
    };

    let wrong_ca = broker("localhost", "ca_file = \"other-ca.pem\"");
    let out = cli(&servers, dir.path(), &["check"], &wrong_ca, &store).await;
    refused(
        &out,
        &["TLS handshake with the broker", "UnknownIssuer", "ca_file"],
    );

    // Without [broker.tls] only the system store is trusted, and the error says what to set.
    let system_store = format!("url = \"amqps://guest:guest@localhost:{port}/%2f\"");
    let out = cli(&servers, dir.path(), &["check"], &system_store, &store).await;
    refused(
        &out,
        &[
            "TLS handshake with the broker",
            "UnknownIssuer",
            "[broker.tls] ca_file",
        ],
    );

    let mismatch = broker("127.0.0.1", "ca_file = \"ca.pem\"");
    let out = cli(&servers, dir.path(), &["check"], &mismatch, &store).await;
    refused(
        &out,
        &[
            "TLS handshake with the broker",
            "not valid for name",
            "server_name",
        ],
    );
    let named = broker(
        "localhost",
        "ca_file = \"ca.pem\"\nserver_name = \"other.carteiro.test\"",
    );
    let out = cli(&servers, dir.path(), &["check"], &named, &store).await;
    refused(
        &out,
        &["TLS handshake with the broker", "not valid for name"],
    );

    // The control: the same address, told the name its certificate carries.
    let told = broker(
        "127.0.0.1",
        "ca_file = \"ca.pem\"\nserver_name = \"localhost\"",
    );
    succeeded(&cli(&servers, dir.path(), &["check"], &told, &store).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_sent_in_clear_when_tls_is_required() {
    let servers = servers().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let tls_store = verified_store(&servers).await;
    let broker = "url = \"amqp://guest:guest@127.0.0.1:1/%2f\"";
    // The broker's plain listener with `[broker.tls]` set, reached as `url_start@localhost`.
    let on_plain_listener = |url_start: &str| {
        format!(
            "url = \"{url_start}@localhost:{}/%2f\"\n[broker.tls]\nca_file = \"ca.pem\"",
            servers.mq_plain_port
        )
    };

    // sslmode=require against the shared server, which has ssl = off: no plain fallback.
    let plain_pg = std::env::var("CARTEIRO_TEST_POSTGRES_URL")
        .expect("CARTEIRO_TEST_POSTGRES_URL (scripts/test.sh sets it)");
    let require = format!("{plain_pg}?sslmode=require");
    let out = cli(&servers, dir.path(), &["migrate"], broker, &require).await;
    refused(
        &out,
        &[
            "TLS with the database failed",
            "server does not support TLS",
        ],
    );

    // amqps with [broker.tls] against the broker's plain listener: the TLS handshake fails
    // before any AMQP (and so any credential) is sent.
    let plain_listener = on_plain_listener("amqps://guest:s3cret");
    let out = cli(
        &servers,
        dir.path(),
        &["check"],
        &plain_listener,
        &tls_store,
    )
    .await;
    refused(&out, &["TLS handshake with the broker"]);
    assert!(!out.stderr.contains("s3cret"), "{}", out.stderr);

    // [broker.tls] with a plain amqp:// URL is a config error, before any connection.
    let plain_url = on_plain_listener("amqp://guest:guest");
    let out = cli(
        &servers,
        dir.path(),
        &["check", "--no-environment"],
        &plain_url,
        &tls_store,
    )
    .await;
    refused(&out, &["`broker.tls`", "plain AMQP", "amqps://"]);
}
