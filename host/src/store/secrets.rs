//! Secrets shared by every gateway on one store: the keys that seal Carteiro's headers
//! (`broker::seal`). Anyone who can read this table is trusted already. With `[security]
//! seal_key` or `seal_key_file` the key comes from outside and the table is left alone.
//!
//! The keyring, as rows of `carteiro_secrets`:
//! - `header-seal`: the key that seals (until a newer key below takes over).
//! - `header-seal-next:<activates ms>:<n>`: a rotated-in key. It verifies at once and seals
//!   only from `activates` (the database's clock), which a rotation sets one keyring refresh
//!   (plus a margin) ahead: by then every running gateway has read it, so no gateway meets a
//!   copy sealed with a key it does not know. The next rotation writes it to `header-seal`.
//! - `header-seal-retired:<expires ms>:<n>`: a key that verifies until `expires` (copies in
//!   flight keep their attempt count) and never seals.
//!
//! A rotation takes the `header-seal` row's lock first, so two at once run one after the
//! other: the second finds the first's key pending and is refused, and no key is lost.

use super::{Store, StoreError};

const HEADER_SEAL: &str = "header-seal";
const RETIRED_PREFIX: &str = "header-seal-retired:";
const NEXT_PREFIX: &str = "header-seal-next:";

/// The header-seal keys as the database's clock sees them now.
#[derive(Clone, PartialEq, Eq)]
pub struct SealSecrets {
    /// The key that seals now.
    pub current: Vec<u8>,
    /// Keys that verify only, until their window ends.
    pub retired: Vec<Vec<u8>>,
    /// A rotated-in key that verifies but seals only later.
    pub next: Option<NextKey>,
}

/// A key that verifies now and seals from `activates_at`.
#[derive(Clone, PartialEq, Eq)]
pub struct NextKey {
    pub secret: Vec<u8>,
    /// Unix ms, by the database's clock.
    pub activates_at: i64,
}

impl std::fmt::Debug for SealSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SealSecrets(1 current, {} retired, next: {:?}, ***)",
            self.retired.len(),
            self.next.as_ref().map(|n| n.activates_at)
        )
    }
}

impl SealSecrets {
    fn only(secret: &[u8]) -> Self {
        Self {
            current: secret.to_vec(),
            retired: Vec::new(),
            next: None,
        }
    }

    /// Every key that verifies without sealing: the retired ones and the next one.
    pub fn verifying(&self) -> Vec<Vec<u8>> {
        let mut keys = self.retired.clone();
        keys.extend(self.next.iter().map(|n| n.secret.clone()));
        keys
    }
}

fn decode(name: &str, value: &str) -> Result<Vec<u8>, StoreError> {
    hex::decode(value.trim()).map_err(|e| {
        StoreError::Database(format!(
            "carteiro_secrets.{name} is not hex ({e}); delete the row to make a new key"
        ))
    })
}

