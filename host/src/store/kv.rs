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
        let row: Option<(Vec<u8>, i64)> =
            sqlx::query_as("SELECT value, version FROM kv WHERE namespace = $1 AND key = $2")
                .bind(namespace)
                .bind(key)
                .fetch_optional(self.pool())
                .await?;
        Ok(row.map(|(value, version)| KvEntry { value, version }))
    }
}
