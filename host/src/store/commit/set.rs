//! The set-based fast path of `commit_batch`: a whole batch in a handful of statements
//! instead of ~10 per request. It reads the inbox keys and kv versions the batch touches
//! (one `IN` query per route / namespace), decides every request's outcome in memory in
//! request order — exactly as the savepoint path would one after another — and then writes
//! the survivors with one multi-row `INSERT` per table.
//!
//! Deciding in memory is sound because the rows cannot move underneath: on SQLite
//! `BEGIN IMMEDIATE` makes this the only writer; on PostgreSQL every kv key is held by an
//! advisory lock (the same ones the savepoint path takes) and its row by `FOR UPDATE`. The
//! inbox needs no lock: a concurrent insert of the same key makes our `INSERT` affect fewer
//! rows than planned, and we fall back.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use sqlx::{AnyConnection, AssertSqlSafe};

use super::request::{
    CommitOutcome, CommitRequest, Committed, HandoffLease, check, insert_outbox,
    last_write_per_key, lock_kv_keys, observed_version,
};
use crate::store::error::{Class, classify};
use crate::store::inbox::present_keys;
use crate::store::sql::{Placeholders, shaped_chunks};
use crate::store::{Dialect, OUTBOX_NOTIFY_CHANNEL, Store, StoreError, now_ms};

/// Why the fast path gave up.
pub(crate) enum SetError {
    /// The database is unreachable: the whole batch fails (nothing committed).
    Unavailable(StoreError),
    /// The database refused something or a concurrent writer raced us: nothing was
    /// committed; commit the batch again one savepoint per request.
    Fallback(String),
}

impl From<sqlx::Error> for SetError {
    fn from(e: sqlx::Error) -> Self {
        match classify(&e) {
            Class::Unavailable => SetError::Unavailable(e.into()),
            Class::Conflict | Class::Data => SetError::Fallback(StoreError::from(e).to_string()),
        }
    }
}

/// A kv row as the batch sees it: a live value or a tombstone, and its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    version: i64,
    live: bool,
}

impl Version {
    fn live_version(state: Option<Version>) -> Option<i64> {
        state.filter(|s| s.live).map(|s| s.version)
    }

    /// The row after one more write (a creation starts at 1).
    fn next(state: Option<Version>, live: bool) -> Version {
        Version {
            version: state.map_or(1, |s| s.version + 1),
            live,
        }
    }
}

/// A kv row's version as [`current_kv`] reads it; `live` is 1 for a value, 0 for a
/// tombstone (an integer alike on both backends).
#[derive(sqlx::FromRow)]
struct KvRecord {
    key: String,
    version: i64,
    live: i64,
}

/// kv rows by namespace, then key.
type KvRows = HashMap<String, HashMap<String, Version>>;

/// A kv write a request would make: the key, its new value (`None`: tombstone), the row after.
struct PlannedWrite<'a> {
    key: &'a str,
    value: Option<&'a [u8]>,
    state: Version,
}

/// One kv row to write: its final value (`None` is a tombstone) and version.
struct KvChange<'a> {
    value: Option<&'a [u8]>,
    version: i64,
}

