//! Outages of the database and of the broker while work is pending: nothing is acked
//! without its commit, nothing is marked published without its confirm, and everything
//! completes once the service is back.

use crate::resilience::Rabbit;
use crate::support::{
    Client, Gateway, assert_applied_once, counter_config, load_config, migrated_store, repo,
    script, script_quietly, seed_outbox, spawn_relay, sqlite_url, stop_relay, unique, wait_for,
    wait_published, with_store,
};
use carteiro::store::Store;
use std::net::TcpListener;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(180);

/// A PostgreSQL instance of this test alone (scripts/postgres.sh), stopped on drop.
pub(crate) struct Postgres {
    name: String,
    port: u16,
}

impl Postgres {
    pub(crate) async fn start() -> (Self, String) {
        let port = (0..200)
            .map(|_| 56_000 + rand::random_range(0..900u16))
            .find(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .expect("a free port");
        let pg = Self {
            name: unique("pg-outage"),
            port,
        };
        let (name, port) = (pg.name.clone(), port.to_string());
        let url = tokio::task::spawn_blocking(move || {
            script("postgres.sh", &["start", &name, &port], &[])
        })
        .await
        .expect("start");
        (pg, url)
    }

    pub(crate) async fn stop(&self) {
        let name = self.name.clone();
        tokio::task::spawn_blocking(move || script("postgres.sh", &["stop", &name], &[]))
            .await
            .expect("stop");
    }

    pub(crate) async fn start_again(&self) {
        let (name, port) = (self.name.clone(), self.port.to_string());
        tokio::task::spawn_blocking(move || script("postgres.sh", &["start", &name, &port], &[]))
            .await
            .expect("start");
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        script_quietly("postgres.sh", &["stop", &self.name]);
        let _ = std::fs::remove_dir_all(repo().join(".local/postgres").join(&self.name));
    }
}

async fn runs(store: &Store) -> i64 {
    match store.kv_get("counter", "runs").await {
        Ok(Some(entry)) => String::from_utf8(entry.value)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

#[tokio::test]
async fn database_down_mid_run_pauses_and_resumes_without_loss() {
    let (pg, url) = Postgres::start().await;
    let client = Client::connect().await;
    let queue = unique("dbdown");
    let exchange = unique("in");
    let events = unique("events");
    client.sink(&exchange).await;
    client.sink(&events).await;
    let toml = counter_config(&queue, &exchange, &events);
    let gw = Gateway::start(&with_store(&toml, &url)).await;
    client.wait_for_consumer(&queue).await;
    client.publish_numbered(&exchange, "a", 100, b"{}").await;
    wait_for("some progress before the outage", WAIT, || async {
        (runs(&gw.store).await >= 10).then_some(())
    })
    .await;
    pg.stop().await;
    client.publish_numbered(&exchange, "b", 100, b"{}").await;
    // Keep the database down for a while: deliveries must wait or be requeued, not acked.
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg.start_again().await;
    wait_for("all 200 processed", WAIT, || async {
        (runs(&gw.store).await >= 200).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        runs(&gw.store).await,
        200,
        "each message's effects exactly once"
    );
    for id in ["a-0", "a-99", "b-0", "b-99"] {
        assert_applied_once(&gw.store, "counter", id).await;
    }
    let filter = carteiro::store::DeadLetterFilter {
        route: Some(queue.clone()),
        ..Default::default()
    };
    assert!(
        gw.store
            .dead_letters_list(&filter)
            .await
            .expect("dlq")
            .is_empty(),
        "nothing dead-lettered"
    );
    gw.stop().await;
}

#[tokio::test]
async fn outbox_rows_wait_for_a_stopped_broker_and_are_published_when_it_returns() {
    let rabbit = Rabbit::start().await;
    let client = Client::connect_to(&rabbit.url()).await;
    let exchange = unique("out");
    let sink = client.sink(&exchange).await;
    drop(client);

    let dir = tempfile::tempdir().expect("tempdir");
    let url = sqlite_url(dir.path());
    let store = migrated_store(&url).await;
    seed_outbox(&store, &exchange, 20, 20).await;

    rabbit.stop().await;
    let config = load_config(
        dir.path(),
        &format!(
            "version = 1\n[broker]\nurl = \"{}\"\nreconnect_max_backoff = \"1s\"\n[store]\nurl = \"{url}\"\n[relay]\npoll_interval = \"100ms\"\n",
            rabbit.url()
        ),
    );
    let relay = spawn_relay(&config, store.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = store.outbox_status().await.expect("status");
    assert_eq!(
        status.pending, 20,
        "nothing marked published while the broker is down"
    );

    rabbit.start_again().await;
    wait_published("all rows published", &store, WAIT).await;
    stop_relay(relay).await;
    let got = rabbit.wait_depth(&sink, 20, WAIT).await;
    assert_eq!(got, 20);
}
