//! Idempotency records. Rows are written by `commit_batch` only, together with the effects.

use std::collections::HashSet;

use sqlx::{AnyConnection, AssertSqlSafe};

use super::sql::{Placeholders, shaped_chunks};
use super::{Dialect, Store, StoreError, nul_free};

impl Store {
    /// Has a delivery with this (route, idempotency key) already committed its effects?
    /// A fast pre-check for the pipeline; `commit_batch` re-checks inside its transaction.
    pub async fn inbox_contains(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        let sql = "SELECT 1 FROM inbox WHERE route = $1 AND key = $2";
        let found = self.inbox_record("inbox contains", sql, route, key).await?;
        Ok(found.is_some())
    }

    /// When the delivery with this (route, idempotency key) committed its effects, if one
    /// did (and its record is still kept): what a dead letter's journey shows as its outcome.
    pub async fn inbox_processed_at(
        &self,
        route: &str,
        key: &str,
    ) -> Result<Option<i64>, StoreError> {
        let sql = "SELECT processed_at FROM inbox WHERE route = $1 AND key = $2";
        self.inbox_record("inbox processed at", sql, route, key)
            .await
    }

    /// The number `sql` selects from the record of (`route`, `key`), if there is one; `what`
    /// names the operation in a timeout error.
    async fn inbox_record(
        &self,
        what: &str,
        sql: &'static str,
        route: &str,
        key: &str,
    ) -> Result<Option<i64>, StoreError> {
        self.bounded(what, async {
            nul_free::text("route", route)?;
            nul_free::text("inbox key", key)?;
            let number: Option<i64> = sqlx::query_scalar(sql)
                .bind(route)
                .bind(key)
                .fetch_optional(self.pool())
                .await?;
            Ok(number)
        })
        .await
    }

    /// Which of `keys` of `route` have committed their effects (one query per chunk).
    pub async fn inbox_contains_many(
        &self,
        route: &str,
        keys: &[&str],
    ) -> Result<HashSet<String>, StoreError> {
        self.bounded("inbox contains many", async {
            let mut conn = self.pool().acquire().await?;
            Ok(present_keys(&mut conn, self.dialect, route, keys).await?)
        })
        .await
    }

    /// Retention: forgets records processed before `cutoff_ms`. A redelivery older than the
    /// retention would run again, so keep it longer than any redelivery can take. Deletes
    /// in batches (`Store::purge_where`).
    pub async fn inbox_purge_before(&self, cutoff_ms: i64) -> Result<u64, StoreError> {
        self.purge_where(
            "inbox",
            Some("inbox_processed_at"),
            "processed_at < $1",
            cutoff_ms,
        )
        .await
    }
}

/// Which of `keys` of `route` are in the inbox, read through `conn` (a pooled connection or
/// an open transaction), one query per chunk.
pub(super) async fn present_keys(
    conn: &mut AnyConnection,
    dialect: &'static dyn Dialect,
    route: &str,
    keys: &[&str],
) -> Result<HashSet<String>, sqlx::Error> {
    let mut found = HashSet::new();
    for chunk in shaped_chunks(keys) {
        let mut p = Placeholders::new(dialect);
        let sql = format!(
            "SELECT key FROM inbox WHERE route = {} AND key IN ({})",
            p.next(),
            p.list(chunk.len())
        );
        let mut query = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql)).bind(route);
        for key in chunk {
            query = query.bind(*key);
        }
        found.extend(query.fetch_all(&mut *conn).await?);
    }
    Ok(found)
}
