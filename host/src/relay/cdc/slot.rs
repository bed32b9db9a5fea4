//! The publication and the replication slot the CDC relay reads, created at start when
//! missing, and the slot's retained WAL (how far behind its confirmed position is).

use std::time::{Duration, Instant};

use sqlx::Connection;

use crate::common::alert::{Change, LoggedAlert};

/// Why the CDC relay cannot start on this PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error(
        "PostgreSQL runs with wal_level = {0}; the CDC relay ([relay] mode = \"cdc\") needs \
         wal_level = logical (and max_replication_slots, max_wal_senders of at least 1 each): \
         set it in postgresql.conf or with `ALTER SYSTEM SET wal_level = logical` and restart \
         PostgreSQL, or use [relay] mode = \"poll\""
    )]
    WalLevel(String),
    #[error("replication slot or publication setup failed: {0}")]
    Database(#[from] sqlx::Error),
}

impl SlotError {
    /// A setting to change, not an outage: retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        matches!(self, SlotError::WalLevel(_))
    }
}

/// SQLSTATE duplicate_object: another relay created it first.
const DUPLICATE_OBJECT: &str = "42710";

fn is_duplicate(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == DUPLICATE_OBJECT)
}

/// Checks `wal_level`, creates the publication (inserts into `outbox` only: marks and purges
/// are not the relay's business) and the `pgoutput` slot when missing. Returns whether this
/// call created the slot.
pub async fn ensure(store_url: &str, slot: &str, publication: &str) -> Result<bool, SlotError> {
    let mut conn = sqlx::postgres::PgConnection::connect(store_url).await?;
    let wal_level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&mut conn)
        .await?;
    if wal_level != "logical" {
        return Err(SlotError::WalLevel(wal_level));
    }
    let has_publication: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM pg_publication WHERE pubname = $1")
            .bind(publication)
            .fetch_optional(&mut conn)
            .await?;
    if has_publication.is_none() {
        // The name is checked by the config (lower-case letters, digits, `_`).
        let create =
            format!("CREATE PUBLICATION {publication} FOR TABLE outbox WITH (publish = 'insert')");
        match sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&mut conn)
            .await
        {
            Ok(_) => tracing::info!(publication, "created the outbox publication"),
            Err(e) if is_duplicate(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let has_slot: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM pg_replication_slots WHERE slot_name = $1")
            .bind(slot)
            .fetch_optional(&mut conn)
            .await?;
    let mut created = false;
    if has_slot.is_none() {
        match sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
            .bind(slot)
            .execute(&mut conn)
            .await
        {
            Ok(_) => {
                tracing::info!(slot, "created the outbox replication slot");
                created = true;
            }
            Err(e) if is_duplicate(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let _ = conn.close().await;
    Ok(created)
}

/// Bytes of WAL the slot holds back: the server's WAL position minus the slot's confirmed
/// position. `None`: no such slot.
pub async fn retained_bytes(store_url: &str, slot: &str) -> Result<Option<i64>, sqlx::Error> {
    let mut conn = sqlx::postgres::PgConnection::connect(store_url).await?;
    let lag: Option<Option<i64>> = sqlx::query_scalar(
        "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint \
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(&mut conn)
    .await?;
    let _ = conn.close().await;
    Ok(lag.flatten())
}

/// The server's current WAL position (`pg_current_wal_lsn()`), as a number.
pub async fn current_wal_lsn(store_url: &str) -> Result<u64, sqlx::Error> {
    let mut conn = sqlx::postgres::PgConnection::connect(store_url).await?;
    let lsn: i64 = sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint")
        .fetch_one(&mut conn)
        .await?;
    let _ = conn.close().await;
    Ok(u64::try_from(lsn).unwrap_or(0))
}

/// The `[relay] max_slot_lag` alert: raised when the slot holds more WAL than the bound,
/// logged again every `remind` while raised, cleared under it.
#[derive(Debug)]
pub struct LagAlert {
    /// Where the alert's (monotonic) clock starts.
    origin: Instant,
    state: LoggedAlert,
}

impl Default for LagAlert {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            state: LoggedAlert::default(),
        }
    }
}

impl LagAlert {
    pub fn is_raised(&self) -> bool {
        self.state.is_raised()
    }

    pub fn observe(
        &mut self,
        bytes: u64,
        max: u64,
        now: Instant,
        remind: Duration,
    ) -> Option<Change> {
        let now = now.saturating_duration_since(self.origin);
        self.state.observe(bytes > max, now, remind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_alert_raises_reminds_and_clears() {
        let mut alert = LagAlert::default();
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        assert_eq!(alert.observe(10, 100, t0, minute), None);
        assert_eq!(alert.observe(101, 100, t0, minute), Some(Change::Raised));
        assert!(alert.is_raised());
        assert_eq!(alert.observe(500, 100, t0 + minute / 2, minute), None);
        assert_eq!(
            alert.observe(500, 100, t0 + minute, minute),
            Some(Change::Reminder)
        );
        assert_eq!(
            alert.observe(100, 100, t0 + minute, minute),
            Some(Change::Cleared)
        );
        assert!(!alert.is_raised());
    }
}