impl Store {
    pub(crate) async fn commit_set(
        &self,
        batch: &[CommitRequest],
        lease: Option<HandoffLease<'_>>,
    ) -> Result<Committed, SetError> {
        let now = now_ms();
        let rejected: Vec<Option<StoreError>> = batch.iter().map(|r| check(r).err()).collect();
        let valid = || {
            batch
                .iter()
                .zip(&rejected)
                .filter(|(_, why)| why.is_none())
                .map(|(r, _)| r)
        };

        let mut tx = self.begin_write().await.map_err(SetError::Unavailable)?;
        let kv_keys: BTreeSet<(&str, &str)> = valid()
            .flat_map(|r| {
                let ns = r.namespace.as_str();
                r.reads
                    .iter()
                    .map(move |x| (ns, x.key.as_str()))
                    .chain(r.writes.iter().map(move |w| (ns, w.key.as_str())))
            })
            .collect();
        lock_kv_keys(&mut tx, self.dialect, kv_keys.iter().copied()).await?;
        let processed = existing_inbox(&mut tx, self.dialect, valid()).await?;
        let mut kv = current_kv(&mut tx, self.dialect, &kv_keys).await?;

        // Decide, in request order, on the state left by the requests before.
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut claimed: HashSet<(&str, &str)> = HashSet::new();
        let mut committed: Vec<&CommitRequest> = Vec::new();
        let mut changes: BTreeMap<(&str, &str), KvChange> = BTreeMap::new();
        for (req, why) in batch.iter().zip(rejected) {
            if let Some(why) = why {
                outcomes.push(CommitOutcome::Rejected(why));
                continue;
            }
            let inbox = (req.route.as_str(), req.inbox_key.as_str());
            let seen = processed
                .get(inbox.0)
                .is_some_and(|keys| keys.contains(inbox.1));
            if seen || claimed.contains(&inbox) {
                outcomes.push(CommitOutcome::Duplicate);
                continue;
            }
            let Some(writes) = plan(req, &kv) else {
                outcomes.push(CommitOutcome::Conflict);
                continue;
            };
            for PlannedWrite { key, value, state } in writes {
                kv.entry(req.namespace.clone())
                    .or_default()
                    .insert(key.to_owned(), state);
                changes.insert(
                    (req.namespace.as_str(), key),
                    KvChange {
                        value,
                        version: state.version,
                    },
                );
            }
            claimed.insert(inbox);
            committed.push(req);
            outcomes.push(CommitOutcome::Committed);
        }

        insert_inbox(&mut tx, self.dialect, &committed, now).await?;
        upsert_kv(&mut tx, self.dialect, &changes, now).await?;
        let rows = insert_outbox(&mut tx, self.dialect, &committed, now, lease).await?;
        if let Some(notify) = self
            .dialect
            .notify(OUTBOX_NOTIFY_CHANNEL)
            .filter(|_| rows.unleased > 0)
        {
            // Wakes the relays of other instances at COMMIT (rows leased to this process's
            // relay are none of theirs).
            sqlx::query(AssertSqlSafe(notify)).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Committed {
            outcomes,
            handed: rows.handed,
            unleased: rows.unleased,
            at: now,
        })
    }
}

/// The writes of `req` on top of `kv`, or `None` when a version it read has moved (Conflict).
/// Mirrors the per-request SQL of the savepoint path, case by case.
fn plan<'a>(req: &'a CommitRequest, kv: &KvRows) -> Option<Vec<PlannedWrite<'a>>> {
    let state = |key: &str| {
        kv.get(&req.namespace)
            .and_then(|keys| keys.get(key))
            .copied()
    };
    for read in &req.reads {
        if Version::live_version(state(&read.key)) != read.observed_version {
            return None;
        }
    }
    let mut out = Vec::new();
    for write in last_write_per_key(&req.writes) {
        let current = state(&write.key);
        let live = Version::live_version(current);
        let observed = observed_version(req, &write.key);
        let value = write.value.as_deref();
        match (value, observed) {
            // Read as absent: create or revive a tombstone, never overwrite a live row.
            (Some(_), Some(None)) if live.is_some() => return None,
            // Read-modify-write and checked delete: the version read must still be current.
            (_, Some(Some(version))) if live != Some(version) => return None,
            // Deleting what is not there changes nothing.
            (None, _) if live.is_none() => continue,
            _ => {}
        }
        out.push(PlannedWrite {
            key: write.key.as_str(),
            value,
            state: Version::next(current, value.is_some()),
        });
    }
    Some(out)
}

/// The (route, key) pairs of `requests` already in the inbox, by route.
async fn existing_inbox<'a>(
    conn: &mut AnyConnection,
    dialect: &'static dyn Dialect,
    requests: impl Iterator<Item = &'a CommitRequest>,
) -> Result<HashMap<String, HashSet<String>>, sqlx::Error> {
    let mut by_route: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in requests {
        by_route
            .entry(r.route.as_str())
            .or_default()
            .insert(r.inbox_key.as_str());
    }
    let mut found: HashMap<String, HashSet<String>> = HashMap::new();
    for (route, keys) in by_route {
        let keys: Vec<&str> = keys.into_iter().collect();
        let present = present_keys(conn, dialect, route, &keys).await?;
        found.insert(route.to_owned(), present);
    }
    Ok(found)
}

