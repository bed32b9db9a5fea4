//! A purge deletes exactly the dead letters it counted: rows archived while it runs (it
//! deletes in chunks of 10,000, one transaction each) are kept, also for the JSON purge,
//! which sends no `max_id`.

use super::{console, post_json};
use sqlx::AssertSqlSafe;

const ROWS: i64 = 25_000;
const LATE: &str = "archived while the purge ran";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_purge_deletes_only_what_it_counted() {
    let (queue, port, _, gw) = console("console-purge").await;
    sqlx::any::install_default_drivers();
    let db = gw.dir.path().join("carteiro.db");
    let pool = sqlx::AnyPool::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open the gateway's SQLite file");
    let now = carteiro::common::now_ms();
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $3) \
         INSERT INTO dead_letters (route, queue, reason, plugin, attempts, headers, body, \
         dead_lettered_at, replay_count) \
         SELECT $1, $1 || '.dlq', 'old failure ' || i, 'counter', 3, '[]', x'7b7d', $2, 0 FROM n",
    )
    .bind(&queue)
    .bind(now)
    .bind(ROWS)
    .execute(&pool)
    .await
    .expect("archive 25,000 dead letters");
    // Two dead letters archived in the middle of the purge: when its first chunk deletes the
    // oldest row (the queue name is letters, digits and dashes: safe to inline).
    let first: i64 = sqlx::query_scalar("SELECT MIN(id) FROM dead_letters WHERE route = $1")
        .bind(&queue)
        .fetch_one(&pool)
        .await
        .expect("first id");
    let late_row = format!(
        "INSERT INTO dead_letters (route, queue, reason, plugin, attempts, headers, body, \
         dead_lettered_at, replay_count) VALUES ('{queue}', '{queue}.dlq', '{LATE}', \
         'counter', 3, '[]', x'7b7d', {now}, 0);"
    );
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TRIGGER late_dead_letters AFTER DELETE ON dead_letters \
         WHEN old.id = {first} BEGIN {late_row} {late_row} END"
    )))
    .execute(&pool)
    .await
    .expect("trigger");

    let body = format!(r#"{{"route":"{queue}","confirm":{ROWS}}}"#);
    let (status, _, response) = post_json(port, "/api/dlq/purge", &body).await;
    assert_eq!(status, 200, "{response}");
    let purged: serde_json::Value = serde_json::from_str(&response).expect("JSON");
    assert_eq!(purged["purged"], ROWS, "confirmed {ROWS}: {response}");
    let left: Vec<String> = sqlx::query_scalar("SELECT reason FROM dead_letters WHERE route = $1")
        .bind(&queue)
        .fetch_all(&pool)
        .await
        .expect("what is left");
    assert_eq!(left, [LATE, LATE], "the late dead letters are kept");
    pool.close().await;
    gw.stop().await;
}
