//! Reading the store: progress while the campaign runs, the final state for the checker.

use std::time::Duration;

use anyhow::Context;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};

// The SQL names the campaign's routes and namespaces literally (sqlx takes only static
// SQL text): config::ROUTE_DOWNSTREAM, config::ROUTE_POISON and config::NS_*.
use crate::checker::{DeadLetter, OutboxRow, State};

/// Bound on every query: a store that is down (a fault) must not hang the campaign.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Now in Unix milliseconds: the clock of the store's `created_at` and `published_at`.
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A small pool on the gateways' database.
pub async fn open(url: &str) -> anyhow::Result<AnyPool> {
    sqlx::any::install_default_drivers();
    let pool = AnyPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(QUERY_TIMEOUT)
        .connect(url)
        .await
        .with_context(|| format!("open the store at {url}"))?;
    Ok(pool)
}

/// Inputs finished upstream (inbox records plus dead letters) and outbox rows not yet
/// published; `None` while the store cannot answer.
pub async fn progress(pool: &AnyPool) -> Option<(u64, u64)> {
    two_counts(
        pool,
        "SELECT (SELECT COUNT(*) FROM inbox WHERE route <> 'chaos-downstream') \
         + (SELECT COUNT(*) FROM dead_letters)",
        // A poison row stays unpublished for good, parked.
        "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL AND route <> 'chaos-poison'",
    )
    .await
}

/// The first unpublished outbox rows (not the poison route's): id, route and how long ago
/// they were committed, for a drain that gave up. `None` while the store cannot answer.
pub async fn unpublished_rows(pool: &AnyPool) -> Option<Vec<(i64, String, i64)>> {
    let query = sqlx::query(
        "SELECT id, route, created_at FROM outbox \
         WHERE published_at IS NULL AND route <> 'chaos-poison' ORDER BY id LIMIT 10",
    )
    .fetch_all(pool);
    let rows = tokio::time::timeout(QUERY_TIMEOUT, query)
        .await
        .ok()?
        .ok()?;
    let now = unix_ms();
    rows.iter()
        .map(|r| {
            let created: i64 = r.try_get(2).ok()?;
            Some((r.try_get(0).ok()?, r.try_get(1).ok()?, now - created))
        })
        .collect()
}

/// Downstream inbox records and upstream outbox rows: equal once every event took effect.
pub async fn downstream(pool: &AnyPool) -> Option<(u64, u64)> {
    two_counts(
        pool,
        "SELECT COUNT(*) FROM inbox WHERE route = 'chaos-downstream'",
        "SELECT COUNT(*) FROM outbox WHERE route NOT IN ('chaos-downstream', 'chaos-poison')",
    )
    .await
}

/// The answers of two `SELECT COUNT(*)` queries; `None` while the store cannot answer.
async fn two_counts(
    pool: &AnyPool,
    first: &'static str,
    second: &'static str,
) -> Option<(u64, u64)> {
    let ask = async {
        let first: i64 = sqlx::query_scalar(first).fetch_one(pool).await?;
        let second: i64 = sqlx::query_scalar(second).fetch_one(pool).await?;
        anyhow::Ok((first as u64, second as u64))
    };
    tokio::time::timeout(QUERY_TIMEOUT, ask).await.ok()?.ok()
}

/// Fills in `state`'s store part: kv, inbox, outbox and dead letters.
pub async fn store(pool: &AnyPool, state: &mut State) -> anyhow::Result<()> {
    let kv = sqlx::query(
        "SELECT namespace, key, value FROM kv WHERE value IS NOT NULL AND namespace IN \
         ('enrollment', 'counter', 'mixed', 'batch', 'downstream')",
    )
    .fetch_all(pool)
    .await
    .context("read kv")?;
    for row in kv {
        let value: Vec<u8> = row.try_get(2)?;
        state.kv.insert(
            (row.try_get(0)?, row.try_get(1)?),
            String::from_utf8_lossy(&value).into_owned(),
        );
    }
    for row in sqlx::query("SELECT route, key FROM inbox")
        .fetch_all(pool)
        .await?
    {
        state.inbox.insert((row.try_get(0)?, row.try_get(1)?));
    }
    let outbox = sqlx::query(
        "SELECT id, event_id, route, ordering_key, published_at, attempts, last_error, created_at \
         FROM outbox",
    )
    .fetch_all(pool)
    .await
    .context("read outbox")?;
    for row in outbox {
        let published: Option<i64> = row.try_get(4)?;
        state.outbox.push(OutboxRow {
            id: row.try_get(0)?,
            event_id: row.try_get(1)?,
            route: row.try_get(2)?,
            ordering_key: row.try_get(3)?,
            published: published.is_some(),
            attempts: row.try_get(5)?,
            last_error: row.try_get(6)?,
            created_at: row.try_get(7)?,
            published_at: published,
        });
    }
    let dead = sqlx::query(
        "SELECT route, reason, headers, id, replay_of, replay_count, \
         CAST(CASE WHEN replayed_at IS NULL THEN 0 ELSE 1 END AS BIGINT), \
         CAST(CASE WHEN edited_at IS NULL THEN 0 ELSE 1 END AS BIGINT) FROM dead_letters",
    )
    .fetch_all(pool)
    .await
    .context("read dead_letters")?;
    for row in dead {
        let headers: String = row.try_get(2)?;
        state.dead_letters.push(DeadLetter {
            route: row.try_get(0)?,
            reason: row.try_get(1)?,
            message_id: message_id(&headers),
            id: row.try_get(3)?,
            replay_of: row.try_get(4)?,
            replay_count: row.try_get(5)?,
            replayed: row.try_get::<i64, _>(6)? != 0,
            edited: row.try_get::<i64, _>(7)? != 0,
        });
    }
    Ok(())
}

/// `:message-id` from a dead letter's stored headers (a JSON list of name/value pairs).
pub fn message_id(headers: &str) -> Option<String> {
    let pairs: Vec<(String, String)> = serde_json::from_str(headers).ok()?;
    pairs
        .into_iter()
        .find(|(name, _)| name == ":message-id")
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    #[test]
    fn message_id_comes_from_the_stored_pairs() {
        let headers = r#"[["x-carteiro-attempt","3"],[":message-id","m-7"]]"#;
        assert_eq!(super::message_id(headers).as_deref(), Some("m-7"));
        assert_eq!(super::message_id("[]"), None);
    }
}