/// The current rows (live or tombstone) of `keys`; PostgreSQL also locks them.
async fn current_kv(
    conn: &mut AnyConnection,
    dialect: &'static dyn Dialect,
    keys: &BTreeSet<(&str, &str)>,
) -> Result<KvRows, sqlx::Error> {
    let mut by_namespace: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (ns, key) in keys {
        by_namespace.entry(ns).or_default().push(key);
    }
    let lock = dialect.for_update();
    let mut rows = KvRows::new();
    for (ns, keys) in by_namespace {
        for chunk in shaped_chunks(&keys) {
            let mut p = Placeholders::new(dialect);
            let sql = format!(
                "SELECT key, version, CAST(CASE WHEN value IS NULL THEN 0 ELSE 1 END AS BIGINT) \
                 AS live FROM kv WHERE namespace = {} AND key IN ({}){lock}",
                p.next(),
                p.list(chunk.len())
            );
            let mut query = sqlx::query_as::<_, KvRecord>(AssertSqlSafe(sql)).bind(ns);
            for key in chunk {
                query = query.bind(*key);
            }
            let entries = rows.entry(ns.to_owned()).or_default();
            for row in query.fetch_all(&mut *conn).await? {
                let version = Version {
                    version: row.version,
                    live: row.live != 0,
                };
                entries.insert(row.key, version);
            }
        }
    }
    Ok(rows)
}

async fn insert_inbox(
    conn: &mut AnyConnection,
    dialect: &'static dyn Dialect,
    committed: &[&CommitRequest],
    now: i64,
) -> Result<(), SetError> {
    for chunk in shaped_chunks(committed) {
        let sql = format!(
            "INSERT INTO inbox (route, key, processed_at) VALUES {} ON CONFLICT DO NOTHING",
            Placeholders::new(dialect).rows(chunk.len(), 3)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for req in chunk {
            query = query
                .bind(req.route.as_str())
                .bind(req.inbox_key.as_str())
                .bind(now);
        }
        let inserted = query.execute(&mut *conn).await?.rows_affected();
        all_changed(
            inserted,
            chunk.len(),
            "inbox keys were committed concurrently by another instance",
        )?;
    }
    Ok(())
}

async fn upsert_kv(
    conn: &mut AnyConnection,
    dialect: &'static dyn Dialect,
    changes: &BTreeMap<(&str, &str), KvChange<'_>>,
    now: i64,
) -> Result<(), SetError> {
    let changes: Vec<_> = changes.iter().collect();
    for chunk in shaped_chunks(&changes) {
        // The version guard is a safety net: the locks already make it always true.
        let sql = format!(
            "INSERT INTO kv (namespace, key, value, version, updated_at) VALUES {} \
             ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, \
             version = excluded.version, updated_at = excluded.updated_at \
             WHERE kv.version < excluded.version",
            Placeholders::new(dialect).rows(chunk.len(), 5)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for ((ns, key), change) in chunk {
            query = query
                .bind(*ns)
                .bind(*key)
                .bind(change.value)
                .bind(change.version)
                .bind(now);
        }
        let written = query.execute(&mut *conn).await?.rows_affected();
        all_changed(written, chunk.len(), "kv rows changed under the batch")?;
    }
    Ok(())
}

/// A statement meant to change `expected` rows changed only `changed`: the rest (`what`
/// says what happened to them) changed under the batch, which falls back to the savepoint
/// path.
fn all_changed(changed: u64, expected: usize, what: &str) -> Result<(), SetError> {
    let expected = expected as u64;
    if changed != expected {
        return Err(SetError::Fallback(format!(
            "{} of {expected} {what}",
            expected - changed
        )));
    }
    Ok(())
}
