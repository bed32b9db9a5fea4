//! `commit_batch`: the effects of many deliveries in ONE database transaction (group commit),
//! each delivery inside its own savepoint so one bad or conflicting request does not sink
//! its neighbours. This is where G2 (effects once) is enforced: the inbox row, the kv writes
//! and the outbox rows of a request commit together or not at all.

use std::collections::BTreeSet;

use sqlx::{AnyConnection, AssertSqlSafe};

use super::commit_set::{SetError, insert_outbox};
use super::error::{Class, classify};
use super::{Backend, Store, StoreError, now_ms, validate};

/// One kv key the handler read, and the version it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvRead {
    /// The key inside the request's namespace.
    pub key: String,
    /// The version seen; `None` means the key was absent.
    pub observed_version: Option<i64>,
}

/// One kv change the handler made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvWrite {
    /// The key inside the request's namespace.
    pub key: String,
    /// The new value; `None` deletes the key.
    pub value: Option<Vec<u8>>,
}

/// An event to publish after commit (the relay sends it with `event_id` as `message_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOutboxRow {
    /// UUIDv7 made once by the host when the handler emitted; never recomputed.
    pub event_id: uuid::Uuid,
    /// The route whose delivery emitted the event.
    pub route: String,
    /// The plugin that emitted it.
    pub plugin: String,
    /// Target exchange ("" is the default exchange).
    pub exchange: String,
    /// Routing key, stored verbatim.
    pub routing_key: String,
    /// AMQP headers, in order.
    pub headers: Vec<(String, String)>,
    /// AMQP content type.
    pub content_type: Option<String>,
    /// The message body, verbatim.
    pub payload: Vec<u8>,
    /// Events with the same ordering key are published in id order.
    pub ordering_key: String,
}

/// Everything one acked delivery wants to make durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRequest {
    /// The route the delivery came from.
    pub route: String,
    /// Its idempotency key; recorded in `inbox` with the effects.
    pub inbox_key: String,
    /// The plugin's kv namespace.
    pub namespace: String,
    /// Keys read, checked at commit (optimistic concurrency).
    pub reads: Vec<KvRead>,
    /// Keys written or deleted.
    pub writes: Vec<KvWrite>,
    /// Events to publish.
    pub outbox: Vec<NewOutboxRow>,
}

/// What happened to one request of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Effects committed.
    Committed,
    /// `inbox` already had (route, key): nothing applied; ack the delivery.
    Duplicate,
    /// A kv key read has changed since: nothing applied; re-run the handler.
    Conflict,
    /// This request's data cannot be stored (the message says which field); nothing applied.
    Rejected(String),
}

impl Store {
    /// Commits a batch in one transaction (several when its kv keys add up to more than
    /// [`MAX_KV_KEYS_PER_COMMIT`]; the group committer never sends such a batch whole),
    /// outcomes in request order. `Err` (connection lost, database down, ...) means no
    /// delivery of the batch may be acked: nothing was committed, except after a client-side
    /// timeout (see [`Store::bounded`]) or in an earlier transaction of a split batch, and
    /// the redeliveries of what did commit are then acked as duplicates (G2).
    ///
    /// The fast path is set-based (see `commit_set`): a handful of statements per batch.
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
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        self.bounded("commit", async {
            match self.commit_set(batch).await {
                Ok(outcomes) => return Ok(outcomes),
                Err(SetError::Unavailable(e)) => return Err(e),
                Err(SetError::Fallback(why)) => {
                    tracing::debug!(%why, batch = batch.len(), "set-based commit fell back to one savepoint per request");
                }
            }
            self.commit_each(batch).await
        })
        .await
    }

    /// The fallback: one savepoint per request, applied one after another.
    pub(crate) async fn commit_each(
        &self,
        batch: &[CommitRequest],
    ) -> Result<Vec<CommitOutcome>, StoreError> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut published_rows = false;
        for req in batch {
            if let Err(e) = check(req) {
                outcomes.push(CommitOutcome::Rejected(e.to_string()));
                continue;
            }
            sqlx::query("SAVEPOINT carteiro_request")
                .execute(&mut *tx)
                .await?;
            let outcome = match apply(&mut tx, self.backend, req, now).await {
                Ok(None) => CommitOutcome::Committed,
                Ok(Some(stop)) => stop,
                Err(e) => match classify(&e) {
                    Class::Unavailable => return Err(e.into()),
                    Class::Conflict => CommitOutcome::Conflict,
                    Class::Data => CommitOutcome::Rejected(StoreError::from(e).to_string()),
                },
            };
            if outcome != CommitOutcome::Committed {
                // Undo this request only; RELEASE too so savepoints do not pile up.
                sqlx::query("ROLLBACK TO SAVEPOINT carteiro_request")
                    .execute(&mut *tx)
                    .await?;
            } else {
                published_rows |= !req.outbox.is_empty();
            }
            sqlx::query("RELEASE SAVEPOINT carteiro_request")
                .execute(&mut *tx)
                .await?;
            outcomes.push(outcome);
        }
        if published_rows && self.backend == Backend::Postgres {
            // Delivered at COMMIT to relays of other instances listening on the channel.
            sqlx::query("NOTIFY carteiro_outbox")
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(outcomes)
    }
}

