//! Plugin state reads. Writes happen only in `commit_batch`, checked against the versions
//! returned here.

use super::{Store, StoreError, validate};

/// A stored value and its version (1 on creation, +1 per write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The bytes as last written.
    pub value: Vec<u8>,
    /// Pass back as `KvRead::observed_version` at commit.
    pub version: i64,
}

impl Store {
    /// Reads one key of a namespace (outside any transaction: the version is what makes the
    /// later commit safe).
    pub async fn kv_get(&self, namespace: &str, key: &str) -> Result<Option<KvEntry>, StoreError> {
        validate::text("namespace", namespace)?;
        validate::text("kv key", key)?;
        let row: Option<(Vec<u8>, i64)> = sqlx::query_as(
            "SELECT value, version FROM kv \
                 WHERE namespace = $1 AND key = $2 AND value IS NOT NULL",
        )
        .bind(namespace)
        .bind(key)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|(value, version)| KvEntry { value, version }))
    }

    /// Retention for delete tombstones older than `cutoff_ms`. Keep them longer than any
    /// handler run: a read older than a purged tombstone could pass its version check.
    pub async fn kv_purge_tombstones_before(&self, cutoff_ms: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM kv WHERE value IS NULL AND updated_at < $1")
            .bind(cutoff_ms)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }
}
