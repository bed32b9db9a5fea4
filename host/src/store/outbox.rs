//! Outbox reads and bookkeeping for the relay. Rows are inserted by `commit_batch` only.
//!
//! Several relays (one per gateway instance) may drain one database: `outbox_pending`
//! *leases* the rows it returns (`lease_owner`, `lease_until`), claiming them atomically
//! (`FOR UPDATE SKIP LOCKED` on PostgreSQL; the single-writer lock on SQLite), so no two
//! relays take the same row while a lease runs. A relay that dies simply lets its leases
//! expire; another relay then republishes (G3: duplicates only for rows in flight).

use super::commit::NewOutboxRow;
use super::sql::{Placeholders, shaped_chunks};
use super::{Store, StoreError, headers_from_json, now_ms, nul_free};

/// PostgreSQL `NOTIFY` channel signalled by every commit that inserted outbox rows.
pub const OUTBOX_NOTIFY_CHANNEL: &str = "carteiro_outbox";

/// A committed event waiting to be published: the event as its delivery committed it, and
/// the outbox's bookkeeping around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// Position in the outbox; rows are handed out in id order.
    pub id: i64,
    /// The event, verbatim; its `event_id` is the AMQP `message_id` to publish with, and rows
    /// sharing a non-empty `ordering_key` are handed out strictly in id order.
    pub event: NewOutboxRow,
    /// Unix ms of the commit.
    pub created_at: i64,
    /// Failed publish attempts so far.
    pub attempts: i64,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// The AMQP `type` (an application outbox's type column).
    pub message_type: Option<String>,
    /// Why the row can never be published, found when it was read (an application outbox's
    /// row with a NULL routing key, say): the relay parks it with this error.
    pub refused: Option<String>,
}

/// Outbox health for metrics and `/health`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxStatus {
    /// Unpublished rows.
    pub pending: i64,
    /// Age of the oldest unpublished row, in ms.
    pub oldest_pending_age_ms: Option<i64>,
    /// Unpublished rows whose last publish attempt failed.
    pub with_errors: i64,
    /// Unpublished rows currently leased by a relay (in flight).
    pub leased: i64,
}

/// `next_attempt_at` of a parked row, one AMQP can never carry: no clock reaches it, and the
/// row holds its ordering key (see the claim's held-back keys).
pub(super) const PARKED: i64 = i64::MAX;

/// A failed attempt of row `id`, leased by `owner`.
struct LeasedFailure<'a> {
    id: i64,
    owner: &'a str,
    error: &'a str,
}

/// Ids per `IN (...)` list: far below both backends' statement limits.
const ID_CHUNK: usize = 1_000;

/// `ids` as runs of consecutive ids `(first, last)`, in order of the sorted ids.
fn id_runs(ids: &[i64]) -> Vec<(i64, i64)> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(i64, i64)> = Vec::new();
    for id in sorted {
        match runs.last_mut() {
            Some((_, last)) if last.checked_add(1) == Some(id) => *last = id,
            _ => runs.push((id, id)),
        }
    }
    runs
}

