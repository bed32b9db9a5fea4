//! The store's own trouble while the gateway runs, on PostgreSQL: a database that turns
//! read-only (what a failover does to the old primary) and a database that stops answering
//! (a blackholed network). Deliveries wait, nothing is dead-lettered, and every message has
//! its effects exactly once when the database is back.

use crate::blackhole::Blackhole;
use crate::support::{Client, Gateway, json_props, pg_database, route_config, unique, wait_for};
use carteiro::store::{DeadLetterFilter, Store};
use sqlx::Connection;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

fn admin_url() -> String {
    std::env::var("CARTEIRO_TEST_POSTGRES_URL").expect("CARTEIRO_TEST_POSTGRES_URL is set")
}

fn database_of(url: &str) -> String {
    url.rsplit('/').next().unwrap_or_default().to_owned()
}

/// Turns the test's own database read-only (or back) for new sessions, and ends its current
/// sessions so the gateway's pool reconnects into the new mode. Run from the admin database.
async fn set_read_only(url: &str, on: bool) {
    let name = database_of(url);
    let mut admin = sqlx::PgConnection::connect(&admin_url())
        .await
        .expect("admin");
    let mode = if on { "on" } else { "off" };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE {name} SET default_transaction_read_only = {mode}"
    )))
    .execute(&mut admin)
    .await
    .expect("alter database");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&name)
        .execute(&mut admin)
        .await
        .expect("terminate sessions");
}

async fn number(store: &Store, key: &str) -> i64 {
    match store.kv_get("counter", key).await {
        Ok(Some(e)) => String::from_utf8_lossy(&e.value).parse().unwrap_or(-1),
        _ => 0,
    }
}

/// A counter route on PostgreSQL `url`, with `[store]` extras.
async fn counter_route(
    prefix: &str,
    url: &str,
    store_extra: &str,
) -> (Client, String, String, Gateway) {
    let client = Client::connect().await;
    let (queue, exchange, events) = (unique(prefix), unique("in"), unique("events"));
    client.sink(&exchange).await;
    client.sink(&events).await;
    let toml = route_config(
        &queue,
        "counter",
        &exchange,
        &format!("out_exchange = \"{events}\""),
        "",
    )
    .replace(
        "url = \"sqlite://{dir}/carteiro.db\"",
        &format!("url = \"{url}\"\n{store_extra}"),
    );
    let gw = Gateway::start(&toml).await;
    client.wait_for_consumer(&queue).await;
    (client, queue, exchange, gw)
}

async fn publish(client: &Client, exchange: &str, prefix: &str, n: usize) {
    for i in 0..n {
        client
            .publish(exchange, "k", json_props(&format!("{prefix}-{i}")), b"{}")
            .await;
    }
}

async fn exactly_once(store: &Store, queue: &str, prefixes: &[&str], n: usize) {
    let total = (prefixes.len() * n) as i64;
    wait_for(&format!("{total} messages processed"), WAIT, || async {
        (number(store, "runs").await >= total).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(number(store, "runs").await, total);
    for p in prefixes {
        for i in 0..n {
            assert_eq!(number(store, &format!("seen/{p}-{i}")).await, 1, "{p}-{i}");
        }
    }
    let dead = store
        .dead_letters_count(&DeadLetterFilter {
            route: Some(queue.to_owned()),
            ..Default::default()
        })
        .await
        .expect("count");
    assert_eq!(dead, 0, "nothing dead-lettered for the store's trouble");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_pauses_the_route_and_dead_letters_nothing() {
    let url = pg_database().await;
    let (client, queue, exchange, gw) = counter_route("readonly", &url, "").await;
    publish(&client, &exchange, "a", 30).await;
    wait_for("the first 30 processed", WAIT, || async {
        (number(&gw.store, "runs").await >= 30).then_some(())
    })
    .await;

    set_read_only(&url, true).await;
    publish(&client, &exchange, "b", 30).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let observer = Store::connect(&url, 1).await.expect("observer");
    assert_eq!(
        number(&observer, "runs").await,
        30,
        "nothing commits while read-only"
    );
    drop(observer);

    set_read_only(&url, false).await;
    exactly_once(&gw.store, &queue, &["a", "b"], 30).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_database_holds_deliveries_and_the_gateway_recovers() {
    let direct = pg_database().await;
    let (hole, proxied) = Blackhole::in_front_of(&direct).await;
    let (client, queue, exchange, gw) =
        counter_route("blackhole", &proxied, "statement_timeout = \"1s\"").await;
    let observer = Store::connect(&direct, 2).await.expect("observer");
    publish(&client, &exchange, "a", 20).await;
    wait_for("the first 20 processed", WAIT, || async {
        (number(&observer, "runs").await >= 20).then_some(())
    })
    .await;

    hole.close();
    publish(&client, &exchange, "b", 20).await;
    // Longer than the client-side bound (1 s + 5 s): commits give up, deliveries wait.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(number(&observer, "runs").await, 20);
    hole.open();

    // Abandoned commits may land once the held bytes flow again: their redeliveries meet
    // the inbox records (G2), so every message still has its effects once.
    exactly_once(&observer, &queue, &["a", "b"], 20).await;
    drop(observer);
    gw.stop().await;
}
