//! `commit_batch`: the effects of many deliveries in ONE database transaction (group commit),
//! each delivery inside its own savepoint so one bad or conflicting request does not sink
//! its neighbours. This is where G2 (effects once) is enforced: the inbox row, the kv writes
//! and the outbox rows of a request commit together or not at all.

use std::collections::{BTreeSet, HashMap};

use sqlx::{AnyConnection, AssertSqlSafe};

use super::request::{
    CommitOutcome, CommitRequest, Committed, HandoffLease, InsertedOutbox, MAX_KV_KEYS_PER_COMMIT,
    check, distinct_keys, insert_outbox, last_write_per_key, lock_kv_keys, observed_version,
};
use super::set::SetError;
use crate::store::error::{Class, classify};
use crate::store::{Dialect, OUTBOX_NOTIFY_CHANNEL, Store, StoreError, now_ms};

impl Store {
    /// Commits a batch in one transaction (several when its kv keys add up to more than
    /// [`MAX_KV_KEYS_PER_COMMIT`]; the group committer never sends such a batch whole),
    /// outcomes in request order. `Err` (connection lost, database down, ...) means no
    /// delivery of the batch may be acked: nothing was committed, except after a client-side
    /// timeout (see [`Store::bounded`]) or in an earlier transaction of a split batch, and
    /// the redeliveries of what did commit are then acked as duplicates (G2).
    ///
    /// The fast path is set-based (see `set`): a handful of statements per batch.
    /// When the database refuses something in it or a concurrent instance races it, the
    /// batch is rolled back and committed again request by request, each inside its own
    /// savepoint, so one bad request cannot sink its neighbours.
    pub async fn commit_batch(
        &self,
        batch: &[CommitRequest],
    ) -> Result<Vec<CommitOutcome>, StoreError> {
        let mut outcomes = Vec::with_capacity(batch.len());
        for group in key_groups(batch) {
            outcomes.extend(self.commit_transaction(&batch[group]).await?);
        }
        Ok(outcomes)
    }

    /// One transaction of [`Store::commit_batch`].
    pub(crate) async fn commit_transaction(
        &self,
        batch: &[CommitRequest],
    ) -> Result<Vec<CommitOutcome>, StoreError> {
        Ok(self.commit_handing(batch, None).await?.outcomes)
    }

    /// One transaction of [`Store::commit_batch`]; with `lease`, the outbox rows that can go
    /// straight to the in-process relay are inserted leased to it and returned (see
    /// `handoff`).
    pub(crate) async fn commit_handing(
        &self,
        batch: &[CommitRequest],
        lease: Option<HandoffLease<'_>>,
    ) -> Result<Committed, StoreError> {
        if batch.is_empty() {
            return Ok(Committed::default());
        }
        self.bounded("commit", async {
            match self.commit_set(batch, lease).await {
                Ok(committed) => return Ok(committed),
                Err(SetError::Unavailable(e)) => return Err(e),
                Err(SetError::Fallback(why)) => {
                    tracing::debug!(%why, batch = batch.len(), "set-based commit fell back to one savepoint per request");
                }
            }
            self.commit_each(batch, lease).await
        })
        .await
    }

    /// The fallback: one savepoint per request, applied one after another.
    pub(crate) async fn commit_each(
        &self,
        batch: &[CommitRequest],
        lease: Option<HandoffLease<'_>>,
    ) -> Result<Committed, StoreError> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut unleased = 0;
        let mut handed = HashMap::new();
        for req in batch {
            if let Err(e) = check(req) {
                outcomes.push(CommitOutcome::Rejected(e));
                continue;
            }
            sqlx::query("SAVEPOINT carteiro_request")
                .execute(&mut *tx)
                .await?;
            let outcome = match apply(&mut tx, self.dialect, req, now, lease).await {
                Ok(Applied::Done(rows)) => {
                    unleased += rows.unleased;
                    handed.extend(rows.handed);
                    CommitOutcome::Committed
                }
                Ok(Applied::Stopped(stop)) => stop,
                Err(e) => match classify(&e) {
                    Class::Unavailable => return Err(e.into()),
                    Class::Conflict => CommitOutcome::Conflict,
                    Class::Data => CommitOutcome::Rejected(StoreError::from(e)),
                },
            };
            if outcome != CommitOutcome::Committed {
                // Undo this request only; RELEASE too so savepoints do not pile up.
                sqlx::query("ROLLBACK TO SAVEPOINT carteiro_request")
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query("RELEASE SAVEPOINT carteiro_request")
                .execute(&mut *tx)
                .await?;
            outcomes.push(outcome);
        }
        if let Some(notify) = self
            .dialect
            .notify(OUTBOX_NOTIFY_CHANNEL)
            .filter(|_| unleased > 0)
        {
            // Wakes the relays of other instances at COMMIT (rows leased to this process's
            // relay are none of theirs).
            sqlx::query(AssertSqlSafe(notify)).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Committed {
            outcomes,
            handed,
            unleased,
            at: now,
        })
    }
}

