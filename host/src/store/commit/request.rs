//! What one delivery makes durable ([`CommitRequest`]) and what both commit paths do with it
//! alike: the checks before touching the database, the advisory locks on its kv keys and the
//! insert of its outbox rows. It sits below `savepoints` (the savepoint path) and `set`
//! (the set-based fast path) so that neither has to import the other for these.

use std::collections::{BTreeSet, HashMap, HashSet};

use sqlx::{AnyConnection, AssertSqlSafe};

use crate::store::sql::{Placeholders, shaped_chunks};
use crate::store::{Dialect, StoreError, headers_to_json, nul_free};

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
    /// The AMQP `message_id`: a UUIDv7 the host made once when the handler emitted (never
    /// recomputed), or an application outbox's own event id.
    pub event_id: String,
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
    /// This request's data cannot be stored (the error says which field); nothing applied.
    Rejected(StoreError),
}

/// Most distinct kv keys one transaction locks, and so one delivery may touch. PostgreSQL
/// holds every advisory lock of a transaction in its shared lock table, sized
/// `max_locks_per_transaction` (64) × `max_connections` (100) = 6,400 locks for the whole
/// server by default; a transaction past it fails with "out of shared memory" (53200), which
/// is the store's trouble, so a delivery over it would be requeued for ever. Batches over
/// this are committed as several transactions (see `savepoints::key_groups`); a single delivery over
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

