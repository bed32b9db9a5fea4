//! Secrets shared by every gateway on one store: the key that seals Carteiro's headers
//! (`broker::seal`). Anyone who can read this table is trusted already. With `[security]
//! seal_key` or `seal_key_file` the key comes from outside and the table is left alone.

use super::{Store, StoreError};

const HEADER_SEAL: &str = "header-seal";

impl Store {
    /// The header-seal key: the one given by [`Store::with_header_seal_secret`], else the
    /// table's, created on first use (the first gateway's key wins a race),
    /// then the same for every gateway and CLI on this store.
    pub async fn header_seal_secret(&self) -> Result<Vec<u8>, StoreError> {
        if let Some(secret) = &self.seal_secret {
            return Ok(secret.to_vec());
        }
        let fresh = hex::encode(rand::random::<[u8; 32]>());
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO carteiro_secrets (name, value) VALUES ($1, $2) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(HEADER_SEAL)
        .bind(fresh)
        .execute(&mut *tx)
        .await?;
        let value: String =
            sqlx::query_scalar("SELECT value FROM carteiro_secrets WHERE name = $1")
                .bind(HEADER_SEAL)
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        hex::decode(value.trim()).map_err(|e| {
            StoreError::Database(format!(
                "carteiro_secrets.{HEADER_SEAL} is not hex ({e}); delete the row to make a new key"
            ))
        })
    }
}
