//! Outbox bookkeeping for the CDC relay (`[relay] mode = "cdc"`), which reads rows from a
//! replication slot instead of claiming them: it holds no leases, so these statements never
//! look at `lease_owner`. Marking published is shared with the polling relay
//! (`outbox_mark_published_many`).

use super::outbox::PARKED;
use super::sql::{Placeholders, shaped_chunks};
use super::{Store, StoreError, nul_free};

impl Store {
    /// Which of `ids` are still in the outbox to publish. A row already marked (by a relay
    /// that died before the slot learnt of it), parked (it would be parked again, its count
    /// and error overwritten) or purged since is not returned.
    pub async fn outbox_unpublished_among(&self, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
        let open = format!("AND published_at IS NULL AND next_attempt_at <> {PARKED}");
        self.bounded("outbox unpublished among", self.ids_among(ids, &open))
            .await
    }

    /// Which of `ids` exist in the outbox, published or not. A row missing here may be one
    /// whose transaction the slot sent before it became visible to other sessions (a
    /// walsender decodes a commit once it is in the WAL, a moment before that).
    pub async fn outbox_existing_among(&self, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
        self.bounded("outbox existing among", self.ids_among(ids, ""))
            .await
    }

    /// The outbox ids among `ids` that pass `condition` (SQL after the id list), sorted.
    async fn ids_among(&self, ids: &[i64], condition: &str) -> Result<Vec<i64>, StoreError> {
        let mut out = Vec::new();
        for chunk in shaped_chunks(ids) {
            let mut p = Placeholders::new(self.dialect);
            let sql = format!(
                "SELECT id FROM outbox WHERE id IN ({}) {condition}",
                p.list(chunk.len())
            );
            let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
            for id in chunk {
                query = query.bind(*id);
            }
            out.extend(query.fetch_all(self.pool()).await?);
        }
        out.sort_unstable();
        Ok(out)
    }

    /// A CDC publish of row `id` failed: count the attempt and keep `error` (for `carteiro
    /// outbox status` and the `outbox_failing` gauge). `park`: it can never be published;
    /// it then holds its ordering key as a parked row of the polling relay does.
    pub async fn outbox_record_failure(
        &self,
        id: i64,
        error: &str,
        park: bool,
    ) -> Result<(), StoreError> {
        self.bounded("outbox record failure", async {
            let next = if park { PARKED } else { 0 };
            let update = sqlx::query(
                "UPDATE outbox SET attempts = attempts + 1, last_error = $2, \
                 next_attempt_at = CASE WHEN $3 > next_attempt_at THEN $3 ELSE next_attempt_at END \
                 WHERE id = $1 AND published_at IS NULL",
            )
            .bind(id)
            .bind(nul_free::lossy(error))
            .bind(next);
            self.execute_write(update).await.map(|_| ())
        })
        .await
    }

    /// The highest outbox id so far (0 when empty): the end of the backlog a CDC relay
    /// drains through the polling path before it reads the slot.
    pub async fn outbox_max_id(&self) -> Result<i64, StoreError> {
        self.bounded("outbox max id", async {
            let max: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM outbox")
                .fetch_one(self.pool())
                .await?;
            Ok(max.unwrap_or(0))
        })
        .await
    }

    /// Unpublished rows up to `max_id` that a relay may still publish (not parked).
    pub async fn outbox_backlog_up_to(&self, max_id: i64) -> Result<i64, StoreError> {
        self.bounded("outbox backlog", async {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM outbox \
                 WHERE id <= $1 AND published_at IS NULL AND next_attempt_at < $2",
            )
            .bind(max_id)
            .bind(PARKED)
            .fetch_one(self.pool())
            .await?;
            Ok(n)
        })
        .await
    }

    /// The backend process that reads replication slot `slot` now (`None`: nobody does, or
    /// there is no such slot): the CDC relay's fence (PostgreSQL only).
    pub async fn replication_slot_reader(&self, slot: &str) -> Result<Option<i32>, StoreError> {
        self.bounded("replication slot reader", async {
            let pid: Option<Option<i32>> = sqlx::query_scalar(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            )
            .bind(slot)
            .fetch_optional(self.pool())
            .await?;
            Ok(pid.flatten())
        })
        .await
    }

    /// The ordering keys held by a parked row: their later rows must not go out.
    pub async fn outbox_parked_keys(&self) -> Result<Vec<String>, StoreError> {
        self.bounded("outbox parked keys", async {
            let keys: Vec<String> = sqlx::query_scalar(
                "SELECT DISTINCT ordering_key FROM outbox \
                 WHERE published_at IS NULL AND attempts > 0 AND ordering_key <> '' \
                   AND next_attempt_at = $1",
            )
            .bind(PARKED)
            .fetch_all(self.pool())
            .await?;
            Ok(keys)
        })
        .await
    }
}
