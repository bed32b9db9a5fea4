//! Plugin state reads. Writes happen only in `commit_batch`, checked against the versions
//! returned here.

use std::collections::HashMap;

use sqlx::AssertSqlSafe;

use super::sql::{Placeholders, shaped_chunks};
use super::{Store, StoreError, nul_free};

/// A stored value and its version (1 on creation, +1 per write).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct KvEntry {
    /// The bytes as last written.
    pub value: Vec<u8>,
    /// Pass back as `KvRead::observed_version` at commit.
    pub version: i64,
}

/// A key and its entry, as [`Store::kv_get_many`] reads them.
#[derive(sqlx::FromRow)]
struct KeyedEntry {
    key: String,
    #[sqlx(flatten)]
    entry: KvEntry,
}

impl Store {
    /// Reads one key of a namespace (outside any transaction: the version is what makes the
    /// later commit safe).
    pub async fn kv_get(&self, namespace: &str, key: &str) -> Result<Option<KvEntry>, StoreError> {
        self.bounded("kv get", async {
            nul_free::text("namespace", namespace)?;
            nul_free::text("kv key", key)?;
            let entry: Option<KvEntry> = sqlx::query_as(
                "SELECT value, version FROM kv \
                     WHERE namespace = $1 AND key = $2 AND value IS NOT NULL",
            )
            .bind(namespace)
            .bind(key)
            .fetch_optional(self.pool())
            .await?;
            Ok(entry)
        })
        .await
    }

    /// Reads several keys of a namespace at once (absent keys are missing from the map).
    pub async fn kv_get_many(
        &self,
        namespace: &str,
        keys: &[&str],
    ) -> Result<HashMap<String, KvEntry>, StoreError> {
        self.bounded("kv get many", async {
            let mut found = HashMap::new();
            for chunk in shaped_chunks(keys) {
                let mut p = Placeholders::new(self.dialect);
                let sql = format!(
                    "SELECT key, value, version FROM kv \
                     WHERE namespace = {} AND key IN ({}) AND value IS NOT NULL",
                    p.next(),
                    p.list(chunk.len())
                );
                let mut query = sqlx::query_as::<_, KeyedEntry>(AssertSqlSafe(sql)).bind(namespace);
                for key in chunk {
                    query = query.bind(*key);
                }
                for row in query.fetch_all(self.pool()).await? {
                    found.insert(row.key, row.entry);
                }
            }
            Ok(found)
        })
        .await
    }

    /// Retention for delete tombstones older than `cutoff_ms`. Keep them longer than any
    /// handler run: a read older than a purged tombstone could pass its version check (see
    /// `housekeeping::KV_TOMBSTONE_RETENTION`). Deletes in batches (`Store::purge_where`).
    pub async fn kv_purge_tombstones_before(&self, cutoff_ms: i64) -> Result<u64, StoreError> {
        self.purge_where("kv", None, "value IS NULL AND updated_at < $1", cutoff_ms)
            .await
    }
}