/// Text and size checks before touching the database (same rules on both backends).
pub(super) fn check(req: &CommitRequest) -> Result<(), StoreError> {
    let keys = distinct_keys(req);
    if keys > MAX_KV_KEYS_PER_COMMIT {
        return Err(StoreError::Invalid(format!(
            "the delivery touches {keys} distinct kv keys; one delivery may read or write at \
             most {MAX_KV_KEYS_PER_COMMIT}"
        )));
    }
    nul_free::text("route", &req.route)?;
    nul_free::text("inbox_key", &req.inbox_key)?;
    nul_free::text("namespace", &req.namespace)?;
    for (i, r) in req.reads.iter().enumerate() {
        nul_free::text(&format!("reads[{i}].key"), &r.key)?;
    }
    for (i, w) in req.writes.iter().enumerate() {
        nul_free::text(&format!("writes[{i}].key"), &w.key)?;
    }
    for (i, o) in req.outbox.iter().enumerate() {
        nul_free::text(&format!("outbox[{i}].route"), &o.route)?;
        nul_free::text(&format!("outbox[{i}].plugin"), &o.plugin)?;
        nul_free::text(&format!("outbox[{i}].exchange"), &o.exchange)?;
        nul_free::text(&format!("outbox[{i}].routing_key"), &o.routing_key)?;
        nul_free::text(&format!("outbox[{i}].ordering_key"), &o.ordering_key)?;
        if let Some(ct) = &o.content_type {
            nul_free::text(&format!("outbox[{i}].content_type"), ct)?;
        }
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

/// Keys locked per statement: PostgreSQL binds at most 65,535 parameters in one statement
/// (sqlx refuses more before sending), and a batch's keys are unbounded.
const LOCK_CHUNK: usize = 16_384;

/// Takes the lock of each (namespace, key) where the dialect has named locks (PostgreSQL's
/// advisory locks; on SQLite the write transaction already excludes every other writer), in
/// the order given (callers sort, so two transactions never wait for each other in a
/// cycle), [`LOCK_CHUNK`] keys per statement: chunks run in order, so the locking order
/// stays the sorted order.
///
/// Row locks alone cannot cover a key read as *absent* (there is no row to lock), which
/// would allow write skew; these locks make every kv access of a committing request
/// two-phase, hence serializable per key. A deadlock between instances surfaces as a
/// conflict (SQLSTATE 40P01).
pub(super) async fn lock_kv_keys<'a>(
    conn: &mut AnyConnection,
    dialect: &dyn Dialect,
    keys: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<(), sqlx::Error> {
    let keys: Vec<(&str, &str)> = keys.collect();
    for chunk in keys.chunks(LOCK_CHUNK) {
        let Some(sql) = dialect.lock_names(chunk.len()) else {
            return Ok(());
        };
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (namespace, key) in chunk {
            // U+001F between namespace and key; a collision only costs extra waiting.
            query = query.bind(format!("kv\u{1f}{namespace}\u{1f}{key}"));
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Inserts the outbox rows of `committed` in request order (ids follow commit order, which
/// the relay's per-key ordering relies on). Returns how many.
pub(super) async fn insert_outbox(
    conn: &mut AnyConnection,
    dialect: &'static dyn Dialect,
    committed: &[&CommitRequest],
    now: i64,
    lease: Option<HandoffLease<'_>>,
) -> Result<InsertedOutbox, sqlx::Error> {
    let rows: Vec<&NewOutboxRow> = committed.iter().flat_map(|r| r.outbox.iter()).collect();
    let Some(lease) = lease else {
        insert_rows(conn, dialect, &rows, now, None).await?;
        return Ok(InsertedOutbox {
            unleased: rows.len(),
            handed: HashMap::new(),
        });
    };
    let held = held_keys(conn, dialect, &rows).await?;
    let (to_hand, to_table): (Vec<&NewOutboxRow>, Vec<&NewOutboxRow>) = rows
        .into_iter()
        .partition(|r| r.ordering_key.is_empty() || !held.contains(r.ordering_key.as_str()));
    insert_rows(conn, dialect, &to_table, now, None).await?;
    let handed = insert_rows(conn, dialect, &to_hand, now, Some(lease)).await?;
    Ok(InsertedOutbox {
        unleased: to_table.len(),
        handed,
    })
}

/// Whom a commit leases the rows it hands to the in-process relay, and for how long
/// (immediate dispatch, see `handoff`).
#[derive(Clone, Copy)]
pub(crate) struct HandoffLease<'a> {
    pub owner: &'a str,
    pub lease_ms: i64,
}

/// What one transaction of a batch committed.
#[derive(Debug, Default)]
pub(crate) struct Committed {
    /// One per request, in order.
    pub outcomes: Vec<CommitOutcome>,
    /// The ids of the outbox rows leased to the in-process relay, by event id: the rows
    /// themselves are moved out of the requests once committed, never copied.
    pub handed: HashMap<String, i64>,
    /// Outbox rows left in the table for a relay to claim.
    pub unleased: usize,
    /// When it committed (unix ms, the rows' `created_at`).
    pub at: i64,
}

/// What [`insert_outbox`] inserted.
pub(super) struct InsertedOutbox {
    /// Rows left in the table for a relay to claim.
    pub unleased: usize,
    /// The ids of the rows leased to the in-process relay session, by event id.
    pub handed: HashMap<String, i64>,
}

/// Inserts `rows`; with `lease`, leased to its owner by the database's clock, returning
/// each row's id by event id.
async fn insert_rows(
    conn: &mut AnyConnection,
    dialect: &'static dyn Dialect,
    rows: &[&NewOutboxRow],
    now: i64,
    lease: Option<HandoffLease<'_>>,
) -> Result<HashMap<String, i64>, sqlx::Error> {
    const WIDTH: usize = 11;
    let mut ids = HashMap::new();
    for chunk in shaped_chunks(rows) {
        let mut p = Placeholders::new(dialect);
        let sql = match lease {
            None => format!(
                "INSERT INTO outbox (event_id, route, plugin, exchange, routing_key, headers, \
                 content_type, payload, ordering_key, created_at, next_attempt_at) VALUES {}",
                p.rows(chunk.len(), WIDTH)
            ),
            Some(_) => {
                let clock = dialect.clock_ms();
                let values: Vec<String> = (0..chunk.len())
                    .map(|_| format!("({}, {clock} + {})", p.list(WIDTH + 1), p.next()))
                    .collect();
                format!(
                    "INSERT INTO outbox (event_id, route, plugin, exchange, routing_key, headers, \
                     content_type, payload, ordering_key, created_at, next_attempt_at, \
                     lease_owner, lease_until) VALUES {} RETURNING id, event_id",
                    values.join(", ")
                )
            }
        };
        let mut query = sqlx::query_as::<_, (i64, String)>(AssertSqlSafe(sql));
        for row in chunk {
            query = query
                .bind(row.event_id.as_str())
                .bind(row.route.as_str())
                .bind(row.plugin.as_str())
                .bind(row.exchange.as_str())
                .bind(row.routing_key.as_str())
                .bind(headers_to_json(&row.headers))
                .bind(row.content_type.as_deref())
                .bind(row.payload.as_slice())
                .bind(row.ordering_key.as_str())
                .bind(now)
                // Publishable at once: backoffs are timed by the database's clock, which the
                // committer's wall clock may be ahead of.
                .bind(0_i64);
            if let Some(lease) = lease {
                query = query.bind(lease.owner).bind(lease.lease_ms);
            }
        }
        match lease {
            None => {
                query.fetch_all(&mut *conn).await?;
            }
            Some(_) => {
                for (id, event_id) in query.fetch_all(&mut *conn).await? {
                    ids.insert(event_id, id);
                }
            }
        }
    }
    Ok(ids)
}

/// The ordering keys of `rows` that already have an unpublished row in the table (leased,
/// waiting, in backoff or parked): rows of those keys must queue behind it, in the table.
async fn held_keys(
    conn: &mut AnyConnection,
    dialect: &'static dyn Dialect,
    rows: &[&NewOutboxRow],
) -> Result<HashSet<String>, sqlx::Error> {
    let keys: Vec<&str> = rows
        .iter()
        .map(|r| r.ordering_key.as_str())
        .filter(|k| !k.is_empty())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut held = HashSet::new();
    for chunk in shaped_chunks(&keys) {
        let mut p = Placeholders::new(dialect);
        let sql = format!(
            "SELECT DISTINCT ordering_key FROM outbox \
             WHERE published_at IS NULL AND ordering_key IN ({})",
            p.list(chunk.len())
        );
        let mut query = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql));
        for key in chunk {
            query = query.bind(*key);
        }
        held.extend(query.fetch_all(&mut *conn).await?);
    }
    Ok(held)
}
