//! Secrets shared by every gateway on one store: the keys that seal Carteiro's headers
//! (`broker::seal`). Anyone who can read this table is trusted already. With `[security]
//! seal_key` or `seal_key_file` the key comes from outside and the table is left alone.
//!
//! `header-seal` is the current key. A rotation moves it to `header-seal-retired:<expires
//! ms>:<n>` (still verifying until then, so copies in flight keep their attempt count) and
//! makes a fresh current key; gateways read the keyring again every
//! `startup::KEYRING_REFRESH`.

use super::{Store, StoreError, now_ms};

const HEADER_SEAL: &str = "header-seal";
const RETIRED_PREFIX: &str = "header-seal-retired:";

/// The current header-seal key and the retired ones still inside their window.
#[derive(Clone, PartialEq, Eq)]
pub struct SealSecrets {
    pub current: Vec<u8>,
    pub retired: Vec<Vec<u8>>,
}

impl std::fmt::Debug for SealSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SealSecrets(1 current, {} retired, ***)",
            self.retired.len()
        )
    }
}

fn decode(name: &str, value: &str) -> Result<Vec<u8>, StoreError> {
    hex::decode(value.trim()).map_err(|e| {
        StoreError::Database(format!(
            "carteiro_secrets.{name} is not hex ({e}); delete the row to make a new key"
        ))
    })
}

impl Store {
    /// The current header-seal key: created on first use (the first gateway's key wins a
    /// race), then the same for every gateway and CLI on this store.
    pub async fn header_seal_secret(&self) -> Result<Vec<u8>, StoreError> {
        Ok(self.header_seal_secrets().await?.current)
    }

    /// The current key (created on first use) and the retired keys not yet expired; or
    /// the one given by [`Store::with_header_seal_secret`].
    pub async fn header_seal_secrets(&self) -> Result<SealSecrets, StoreError> {
        if let Some(secret) = &self.seal_secret {
            return Ok(SealSecrets {
                current: secret.to_vec(),
                retired: Vec::new(),
            });
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
        tx.commit().await?;
        self.header_seal_keyring().await
    }

    /// The keys as stored, read only (a running gateway's refresh): the current key exists
    /// already, made at start-up by [`Self::header_seal_secrets`].
    pub async fn header_seal_keyring(&self) -> Result<SealSecrets, StoreError> {
        if let Some(secret) = &self.seal_secret {
            return Ok(SealSecrets {
                current: secret.to_vec(),
                retired: Vec::new(),
            });
        }
        let rows: Vec<(String, String)> = self
            .bounded("header-seal keys", async {
                Ok(sqlx::query_as(
                    "SELECT name, value FROM carteiro_secrets WHERE name LIKE 'header-seal%'",
                )
                .fetch_all(&self.pool)
                .await?)
            })
            .await?;
        let now = now_ms();
        let mut current = None;
        let mut retired = Vec::new();
        for (name, value) in rows {
            if name == HEADER_SEAL {
                current = Some(decode(&name, &value)?);
            } else if let Some(rest) = name.strip_prefix(RETIRED_PREFIX) {
                let expires: i64 = rest
                    .split(':')
                    .next()
                    .and_then(|ms| ms.parse().ok())
                    .unwrap_or(0);
                if expires > now {
                    retired.push(decode(&name, &value)?);
                }
            }
        }
        let current = current.ok_or_else(|| {
            StoreError::Database(format!("carteiro_secrets.{HEADER_SEAL} vanished"))
        })?;
        Ok(SealSecrets { current, retired })
    }

    /// Rotates the header-seal key: the current key keeps verifying for `accept_old_ms`,
    /// a fresh one seals from now on. Expired retired keys are deleted. Returns the new
    /// secrets.
    pub async fn header_seal_rotate(&self, accept_old_ms: i64) -> Result<SealSecrets, StoreError> {
        if self.seal_secret.is_some() {
            return Err(StoreError::Invalid(
                "the header-seal key comes from [security] seal_key or seal_key_file: rotate it \
                 there and restart the gateways (copies sealed with the old key still count \
                 their attempts)"
                    .to_owned(),
            ));
        }
        self.header_seal_secrets().await?;
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let current: String =
            sqlx::query_scalar("SELECT value FROM carteiro_secrets WHERE name = $1")
                .bind(HEADER_SEAL)
                .fetch_one(&mut *tx)
                .await?;
        let expires = now.saturating_add(accept_old_ms.max(0));
        let retired_name = format!(
            "{RETIRED_PREFIX}{expires}:{}",
            uuid::Uuid::now_v7().simple()
        );
        sqlx::query("INSERT INTO carteiro_secrets (name, value) VALUES ($1, $2)")
            .bind(retired_name)
            .bind(current)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE carteiro_secrets SET value = $2 WHERE name = $1")
            .bind(HEADER_SEAL)
            .bind(hex::encode(rand::random::<[u8; 32]>()))
            .execute(&mut *tx)
            .await?;
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM carteiro_secrets WHERE name LIKE 'header-seal-retired:%'",
        )
        .fetch_all(&mut *tx)
        .await?;
        for name in rows {
            let expired = name
                .strip_prefix(RETIRED_PREFIX)
                .and_then(|rest| rest.split(':').next())
                .and_then(|ms| ms.parse::<i64>().ok())
                .is_none_or(|ms| ms <= now);
            if expired {
                sqlx::query("DELETE FROM carteiro_secrets WHERE name = $1")
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        self.header_seal_secrets().await
    }
}