fn id_list(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

const COLUMNS: &str = "id, event_id, route, plugin, exchange, routing_key, headers, content_type, \
                       payload, ordering_key, created_at, attempts, last_error";

impl Store {
    /// Leases up to `limit` publishable rows to `owner` for `lease_ms` and returns them in id
    /// order. Publishable: unpublished, not in backoff, not leased, and no unpublished row
    /// with the same non-empty ordering key is in backoff or leased by *another* owner
    /// (keeps per-key order across retries and relays: a key is held back as a whole while
    /// one of its rows is, which is never less strict than "no such earlier row").
    ///
    /// Rows leased by `owner` itself do not hold their key back: a relay that still
    /// publishes the head of a key's chain may take the next rows of that key and append them
    /// to its in-memory chain, so it never waits for its slowest chain before leasing more.
    /// That is sound only while every unpublished row leased by `owner` is in that relay's
    /// memory or confirmed: an owner is one relay *session*, and a session that loses track
    /// of a row (store error) ends and never uses its owner name again.
    pub async fn outbox_pending(
        &self,
        limit: i64,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        self.outbox_claim(limit, i64::MAX, owner, lease_ms).await
    }

    /// [`Store::outbox_pending`] bounded by bytes too: the rows returned (a prefix, in id
    /// order, of what `outbox_pending` would return) hold at most `max_bytes` of payload and
    /// headers together, except that the first row is always taken, however large. Rows
    /// that did not fit stay unleased for the next claim.
    ///
    /// Leases are timed by the database's clock, never the caller's: "now" is
    /// `clock_timestamp()` on PostgreSQL and SQLite's own clock (the host's, shared by
    /// every process on the file), read once per claim. A relay whose wall clock is wrong
    /// can neither steal a running lease (clock ahead) nor keep a dead relay's rows from
    /// coming back (clock behind).
    pub async fn outbox_claim(
        &self,
        limit: i64,
        max_bytes: i64,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        self.bounded("outbox claim", async {
            nul_free::text("lease owner", owner)?;
            // A planner without statistics (SQLite) may scan the table in rowid order (walking
            // every published row kept for retention) or read the pending index for the
            // held-back keys, so the two partial indexes are named where hints are taken.
            let d = self.dialect;
            let pending = d.index_hint("outbox_pending");
            let blocking = d.index_hint("outbox_blocking");
            let lock = d.skip_locked("o");
            let claimed = d.id_in("SELECT id FROM fitting");
            let now = "(SELECT now FROM clock)";
            let clock = d.clock_ms();
            // The held-back keys are computed once per claim (a hashed subplan / an ephemeral
            // index) from the small `outbox_blocking` index: rows ever leased or failed. The
            // `(lease_owner IS NOT NULL OR attempts > 0)` term is that index's predicate, spelled
            // the same so both planners use it. The candidates are locked (PostgreSQL) before
            // the byte budget is applied, since window functions cannot run under FOR UPDATE;
            // the locks of rows that did not fit end with this short transaction.
            let sql = format!(
                "WITH clock AS (SELECT {clock} AS now), \
                 candidates AS ( \
                   SELECT o.id, octet_length(o.payload) + octet_length(o.headers) AS size \
                   FROM outbox o{pending} \
                   WHERE o.published_at IS NULL AND o.next_attempt_at <= {now} \
                     AND (o.lease_until IS NULL OR o.lease_until <= {now}) \
                     AND o.ordering_key NOT IN ( \
                       SELECT b.ordering_key FROM outbox b{blocking} \
                       WHERE b.published_at IS NULL \
                         AND (b.lease_owner IS NOT NULL OR b.attempts > 0) \
                         AND b.ordering_key <> '' \
                         AND (b.next_attempt_at > {now} \
                              OR (b.lease_until > {now} AND b.lease_owner <> $1))) \
                   ORDER BY o.id LIMIT $3 {lock}), \
                 fitting AS ( \
                   SELECT id FROM ( \
                     SELECT id, SUM(size) OVER (ORDER BY id) AS total, \
                            ROW_NUMBER() OVER (ORDER BY id) AS n FROM candidates) w \
                   WHERE w.total <= $4 OR w.n = 1) \
                 UPDATE outbox SET lease_owner = $1, lease_until = {now} + $2 \
                 WHERE id {claimed} \
                 RETURNING {COLUMNS}"
            );
            let mut tx = self.begin_write().await?;
            if let Some(turn) = d.lock_names(1) {
                // Claims from several relays take turns (where writers do not exclude each
                // other already): a concurrent claim cannot see another's uncommitted leases,
                // and would take later rows of a key whose earlier rows are being leased right
                // now, breaking per-key order. Publishing stays concurrent.
                sqlx::query(sqlx::AssertSqlSafe(turn))
                    .bind("carteiro.outbox.claim")
                    .execute(&mut *tx)
                    .await?;
            }
            let rows: Vec<OutboxRecord> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(owner)
                .bind(lease_ms)
                .bind(limit)
                .bind(max_bytes)
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
            let mut out = rows
                .into_iter()
                .map(OutboxRow::try_from)
                .collect::<Result<Vec<_>, _>>()?;
            out.sort_by_key(|r| r.id); // RETURNING order is unspecified
            Ok(out)
        })
        .await
    }

    /// The database's clock, in unix ms (what leases and backoffs are timed by).
    pub async fn db_now_ms(&self) -> Result<i64, StoreError> {
        self.bounded("clock", async {
            let sql = format!("SELECT {}", self.dialect.clock_ms());
            let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(self.pool())
                .await?;
            Ok(now)
        })
        .await
    }

    /// The broker confirmed row `id`: never hand it out again. Idempotent.
    pub async fn outbox_mark_published(&self, id: i64) -> Result<(), StoreError> {
        self.bounded("outbox mark published", async {
            self.outbox_mark_published_many(&[id]).await.map(|_| ())
        })
        .await
    }

    /// The broker confirmed each of `ids`: mark them all published in one transaction (one
    /// commit, one WAL flush), whoever holds their leases. Idempotent; returns how many rows
    /// changed. Call it only with rows whose own confirm arrived (G3).
    pub async fn outbox_mark_published_many(&self, ids: &[i64]) -> Result<u64, StoreError> {
        self.bounded("outbox mark published many", async {
            if ids.is_empty() {
                return Ok(0);
            }
            let now = now_ms();
            let mut tx = self.begin_write().await?;
            let mut changed = 0;
            // A confirmed batch is mostly runs of consecutive ids (a commit's rows): one
            // `BETWEEN` per run, so a batch is usually one statement. Runs are bound in
            // statements of a few fixed sizes, whose prepared statements are reused.
            let runs = id_runs(ids);
            for chunk in shaped_chunks(&runs) {
                let mut p = Placeholders::new(self.dialect);
                let set = p.next();
                let within: Vec<String> = chunk
                    .iter()
                    .map(|_| format!("id BETWEEN {} AND {}", p.next(), p.next()))
                    .collect();
                let sql = format!(
                    "UPDATE outbox SET published_at = {set}, lease_owner = NULL, \
                     lease_until = NULL WHERE ({}) AND published_at IS NULL",
                    within.join(" OR ")
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now);
                for (first, last) in chunk {
                    query = query.bind(*first).bind(*last);
                }
                changed += query.execute(&mut *tx).await?.rows_affected();
            }
            tx.commit().await?;
            Ok(changed)
        })
        .await
    }

    /// Publishing row `id` failed (nack, returned, channel lost): count the attempt, keep the
    /// error, release the lease and hold the row back for `retry_after_ms` by the database's
    /// clock. Only while `owner` still holds the row's lease: a relay that slept past its
    /// lease (SIGSTOP, a long pause) must not reset a row another relay now owns. Returns
    /// whether the row was still `owner`'s.
    pub async fn outbox_mark_failed(
        &self,
        id: i64,
        owner: &str,
        error: &str,
        retry_after_ms: i64,
    ) -> Result<bool, StoreError> {
        let next = format!("{} + $3", self.dialect.clock_ms());
        let failure = LeasedFailure { id, owner, error };
        self.record_leased_failure("outbox mark failed", failure, &next, retry_after_ms)
            .await
    }

    /// Row `id` can never be published (AMQP cannot carry it): count the attempt, keep
    /// `error` and park it, so it holds its ordering key (an unordered row holds nothing)
    /// until an operator deals with it. Only while `owner` still leases it, as
    /// [`Store::outbox_mark_failed`]. Parked is a fixed `next_attempt_at`, not the clock plus
    /// a delay: `clock + i64::MAX` overflows PostgreSQL's `bigint`.
    pub async fn outbox_park(&self, id: i64, owner: &str, error: &str) -> Result<bool, StoreError> {
        let failure = LeasedFailure { id, owner, error };
        self.record_leased_failure("outbox park", failure, "$3", PARKED)
            .await
    }

    /// Counts a failed attempt of a leased row, keeps its error, releases the lease and sets
    /// `next_attempt_at` to `next` (SQL, with `$3` bound to `value`), while the row is still
    /// the owner's. Returns whether it was.
    async fn record_leased_failure(
        &self,
        what: &str,
        failure: LeasedFailure<'_>,
        next: &str,
        value: i64,
    ) -> Result<bool, StoreError> {
        self.bounded(what, async {
            nul_free::text("lease owner", failure.owner)?;
            let sql = format!(
                "UPDATE outbox SET attempts = attempts + 1, last_error = $2, \
                 next_attempt_at = {next}, lease_owner = NULL, lease_until = NULL \
                 WHERE id = $1 AND published_at IS NULL AND lease_owner = $4"
            );
            let update = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(failure.id)
                .bind(nul_free::lossy(failure.error))
                .bind(value)
                .bind(failure.owner);
            Ok(self.execute_write(update).await? == 1)
        })
        .await
    }

    /// Gives back the unpublished rows leased by `owner` (a relay shutting down cleanly), so
    /// another relay need not wait for the leases to expire.
    pub async fn outbox_release(&self, owner: &str) -> Result<u64, StoreError> {
        self.bounded("outbox release", async {
            nul_free::text("lease owner", owner)?;
            let release = sqlx::query(
                "UPDATE outbox SET lease_owner = NULL, lease_until = NULL \
                 WHERE lease_owner = $1 AND published_at IS NULL",
            )
            .bind(owner);
            self.execute_write(release).await
        })
        .await
    }

    /// Gives back the rows `ids` if `owner` still leases them and they are unpublished (a
    /// relay dropping the rest of a chain after a failure). Returns how many it released.
    pub async fn outbox_release_rows(&self, owner: &str, ids: &[i64]) -> Result<u64, StoreError> {
        self.bounded("outbox release rows", async {
            nul_free::text("lease owner", owner)?;
            if ids.is_empty() {
                return Ok(0);
            }
            let mut tx = self.begin_write().await?;
            let mut released = 0;
            for chunk in ids.chunks(ID_CHUNK) {
                let sql = format!(
                    "UPDATE outbox SET lease_owner = NULL, lease_until = NULL \
                     WHERE id IN ({}) AND lease_owner = $1 AND published_at IS NULL",
                    id_list(chunk)
                );
                // A rare path (after a failure) with ids in the text: keep it out of the cache.
                released += sqlx::query(sqlx::AssertSqlSafe(sql))
                    .persistent(false)
                    .bind(owner)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            }
            tx.commit().await?;
            Ok(released)
        })
        .await
    }

    /// Pending count, oldest pending age, failing and in-flight rows (leases by the
    /// database's clock).
    pub async fn outbox_status(&self) -> Result<OutboxStatus, StoreError> {
        self.bounded("outbox status", async {
            let now = now_ms();
            let sql = format!(
                "SELECT COUNT(*) AS pending, MIN(created_at) AS oldest, \
                     COUNT(last_error) AS with_errors, \
                     COUNT(CASE WHEN lease_until > {} THEN 1 END) AS leased \
                     FROM outbox WHERE published_at IS NULL",
                self.dialect.clock_ms()
            );
            let status: StatusRecord = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .fetch_one(self.pool())
                .await?;
            Ok(OutboxStatus {
                pending: status.pending,
                oldest_pending_age_ms: status.oldest.map(|t| now.saturating_sub(t).max(0)),
                with_errors: status.with_errors,
                leased: status.leased,
            })
        })
        .await
    }

    /// Retention (`[outbox] retain_published`): deletes rows published before `cutoff_ms`,
    /// in batches (`Store::purge_where`), found by the partial index of published rows. An
    /// unpublished row is never deleted, however old.
    pub async fn outbox_purge_published_before(&self, cutoff_ms: i64) -> Result<u64, StoreError> {
        self.purge_where(
            "outbox",
            Some("outbox_published_at"),
            "published_at IS NOT NULL AND published_at < $1",
            cutoff_ms,
        )
        .await
    }
}

/// An outbox row as the table holds it ([`COLUMNS`]).
#[derive(sqlx::FromRow)]
struct OutboxRecord {
    id: i64,
    event_id: String,
    route: String,
    plugin: String,
    exchange: String,
    routing_key: String,
    /// JSON text (`headers_to_json`).
    headers: String,
    content_type: Option<String>,
    payload: Vec<u8>,
    ordering_key: String,
    created_at: i64,
    attempts: i64,
    last_error: Option<String>,
}

impl TryFrom<OutboxRecord> for OutboxRow {
    type Error = StoreError;

    fn try_from(r: OutboxRecord) -> Result<Self, StoreError> {
        Ok(OutboxRow {
            id: r.id,
            event: NewOutboxRow {
                event_id: r.event_id,
                route: r.route,
                plugin: r.plugin,
                exchange: r.exchange,
                routing_key: r.routing_key,
                headers: headers_from_json(&r.headers)?,
                content_type: r.content_type,
                payload: r.payload,
                ordering_key: r.ordering_key,
            },
            created_at: r.created_at,
            attempts: r.attempts,
            last_error: r.last_error,
            message_type: None,
            refused: None,
        })
    }
}

/// What [`Store::outbox_status`] counts.
#[derive(sqlx::FromRow)]
struct StatusRecord {
    pending: i64,
    /// `created_at` of the oldest unpublished row.
    oldest: Option<i64>,
    with_errors: i64,
    leased: i64,
}

#[cfg(test)]
mod tests {
    use super::id_runs;

    #[test]
    fn marks_go_by_runs_of_consecutive_ids() {
        assert_eq!(id_runs(&[]), []);
        assert_eq!(id_runs(&[7]), [(7, 7)]);
        assert_eq!(
            id_runs(&[12, 10, 11, 3, 5, 4, 11, 20, i64::MAX]),
            [(3, 5), (10, 12), (20, 20), (i64::MAX, i64::MAX)]
        );
    }
}