/// The time in a `<prefix><ms>:<n>` name (0 when unreadable: expired, or active).
fn time_in(rest: &str) -> i64 {
    rest.split(':')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

/// A row of `carteiro_secrets`: a key's name and its hex value.
#[derive(Debug, Clone, sqlx::FromRow)]
struct SecretRow {
    name: String,
    value: String,
}

/// A row of the keyring with the database's clock at the time it was read.
#[derive(sqlx::FromRow)]
struct SecretAt {
    #[sqlx(flatten)]
    row: SecretRow,
    now: i64,
}

/// The keyring `rows` hold at `now`: the newest next key whose time has come seals, the
/// stored `header-seal` and older next keys then only verify.
fn keyring(rows: &[SecretRow], now: i64) -> Result<SealSecrets, StoreError> {
    let mut stored = None;
    let mut retired = Vec::new();
    let mut nexts = Vec::new();
    for SecretRow { name, value } in rows {
        if name == HEADER_SEAL {
            stored = Some(decode(name, value)?);
        } else if let Some(rest) = name.strip_prefix(RETIRED_PREFIX) {
            if time_in(rest) > now {
                retired.push(decode(name, value)?);
            }
        } else if let Some(rest) = name.strip_prefix(NEXT_PREFIX) {
            nexts.push((time_in(rest), decode(name, value)?));
        }
    }
    let stored = stored
        .ok_or_else(|| StoreError::Database(format!("carteiro_secrets.{HEADER_SEAL} vanished")))?;
    nexts.sort_by_key(|(at, _)| *at);
    let split = nexts.partition_point(|(at, _)| *at <= now);
    let mut pending = nexts.split_off(split).into_iter();
    // The stored key, once replaced, verifies as long as the retired row the rotation wrote
    // for it says (so a window of 0 ends at once).
    let mut current = stored;
    let mut replaced = Vec::new();
    for (_, secret) in nexts {
        replaced.push(std::mem::replace(&mut current, secret));
    }
    retired.extend(replaced.into_iter().skip(1));
    let next = pending.next().map(|(activates_at, secret)| NextKey {
        secret,
        activates_at,
    });
    retired.extend(pending.map(|(_, secret)| secret));
    retired.retain(|k| *k != current);
    retired.sort();
    retired.dedup();
    Ok(SealSecrets {
        current,
        retired,
        next,
    })
}

/// The rows a rotation writes: the key that seals now (written back: a next key whose time
/// came is promoted), the same key retired until `accept_old_ms` after `activates`, and a
/// fresh key that seals from `activates`.
fn rotation_rows(current: &[u8], activates: i64, accept_old_ms: i64) -> [SecretRow; 3] {
    let expires = activates.saturating_add(accept_old_ms.max(0));
    let unique = || uuid::Uuid::now_v7().simple().to_string();
    let row = |name: String, value: String| SecretRow { name, value };
    [
        row(HEADER_SEAL.to_owned(), hex::encode(current)),
        row(
            format!("{RETIRED_PREFIX}{expires}:{}", unique()),
            hex::encode(current),
        ),
        row(
            format!("{NEXT_PREFIX}{activates}:{}", unique()),
            hex::encode(rand::random::<[u8; 32]>()),
        ),
    ]
}

/// The rows a rotation at `now` deletes: retired keys past their window, and next keys
/// (whose time came: the rotation promotes the newest).
fn stale_rows(rows: &[SecretRow], now: i64) -> impl Iterator<Item = &str> {
    rows.iter().map(|r| r.name.as_str()).filter(move |name| {
        match name.strip_prefix(RETIRED_PREFIX) {
            Some(rest) => time_in(rest) <= now,
            None => name.starts_with(NEXT_PREFIX),
        }
    })
}

impl Store {
    /// The key that seals now: created on first use (the first gateway's key wins a race),
    /// then the same for every gateway and CLI on this store.
    pub async fn header_seal_secret(&self) -> Result<Vec<u8>, StoreError> {
        Ok(self.header_seal_secrets().await?.current)
    }

    /// The keyring (its `header-seal` created on first use); or the one key given by
    /// [`Store::with_header_seal_secret`].
    pub async fn header_seal_secrets(&self) -> Result<SealSecrets, StoreError> {
        if let Some(secret) = &self.seal_secret {
            return Ok(SealSecrets::only(secret));
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

    /// The keyring as stored, read only (a running gateway's refresh): `header-seal` exists
    /// already, made at start-up by [`Self::header_seal_secrets`].
    pub async fn header_seal_keyring(&self) -> Result<SealSecrets, StoreError> {
        if let Some(secret) = &self.seal_secret {
            return Ok(SealSecrets::only(secret));
        }
        let clock = self.dialect.clock_ms();
        let sql = format!(
            "SELECT name, value, {clock} AS now FROM carteiro_secrets \
             WHERE name LIKE 'header-seal%'"
        );
        let rows: Vec<SecretAt> = self
            .bounded("header-seal keys", async {
                Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .fetch_all(&self.pool)
                    .await?)
            })
            .await?;
        let now = rows.first().map_or(0, |r| r.now);
        let rows: Vec<SecretRow> = rows.into_iter().map(|r| r.row).collect();
        keyring(&rows, now)
    }

    /// Rotates the header-seal key: a fresh key verifies at once and seals from
    /// `activate_after_ms` on (the database's clock); the one it replaces keeps verifying
    /// for `accept_old_ms` after that. Refused while an earlier rotation's key is still
    /// waiting to seal. Expired retired keys are deleted. Returns the keyring.
    pub async fn header_seal_rotate(
        &self,
        accept_old_ms: i64,
        activate_after_ms: i64,
    ) -> Result<SealSecrets, StoreError> {
        if self.seal_secret.is_some() {
            return Err(StoreError::Invalid(
                "the header-seal key comes from [security] seal_key or seal_key_file: rotate it \
                 there and restart the gateways (copies sealed with the old key still count \
                 their attempts)"
                    .to_owned(),
            ));
        }
        self.header_seal_secrets().await?;
        let mut tx = self.begin_write().await?;
        // The row lock (PostgreSQL; SQLite's write lock is held already) that makes two
        // rotations at once run one after the other: without it both retire the same key
        // and the second overwrites the first's new key.
        sqlx::query("UPDATE carteiro_secrets SET value = value WHERE name = $1")
            .bind(HEADER_SEAL)
            .execute(&mut *tx)
            .await?;
        let clock = self.dialect.clock_ms();
        let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {clock}")))
            .fetch_one(&mut *tx)
            .await?;
        let rows: Vec<SecretRow> = sqlx::query_as(
            "SELECT name, value FROM carteiro_secrets WHERE name LIKE 'header-seal%'",
        )
        .fetch_all(&mut *tx)
        .await?;
        let ring = keyring(&rows, now)?;
        if let Some(next) = &ring.next {
            return Err(StoreError::Invalid(format!(
                "a rotation is under way: its key seals from {} (the database's clock), once \
                 every gateway has read it; rotate again after that",
                crate::common::rfc3339(next.activates_at)
            )));
        }
        let activates = now.saturating_add(activate_after_ms.max(0));
        let writes = rotation_rows(&ring.current, activates, accept_old_ms);
        for name in stale_rows(&rows, now) {
            sqlx::query("DELETE FROM carteiro_secrets WHERE name = $1")
                .bind(name)
                .execute(&mut *tx)
                .await?;
        }
        for SecretRow { name, value } in writes {
            sqlx::query(
                "INSERT INTO carteiro_secrets (name, value) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            )
            .bind(name)
            .bind(value)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        self.header_seal_keyring().await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn row(name: &str, key: u8) -> SecretRow {
        SecretRow {
            name: name.to_owned(),
            value: hex::encode([key; 4]),
        }
    }

    #[test]
    fn a_next_key_verifies_first_and_seals_from_its_time() {
        let rows = [
            row("header-seal", 1),
            row("header-seal-retired:150:a", 1),
            row("header-seal-retired:120:b", 9),
            row("header-seal-retired:90:d", 8),
            row("header-seal-next:100:c", 2),
        ];
        let before = keyring(&rows, 99).unwrap();
        assert_eq!(before.current, [1; 4]);
        assert_eq!(before.retired, vec![vec![9; 4]]);
        assert_eq!(before.next.as_ref().unwrap().activates_at, 100);
        assert_eq!(before.verifying(), vec![vec![9; 4], vec![2; 4]]);
        let after = keyring(&rows, 100).unwrap();
        assert_eq!(after.current, [2; 4]);
        assert_eq!(
            after.retired,
            vec![vec![1; 4], vec![9; 4]],
            "expired 8, old current once"
        );
        assert!(after.next.is_none());
        assert!(keyring(&rows[1..], 0).is_err(), "no header-seal");
    }
}