/// Splits `batch` into runs of whole requests whose kv keys add up to at most
/// [`MAX_KV_KEYS_PER_COMMIT`] (a request over it alone makes a run of one, and is
/// rejected there): each run is one transaction.
pub(crate) fn key_groups(batch: &[CommitRequest]) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut start, mut keys) = (0, 0);
    for (i, req) in batch.iter().enumerate() {
        let n = distinct_keys(req);
        if i > start && keys + n > MAX_KV_KEYS_PER_COMMIT {
            groups.push(start..i);
            (start, keys) = (i, 0);
        }
        keys += n;
    }
    if start < batch.len() {
        groups.push(start..batch.len());
    }
    groups
}

/// What [`apply`] did with one request.
enum Applied {
    /// Its effects are written, with these outbox rows.
    Done(InsertedOutbox),
    /// Duplicate or Conflict: nothing of it stays.
    Stopped(CommitOutcome),
}

/// Applies one request inside its savepoint.
async fn apply(
    conn: &mut AnyConnection,
    dialect: &'static dyn Dialect,
    req: &CommitRequest,
    now: i64,
    lease: Option<HandoffLease<'_>>,
) -> Result<Applied, sqlx::Error> {
    let ns = req.namespace.as_str();
    let inserted = sqlx::query(
        "INSERT INTO inbox (route, key, processed_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
    )
    .bind(req.route.as_str())
    .bind(req.inbox_key.as_str())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 0 {
        return Ok(Applied::Stopped(CommitOutcome::Duplicate));
    }

    lock_keys(conn, dialect, req).await?;
    let select_version = format!(
        "SELECT version FROM kv WHERE namespace = $1 AND key = $2 AND value IS NOT NULL{}",
        dialect.for_update()
    );
    for read in &req.reads {
        let current: Option<i64> = sqlx::query_scalar(AssertSqlSafe(select_version.as_str()))
            .bind(ns)
            .bind(read.key.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        if current != read.observed_version {
            return Ok(Applied::Stopped(CommitOutcome::Conflict));
        }
    }

    for write in last_write_per_key(&req.writes) {
        let observed = observed_version(req, &write.key);
        let value = write.value.as_deref();
        // Every statement binds $1 namespace and $2 key, then its value (a write), the time,
        // and the version it expects (when it has one), in that order. `checked`: no row
        // changed means another writer got there first (a conflict).
        let (sql, version, checked) = match (value, observed) {
            // Read as absent: create, or revive a tombstone; a live row (a concurrent
            // creator) makes us lose instead of overwriting it.
            (Some(_), Some(None)) => (
                "INSERT INTO kv (namespace, key, value, version, updated_at) \
                 VALUES ($1, $2, $3, 1, $4) ON CONFLICT (namespace, key) DO UPDATE \
                 SET value = excluded.value, version = kv.version + 1, \
                 updated_at = excluded.updated_at WHERE kv.value IS NULL",
                None,
                true,
            ),
            (Some(_), Some(Some(version))) => (
                "UPDATE kv SET value = $3, version = version + 1, updated_at = $4 \
                 WHERE namespace = $1 AND key = $2 AND version = $5 AND value IS NOT NULL",
                Some(version),
                true,
            ),
            // Blind write: upsert.
            (Some(_), None) => (
                "INSERT INTO kv (namespace, key, value, version, updated_at) \
                 VALUES ($1, $2, $3, 1, $4) ON CONFLICT (namespace, key) DO UPDATE \
                 SET value = excluded.value, version = kv.version + 1, \
                 updated_at = excluded.updated_at",
                None,
                false,
            ),
            // Deletes leave a tombstone with the next version (see the migration).
            (None, Some(Some(version))) => (
                "UPDATE kv SET value = NULL, version = version + 1, updated_at = $3 \
                 WHERE namespace = $1 AND key = $2 AND version = $4 AND value IS NOT NULL",
                Some(version),
                true,
            ),
            // Deleting a key read as absent, or a blind delete: nothing to check.
            (None, _) => (
                "UPDATE kv SET value = NULL, version = version + 1, updated_at = $3 \
                 WHERE namespace = $1 AND key = $2 AND value IS NOT NULL",
                None,
                false,
            ),
        };
        let mut query = sqlx::query(sql).bind(ns).bind(write.key.as_str());
        if let Some(value) = value {
            query = query.bind(value);
        }
        query = query.bind(now);
        if let Some(version) = version {
            query = query.bind(version);
        }
        let changed = query.execute(&mut *conn).await?.rows_affected();
        if checked && changed == 0 {
            return Ok(Applied::Stopped(CommitOutcome::Conflict));
        }
    }

    let rows = insert_outbox(conn, dialect, &[req], now, lease).await?;
    Ok(Applied::Done(rows))
}

/// The lock of each key `req` reads or writes (`lock_kv_keys`), in sorted order.
async fn lock_keys(
    conn: &mut AnyConnection,
    dialect: &dyn Dialect,
    req: &CommitRequest,
) -> Result<(), sqlx::Error> {
    let ns = req.namespace.as_str();
    let keys: BTreeSet<(&str, &str)> = req
        .reads
        .iter()
        .map(|r| (ns, r.key.as_str()))
        .chain(req.writes.iter().map(|w| (ns, w.key.as_str())))
        .collect();
    lock_kv_keys(conn, dialect, keys.into_iter()).await
}
