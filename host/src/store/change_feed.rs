//! How the relay learns of committed outbox rows besides polling: wake-ups on commits by any
//! process sharing the store ([`Store::commit_wakeups`]), and the PostgreSQL logical
//! replication slot the CDC relay reads (its publication, slot, lag and the WAL position).
//! The replication stream itself is the relay's (`relay/cdc`).

use sqlx::{ConnectOptions, Connection};
use tokio::sync::mpsc;

use super::outbox::OUTBOX_NOTIFY_CHANNEL;
use super::{Listen, Store, StoreError};

/// Wake-ups on commits of outbox rows, from [`Store::commit_wakeups`]. Several commits may
/// come as one wake-up; the relay's poll interval covers any that are missed.
#[derive(Debug)]
pub struct CommitWakeups {
    /// `None`: nothing to listen to (SQLite, whose committer wakes the relay in-process).
    rx: Option<mpsc::Receiver<()>>,
}

impl CommitWakeups {
    /// Returns at the next wake-up; never, when there are none to wait for.
    pub async fn next(&mut self) {
        let woken = match self.rx.as_mut() {
            Some(rx) => rx.recv().await.is_some(),
            None => false,
        };
        if !woken {
            std::future::pending::<()>().await;
        }
    }
}

/// SQLSTATE duplicate_object: another relay created it first.
const DUPLICATE_OBJECT: &str = "42710";

fn is_duplicate(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == DUPLICATE_OBJECT)
}

impl Store {
    /// Wake-ups when any process commits outbox rows: the dialect's listener on the channel
    /// every such commit signals (PostgreSQL `LISTEN`), on a connection of its own, until the
    /// returned value is dropped. None where the database signals nothing (SQLite).
    pub fn commit_wakeups(&self) -> CommitWakeups {
        self.wakeups_on(OUTBOX_NOTIFY_CHANNEL)
    }

    /// Wake-ups on each signal of `channel` (an application outbox's opt-in trigger).
    pub fn wakeups_on(&self, channel: &str) -> CommitWakeups {
        let (wake, rx) = mpsc::channel(1);
        let url = self.options.database_url.to_string();
        let channel = channel.to_owned();
        match self.dialect.listen(Listen { url, channel, wake }) {
            Some(listening) => {
                tokio::spawn(listening);
                CommitWakeups { rx: Some(rx) }
            }
            None => CommitWakeups { rx: None },
        }
    }

    /// `wal_level` (the CDC relay needs `logical`).
    pub async fn wal_level(&self) -> Result<String, StoreError> {
        self.bounded("wal level", async {
            Ok(sqlx::query_scalar("SHOW wal_level")
                .fetch_one(self.pool())
                .await?)
        })
        .await
    }

    /// Creates the publication `publication` on the outbox (inserts only: marks and purges
    /// are not the relay's business) and the `pgoutput` replication slot `slot` when
    /// missing; returns whether this call created the slot. Runs on a connection of its own,
    /// without the statement timeout: creating a slot waits for running transactions.
    pub async fn ensure_outbox_slot(
        &self,
        slot: &str,
        publication: &str,
    ) -> Result<bool, StoreError> {
        self.ensure_slot_on("outbox", slot, publication).await
    }

    /// [`Store::ensure_outbox_slot`] for any `table` (an SQL name, quoted where needed): an
    /// application's outbox on its own database.
    pub async fn ensure_slot_on(
        &self,
        table: &str,
        slot: &str,
        publication: &str,
    ) -> Result<bool, StoreError> {
        let mut conn = self.options.connect().await?;
        let has_publication: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM pg_publication WHERE pubname = $1")
                .bind(publication)
                .fetch_optional(&mut conn)
                .await?;
        if has_publication.is_none() {
            // The relay's config checks the name (lower-case letters, digits, `_`).
            let create = format!(
                "CREATE PUBLICATION {publication} FOR TABLE {table} WITH (publish = 'insert')"
            );
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
            match sqlx::query("SELECT 1 FROM pg_create_logical_replication_slot($1, 'pgoutput')")
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

    /// Bytes of WAL replication slot `slot` holds back: the server's WAL position minus the
    /// slot's confirmed position. `None`: no such slot.
    pub async fn replication_slot_lag(&self, slot: &str) -> Result<Option<i64>, StoreError> {
        self.bounded("replication slot lag", async {
            let lag: Option<Option<i64>> = sqlx::query_scalar(
                "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint \
                 FROM pg_replication_slots WHERE slot_name = $1",
            )
            .bind(slot)
            .fetch_optional(self.pool())
            .await?;
            Ok(lag.flatten())
        })
        .await
    }

    /// The server's current WAL position (`pg_current_wal_lsn()`), as a number.
    pub async fn current_wal_lsn(&self) -> Result<u64, StoreError> {
        self.bounded("current WAL position", async {
            let lsn: i64 =
                sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint")
                    .fetch_one(self.pool())
                    .await?;
            Ok(u64::try_from(lsn).unwrap_or(0))
        })
        .await
    }
}