/// Most distinct kv keys one transaction locks, and so one delivery may touch. PostgreSQL
/// holds every advisory lock of a transaction in its shared lock table, sized
/// `max_locks_per_transaction` (64) × `max_connections` (100) = 6,400 locks for the whole
/// server by default; a transaction past it fails with "out of shared memory" (53200), which
/// is the store's trouble, so a delivery over it would be requeued for ever. Batches over
/// this are committed as several transactions (see [`key_groups`]); a single delivery over
/// it is `Rejected` (dead-lettered with this reason), on both backends alike.
pub const MAX_KV_KEYS_PER_COMMIT: usize = 2_048;

/// Distinct kv keys `req` reads or writes.
pub(super) fn distinct_keys(req: &CommitRequest) -> usize {
    req.reads
        .iter()
        .map(|r| r.key.as_str())
        .chain(req.writes.iter().map(|w| w.key.as_str()))
        .collect::<BTreeSet<_>>()
        .len()
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

/// Text and size checks before touching the database (same rules on both backends).
pub(super) fn check(req: &CommitRequest) -> Result<(), StoreError> {
    let keys = distinct_keys(req);
    if keys > MAX_KV_KEYS_PER_COMMIT {
        return Err(StoreError::Invalid(format!(
            "the delivery touches {keys} distinct kv keys; one delivery may read or write at \
             most {MAX_KV_KEYS_PER_COMMIT}"
        )));
    }
    validate::text("route", &req.route)?;
    validate::text("inbox_key", &req.inbox_key)?;
    validate::text("namespace", &req.namespace)?;
    for (i, r) in req.reads.iter().enumerate() {
        validate::text(&format!("reads[{i}].key"), &r.key)?;
    }
    for (i, w) in req.writes.iter().enumerate() {
        validate::text(&format!("writes[{i}].key"), &w.key)?;
    }
    for (i, o) in req.outbox.iter().enumerate() {
        validate::text(&format!("outbox[{i}].route"), &o.route)?;
        validate::text(&format!("outbox[{i}].plugin"), &o.plugin)?;
        validate::text(&format!("outbox[{i}].exchange"), &o.exchange)?;
        validate::text(&format!("outbox[{i}].routing_key"), &o.routing_key)?;
        validate::text(&format!("outbox[{i}].ordering_key"), &o.ordering_key)?;
        if let Some(ct) = &o.content_type {
            validate::text(&format!("outbox[{i}].content_type"), ct)?;
        }
    }
    Ok(())
}

/// Applies one request inside its savepoint. `Ok(Some(_))` stops it (Duplicate/Conflict).
async fn apply(
    conn: &mut AnyConnection,
    backend: Backend,
    req: &CommitRequest,
    now: i64,
) -> Result<Option<CommitOutcome>, sqlx::Error> {
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
        return Ok(Some(CommitOutcome::Duplicate));
    }

    if backend == Backend::Postgres {
        lock_keys(conn, req).await?;
    }
    // SQLite needs no row locks: BEGIN IMMEDIATE already made this the only writer.
    let select_version = match backend {
        Backend::Postgres => {
            "SELECT version FROM kv WHERE namespace = $1 AND key = $2 AND value IS NOT NULL \
             FOR UPDATE"
        }
        Backend::Sqlite => {
            "SELECT version FROM kv WHERE namespace = $1 AND key = $2 AND value IS NOT NULL"
        }
    };
    for read in &req.reads {
        let current: Option<i64> = sqlx::query_scalar(select_version)
            .bind(ns)
            .bind(read.key.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        if current != read.observed_version {
            return Ok(Some(CommitOutcome::Conflict));
        }
    }

    for write in last_write_per_key(&req.writes) {
        let observed = observed_version(req, &write.key);
        let key = write.key.as_str();
        let changed = match (&write.value, observed) {
            // Read as absent: create, or revive a tombstone; a live row (a concurrent
            // creator) makes us lose instead of overwriting it.
            (Some(value), Some(None)) => sqlx::query(
                "INSERT INTO kv (namespace, key, value, version, updated_at) \
                 VALUES ($1, $2, $3, 1, $4) ON CONFLICT (namespace, key) DO UPDATE \
                 SET value = excluded.value, version = kv.version + 1, \
                 updated_at = excluded.updated_at WHERE kv.value IS NULL",
            )
            .bind(ns)
            .bind(key)
            .bind(value.as_slice())
            .bind(now)
            .execute(&mut *conn)
            .await?
            .rows_affected(),
            (Some(value), Some(Some(version))) => sqlx::query(
                "UPDATE kv SET value = $3, version = version + 1, updated_at = $4 \
                 WHERE namespace = $1 AND key = $2 AND version = $5 AND value IS NOT NULL",
            )
            .bind(ns)
            .bind(key)
            .bind(value.as_slice())
            .bind(now)
            .bind(version)
            .execute(&mut *conn)
            .await?
            .rows_affected(),
            // Blind write: upsert.
            (Some(value), None) => sqlx::query(
                "INSERT INTO kv (namespace, key, value, version, updated_at) \
                 VALUES ($1, $2, $3, 1, $4) ON CONFLICT (namespace, key) DO UPDATE \
                 SET value = excluded.value, version = kv.version + 1, \
                 updated_at = excluded.updated_at",
            )
            .bind(ns)
            .bind(key)
            .bind(value.as_slice())
            .bind(now)
            .execute(&mut *conn)
            .await?
            .rows_affected()
            .max(1),
            // Deletes leave a tombstone with the next version (see the migration).
            (None, Some(Some(version))) => sqlx::query(
                "UPDATE kv SET value = NULL, version = version + 1, updated_at = $3 \
                 WHERE namespace = $1 AND key = $2 AND version = $4 AND value IS NOT NULL",
            )
            .bind(ns)
            .bind(key)
            .bind(now)
            .bind(version)
            .execute(&mut *conn)
            .await?
            .rows_affected(),
            // Deleting a key read as absent, or a blind delete: nothing to check.
            (None, _) => {
                sqlx::query(
                    "UPDATE kv SET value = NULL, version = version + 1, updated_at = $3 \
                     WHERE namespace = $1 AND key = $2 AND value IS NOT NULL",
                )
                .bind(ns)
                .bind(key)
                .bind(now)
                .execute(&mut *conn)
                .await?;
                1
            }
        };
        if changed == 0 {
            return Ok(Some(CommitOutcome::Conflict));
        }
    }

    insert_outbox(conn, backend, &[req], now).await?;
    Ok(None)
}

/// PostgreSQL: an exclusive transaction-scoped advisory lock per key read or written, in
/// sorted order. Row locks alone cannot cover a key read as *absent* (there is no row to
/// lock), which would allow write skew; these locks make every kv access of a committing
/// request two-phase, hence serializable per key. A deadlock between instances surfaces as
/// SQLSTATE 40P01, which the caller maps to Conflict.
async fn lock_keys(conn: &mut AnyConnection, req: &CommitRequest) -> Result<(), sqlx::Error> {
    let ns = req.namespace.as_str();
    let keys: BTreeSet<(&str, &str)> = req
        .reads
        .iter()
        .map(|r| (ns, r.key.as_str()))
        .chain(req.writes.iter().map(|w| (ns, w.key.as_str())))
        .collect();
    lock_kv_keys(conn, keys.into_iter()).await
}

/// Keys locked per statement: PostgreSQL binds at most 65,535 parameters in one statement
/// (sqlx refuses more before sending), and a batch's keys are unbounded.
const LOCK_CHUNK: usize = 16_384;

/// Takes the advisory lock of each (namespace, key), in the order given (callers sort, so
/// two transactions never wait for each other in a cycle), [`LOCK_CHUNK`] keys per
/// statement: chunks run in order, so the locking order stays the sorted order.
pub(super) async fn lock_kv_keys<'a>(
    conn: &mut AnyConnection,
    keys: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<(), sqlx::Error> {
    let keys: Vec<String> = keys
        // U+001F between namespace and key; a collision only costs extra waiting.
        .map(|(namespace, key)| format!("kv\u{1f}{namespace}\u{1f}{key}"))
        .collect();
    for chunk in keys.chunks(LOCK_CHUNK) {
        let values: Vec<String> = (1..=chunk.len()).map(|i| format!("(${i})")).collect();
        let sql = format!(
            "SELECT COUNT(pg_advisory_xact_lock(hashtextextended(k, 0))) FROM (VALUES {}) AS t(k)",
            values.join(", ")
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for key in chunk {
            query = query.bind(key.as_str());
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// The version `req` read of `key`, if it read it (`Some(None)`: read as absent).
pub(super) fn observed_version(req: &CommitRequest, key: &str) -> Option<Option<i64>> {
    req.reads
        .iter()
        .find(|r| r.key == key)
        .map(|r| r.observed_version)
}

/// Several writes to one key in a request: only the last counts (keeps the version checks
/// of the read-modify-write paths meaningful).
pub(super) fn last_write_per_key(writes: &[KvWrite]) -> Vec<&KvWrite> {
    writes
        .iter()
        .enumerate()
        .filter(|(i, w)| !writes[i + 1..].iter().any(|later| later.key == w.key))
        .map(|(_, w)| w)
        .collect()
}
