//! Carteiro's bookkeeping of application outboxes (`[[outboxes]]`): the rows whose publish
//! failed, and which relay publishes each outbox now. It lives in Carteiro's store so that
//! the application's table needs no column beyond the published ones (docs/outboxes.md).

use super::outbox::PARKED;
use super::{Store, StoreError, nul_free};

/// A row of an application outbox whose publish failed.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AppFailure {
    pub row_id: i64,
    pub event_id: String,
    pub ordering_key: String,
    pub attempts: i64,
    pub last_error: String,
    /// Unix ms from when it may be tried again; [`AppFailure::parked`] rows never are.
    pub retry_at: i64,
    /// Unix ms of the last failure.
    pub failed_at: i64,
}

impl AppFailure {
    /// It can never be published: it waits for an operator (`carteiro outbox retry`).
    pub fn parked(&self) -> bool {
        self.retry_at == PARKED
    }
}

/// How a failed row waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Try again after this many ms.
    Retry(i64),
    /// Never again until an operator releases it.
    Park,
}

impl Store {
    /// Makes `owner` the relay that publishes `outbox` for `lease_ms` by the store's clock,
    /// if nobody else holds it or the holder's lease ran out; renews it if `owner` holds
    /// it. Returns whether `owner` holds it now.
    pub async fn app_outbox_lead(
        &self,
        outbox: &str,
        owner: &str,
        lease_ms: i64,
    ) -> Result<bool, StoreError> {
        let clock = self.dialect().clock_ms();
        let sql = format!(
            "INSERT INTO application_outbox_leaders (outbox, owner, expires_at) \
             VALUES ($1, $2, {clock} + $3) \
             ON CONFLICT (outbox) DO UPDATE SET owner = excluded.owner, \
             expires_at = excluded.expires_at \
             WHERE application_outbox_leaders.owner = excluded.owner \
             OR application_outbox_leaders.expires_at < {clock} \
             RETURNING owner"
        );
        self.bounded("application outbox lead", async {
            let mut tx = self.begin_write().await?;
            let won: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(outbox)
                .bind(owner)
                .bind(lease_ms)
                .fetch_optional(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(won.is_some())
        })
        .await
    }

    /// `owner` stops publishing `outbox`: a standing-by relay may take over at once.
    pub async fn app_outbox_step_down(&self, outbox: &str, owner: &str) -> Result<(), StoreError> {
        self.bounded("application outbox step down", async {
            let delete = sqlx::query(
                "DELETE FROM application_outbox_leaders WHERE outbox = $1 AND owner = $2",
            )
            .bind(outbox)
            .bind(owner);
            self.execute_write(delete).await.map(|_| ())
        })
        .await
    }

    /// The relay publishing `outbox` now, if its lease runs.
    pub async fn app_outbox_leader(&self, outbox: &str) -> Result<Option<String>, StoreError> {
        let clock = self.dialect().clock_ms();
        let sql = format!(
            "SELECT owner FROM application_outbox_leaders \
             WHERE outbox = $1 AND expires_at >= {clock}"
        );
        self.bounded("application outbox leader", async {
            Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(outbox)
                .fetch_optional(self.pool())
                .await?)
        })
        .await
    }

    /// The failed rows of `outbox`, in id order; `waiting`: only those that may not be
    /// tried yet (in backoff or parked).
    pub async fn app_outbox_failures(
        &self,
        outbox: &str,
        waiting: bool,
    ) -> Result<Vec<AppFailure>, StoreError> {
        let clock = self.dialect().clock_ms();
        let only = if waiting {
            format!("AND retry_at > {clock}")
        } else {
            String::new()
        };
        let sql = format!(
            "SELECT row_id, event_id, ordering_key, attempts, last_error, retry_at, failed_at \
             FROM application_outbox_failures WHERE outbox = $1 {only} ORDER BY row_id"
        );
        self.bounded("application outbox failures", async {
            Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(outbox)
                .fetch_all(self.pool())
                .await?)
        })
        .await
    }

    /// Counts a failed publish of row `row_id` of `outbox` with `error`, and how it waits.
    pub async fn app_outbox_record_failure(
        &self,
        outbox: &str,
        row: (i64, &str, &str),
        error: &str,
        wait: Wait,
    ) -> Result<(), StoreError> {
        let (row_id, event_id, ordering_key) = row;
        let clock = self.dialect().clock_ms();
        let retry_at = match wait {
            Wait::Retry(_) => format!("{clock} + $6"),
            Wait::Park => PARKED.to_string(),
        };
        let after = match wait {
            Wait::Retry(ms) => ms,
            Wait::Park => 0,
        };
        let sql = format!(
            "INSERT INTO application_outbox_failures \
             (outbox, row_id, event_id, ordering_key, attempts, last_error, retry_at, failed_at) \
             VALUES ($1, $2, $3, $4, 1, $5, {retry_at}, {clock}) \
             ON CONFLICT (outbox, row_id) DO UPDATE SET \
             attempts = application_outbox_failures.attempts + 1, \
             last_error = excluded.last_error, retry_at = excluded.retry_at, \
             failed_at = excluded.failed_at"
        );
        self.bounded("application outbox record failure", async {
            let mut insert = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(outbox)
                .bind(row_id)
                .bind(nul_free::lossy(event_id))
                .bind(nul_free::lossy(ordering_key))
                .bind(nul_free::lossy(error));
            if matches!(wait, Wait::Retry(_)) {
                insert = insert.bind(after);
            }
            self.execute_write(insert).await.map(|_| ())
        })
        .await
    }

    /// Forgets the failures of rows `ids` of `outbox` (published since, or released by an
    /// operator to be tried again); returns how many there were.
    pub async fn app_outbox_forget(&self, outbox: &str, ids: &[i64]) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
        let values = self.dialect().json_array_values(2, true);
        let sql = format!(
            "DELETE FROM application_outbox_failures WHERE outbox = $1 AND row_id IN ({values})"
        );
        self.bounded("application outbox forget", async {
            let delete = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(outbox)
                .bind(list);
            self.execute_write(delete).await
        })
        .await
    }
}
