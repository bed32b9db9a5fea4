//! A flood of console reads cannot starve the pipeline: the admin server serves at most a
//! small share of the store's pool at once (one of two connections here), and the groups
//! page reads a covering index, fast at a million dead letters. While 30 clients reload the
//! groups of a million dead letters for seconds, messages are still processed and the store
//! never counts as unavailable.

use super::{TOKEN, WAIT, config_toml, credentials_toml, http, loopback, runs, wait_ready};
use crate::support::{Client, Gateway, json_props, unique};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FLOOD: usize = 30;
const FOR: Duration = Duration::from_secs(8);
const MESSAGES: i64 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_read_flood_does_not_starve_the_pipeline() {
    let queue = unique("console-flood");
    let (port, listen) = loopback();
    let toml = config_toml(&queue, &listen, &credentials_toml(TOKEN, super::PASSWORD))
        .await
        .replace(
            "url = \"sqlite://{dir}/carteiro.db\"",
            "url = \"sqlite://{dir}/carteiro.db\"\nmax_connections = 2",
        );
    assert!(toml.contains("max_connections = 2"), "{toml}");
    let metrics = Arc::new(carteiro::metrics::Metrics::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Gateway::start_in(dir, &toml, metrics.clone()).await;
    wait_ready(&queue, &listen).await;
    sqlx::any::install_default_drivers();
    let db = gw.dir.path().join("carteiro.db");
    let pool = sqlx::AnyPool::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open the gateway's SQLite file");
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000) \
         INSERT INTO dead_letters (route, queue, reason, plugin, attempts, headers, body, \
         dead_lettered_at, replay_count) \
         SELECT 'old-' || (i % 7), 'q', 'failure kind ' || (i % 300), 'p', 1, '[]', x'7b7d', i, 0 \
         FROM n",
    )
    .execute(&pool)
    .await
    .expect("archive a million dead letters");
    pool.close().await;

    let until = Instant::now() + FOR;
    let flood: Vec<_> = (0..FLOOD)
        .map(|_| {
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while Instant::now() < until {
                    let (status, _, _) = http(port, "GET", "/api/dlq/groups", &[], "").await;
                    statuses.push(status);
                }
                statuses
            })
        })
        .collect();
    let client = Client::connect().await;
    for i in 0..MESSAGES {
        client
            .publish("", &queue, json_props(&format!("flood-{i}")), b"{}")
            .await;
        tokio::time::sleep(FOR / 12).await;
    }
    runs(&gw.store, MESSAGES).await;
    let mut served = 0;
    for task in flood {
        let statuses = tokio::time::timeout(WAIT, task)
            .await
            .expect("the flood ends")
            .expect("flood task");
        for status in statuses {
            assert!(status == 200 || status == 503, "status {status}");
            served += usize::from(status == 200);
        }
    }
    assert!(served > 0, "some reads were served");
    assert_eq!(
        metrics.store.outages.get(),
        0,
        "the pipeline never waited for the store long enough to pause"
    );
    gw.stop().await;
}
