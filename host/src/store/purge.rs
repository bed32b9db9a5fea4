//! Retention purges in bounded batches: [`RETENTION_BATCH`] rows per short write
//! transaction and a [`RETENTION_PAUSE`] between batches, so purging a backlog of millions
//! never holds a lock for long nor keeps the pipeline's commits waiting behind it. On
//! PostgreSQL each batch locks its rows with `FOR UPDATE SKIP LOCKED`: gateways sharing a
//! store purge at the same time, split the rows and never wait on each other.

use std::time::Duration;

use sqlx::AssertSqlSafe;

use super::{Store, StoreError};

/// Rows deleted per transaction by a retention purge.
pub const RETENTION_BATCH: u64 = 1_000;

/// Pause between two batches of one retention purge: the writers queued behind a batch
/// (SQLite's single writer, PostgreSQL's row locks) go first.
pub const RETENTION_PAUSE: Duration = Duration::from_millis(50);

impl Store {
    /// Deletes the rows of `table` matching `condition` (with `$1` bound to `arg`) in batches
    /// of [`RETENTION_BATCH`], each its own short write transaction and its own bounded
    /// operation, [`RETENTION_PAUSE`] apart, until a batch finds fewer rows. Returns how many
    /// rows went. A failed batch ends the purge with its error; the batches before it stay
    /// deleted.
    ///
    /// `index` names the index the rows are found by, for a planner without statistics
    /// (SQLite's, which may otherwise walk the whole table for every batch).
    pub(crate) async fn purge_where(
        &self,
        table: &str,
        index: Option<&str>,
        condition: &str,
        arg: i64,
    ) -> Result<u64, StoreError> {
        // The condition is checked again on the row deleted: a row changed meanwhile (a
        // tombstone revived, a dead letter claimed for a replay) is left alone.
        let sql = self
            .dialect
            .delete_batch(table, index, condition, RETENTION_BATCH);
        let mut total = 0;
        loop {
            let deleted = self
                .bounded(
                    "retention purge",
                    self.execute_write(sqlx::query(AssertSqlSafe(sql.as_str())).bind(arg)),
                )
                .await?;
            total += deleted;
            if deleted < RETENTION_BATCH {
                return Ok(total);
            }
            tokio::time::sleep(RETENTION_PAUSE).await;
        }
    }
}
