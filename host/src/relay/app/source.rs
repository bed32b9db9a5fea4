//! An application's outbox table as a relay [`Source`]: rows are read from the
//! application's database through its dialect, in id order; the bookkeeping a table of
//! Carteiro's keeps in its own columns (leases, attempts, errors, parked rows) is kept
//! here instead: leases in memory (one relay leads an outbox at a time, `leader`),
//! failures in Carteiro's store. The application's table is only read, and marked (or
//! deleted from) once each row's own confirm arrived.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgwire_replication::ReplicationConfig;

use super::config::{AppOutboxConfig, quoted};
use super::leader::Leader;
use super::row::{AppRecord, Reading};
use super::statements::Statements;
use crate::metrics::{AppOutboxObserved, Metrics};
use crate::relay::cdc::{DecodeError, Relation, ReplicationUrlError, replication_config};
use crate::relay::source::{Failed, SlotSource, Source};
use crate::store::{CommitWakeups, OutboxRow, Store, StoreError, Wait};

/// A row this process holds: who leased it, its ordering key and event id.
#[derive(Debug, Clone)]
struct Held {
    owner: String,
    key: String,
    event_id: String,
}

/// An application's outbox table (cheap to clone).
#[derive(Clone)]
pub struct AppSource {
    inner: Arc<Inner>,
}

struct Inner {
    config: AppOutboxConfig,
    /// The application's database.
    app: Store,
    /// Carteiro's store: failures and the leader lease.
    store: Store,
    sql: Statements,
    reading: Reading,
    leader: Leader,
    metrics: Arc<Metrics>,
    held: Mutex<HashMap<i64, Held>>,
    /// Rows with a failure on record in the store (forgotten once published).
    failed: Mutex<HashSet<i64>>,
}

/// How often `retain_published` deletes.
const PURGE_EVERY: Duration = Duration::from_secs(60);

fn json_ids(ids: &[i64]) -> String {
    serde_json::to_string(ids).unwrap_or_else(|_| "[]".into())
}

impl AppSource {
    pub fn new(
        config: AppOutboxConfig,
        app: Store,
        store: Store,
        sql: Statements,
        reading: Reading,
        leader: Leader,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                app,
                store,
                sql,
                reading,
                leader,
                metrics,
                held: Mutex::default(),
                failed: Mutex::default(),
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// Loads the failures on record, so that a row published later is forgotten.
    pub async fn load_failures(&self) -> Result<(), StoreError> {
        let all = self
            .inner
            .store
            .app_outbox_failures(self.name(), false)
            .await?;
        if let Ok(mut failed) = self.inner.failed.lock() {
            failed.extend(all.iter().map(|f| f.row_id));
        }
        Ok(())
    }

    /// What the table holds now, for the metrics.
    pub async fn observe(&self) -> Result<AppOutboxObserved, StoreError> {
        let app = &self.inner.app;
        let (pending, oldest_ms): (i64, Option<i64>) = app
            .bounded("application outbox status", async {
                Ok(
                    sqlx::query_as(sqlx::AssertSqlSafe(self.inner.sql.status.clone()))
                        .fetch_one(app.pool())
                        .await?,
                )
            })
            .await?;
        let failures = self
            .inner
            .store
            .app_outbox_failures(self.name(), false)
            .await?;
        let parked = failures.iter().filter(|f| f.parked()).count();
        Ok(AppOutboxObserved {
            pending,
            oldest_pending_seconds: oldest_ms.unwrap_or(0).max(0) as f64 / 1000.0,
            failing: i64::try_from(failures.len() - parked).unwrap_or(0),
            parked: i64::try_from(parked).unwrap_or(0),
        })
    }

    /// `retain_published`, where set.
    pub fn retain_published(&self) -> Option<Duration> {
        self.inner.config.retain_published
    }

    /// Deletes rows published longer than `retain` ago, a bounded batch per statement,
    /// every [`PURGE_EVERY`], until `stop`.
    pub async fn purge_published(
        self,
        retain: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let Some(purge) = self.inner.sql.purge.clone() else {
            return;
        };
        let retain_ms = i64::try_from(retain.as_millis()).unwrap_or(i64::MAX);
        let app = &self.inner.app;
        loop {
            loop {
                let deleted = app
                    .bounded("application outbox purge", async {
                        let statement =
                            sqlx::query(sqlx::AssertSqlSafe(purge.clone())).bind(retain_ms);
                        Ok(statement.execute(app.pool()).await?.rows_affected())
                    })
                    .await;
                match deleted {
                    Ok(n) if n >= super::statements::PURGE_BATCH => continue,
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(outbox = %self.name(), error = %e, "cannot purge published rows; trying again later");
                        break;
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(PURGE_EVERY) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Held>> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn ids(&self, sql: &str, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let app = &self.inner.app;
        app.bounded("application outbox ids", async {
            let mut out: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
                .bind(json_ids(ids))
                .fetch_all(app.pool())
                .await?;
            out.sort_unstable();
            Ok(out)
        })
        .await
    }

    /// The event id and ordering key of row `id` (a row read from the slot that failed).
    async fn identity(&self, id: i64) -> Result<(String, String), StoreError> {
        let app = &self.inner.app;
        let found: Option<(Option<String>, Option<String>)> = app
            .bounded("application outbox row", async {
                Ok(
                    sqlx::query_as(sqlx::AssertSqlSafe(self.inner.sql.identity.clone()))
                        .bind(id)
                        .fetch_optional(app.pool())
                        .await?,
                )
            })
            .await?;
        let (event_id, key) = found.unwrap_or_default();
        Ok((event_id.unwrap_or_default(), key.unwrap_or_default()))
    }
}

impl Source for AppSource {
    async fn claim(
        &self,
        limit: usize,
        max_bytes: u64,
        owner: &str,
        _lease: Duration,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        if !self.inner.leader.holds() {
            return Ok(Vec::new());
        }
        let waiting = self
            .inner
            .store
            .app_outbox_failures(self.name(), true)
            .await?;
        let (mut skip, mut held_keys): (Vec<i64>, Vec<String>) = {
            let held = self.held();
            let skip = held.keys().copied().collect();
            let keys = held
                .values()
                .filter(|h| h.owner != owner && !h.key.is_empty())
                .map(|h| h.key.clone())
                .collect();
            (skip, keys)
        };
        skip.extend(waiting.iter().map(|f| f.row_id));
        held_keys.extend(
            waiting
                .iter()
                .filter(|f| !f.ordering_key.is_empty())
                .map(|f| f.ordering_key.clone()),
        );
        let app = &self.inner.app;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let records: Vec<AppRecord> = app
            .bounded("application outbox claim", async {
                Ok(
                    sqlx::query_as(sqlx::AssertSqlSafe(self.inner.sql.claim.clone()))
                        .bind(json_ids(&skip))
                        .bind(serde_json::to_string(&held_keys).unwrap_or_else(|_| "[]".into()))
                        .bind(limit)
                        .fetch_all(app.pool())
                        .await?,
                )
            })
            .await?;
        let mut rows = Vec::with_capacity(records.len());
        let mut bytes = 0u64;
        for record in records {
            let row = self.inner.reading.row(record);
            bytes += row.event.payload.len() as u64;
            if !rows.is_empty() && bytes > max_bytes {
                break;
            }
            rows.push(row);
        }
        let mut held = self.held();
        for row in &rows {
            held.insert(
                row.id,
                Held {
                    owner: owner.to_owned(),
                    key: row.event.ordering_key.clone(),
                    event_id: row.event.event_id.clone(),
                },
            );
        }
        Ok(rows)
    }

    async fn release_rows(&self, owner: &str, ids: &[i64]) -> Result<u64, StoreError> {
        let mut held = self.held();
        let mut released = 0;
        for id in ids {
            if held.get(id).is_some_and(|h| h.owner == owner) {
                held.remove(id);
                released += 1;
            }
        }
        Ok(released)
    }

    async fn release(&self, owner: &str) -> Result<u64, StoreError> {
        let mut held = self.held();
        let before = held.len();
        held.retain(|_, h| h.owner != owner);
        Ok((before - held.len()) as u64)
    }

    async fn mark_published(&self, ids: &[i64]) -> Result<u64, StoreError> {
        let app = &self.inner.app;
        let settle = self.inner.sql.settle.clone();
        let list = json_ids(ids);
        let changed = app
            .bounded("application outbox mark", async {
                let statement = sqlx::query(sqlx::AssertSqlSafe(settle)).bind(list);
                Ok(statement.execute(app.pool()).await?.rows_affected())
            })
            .await?;
        self.inner
            .metrics
            .app_outbox_published(self.name(), changed);
        {
            let mut held = self.held();
            for id in ids {
                held.remove(id);
            }
        }
        let forget: Vec<i64> = match self.inner.failed.lock() {
            Ok(mut failed) => ids.iter().copied().filter(|id| failed.remove(id)).collect(),
            Err(_) => Vec::new(),
        };
        if !forget.is_empty() {
            self.inner
                .store
                .app_outbox_forget(self.name(), &forget)
                .await?;
        }
        Ok(changed)
    }

    async fn existing_among(&self, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
        self.ids(&self.inner.sql.existing, ids).await
    }

    async fn unpublished_among(&self, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
        let open = self.ids(&self.inner.sql.unpublished, ids).await?;
        let parked: HashSet<i64> = self
            .inner
            .store
            .app_outbox_failures(self.name(), true)
            .await?
            .iter()
            .filter(|f| f.parked())
            .map(|f| f.row_id)
            .collect();
        Ok(open.into_iter().filter(|id| !parked.contains(id)).collect())
    }

    async fn record_failure(
        &self,
        id: i64,
        lease: Option<&str>,
        failed: Failed<'_>,
    ) -> Result<bool, StoreError> {
        let (event_id, key) = match lease {
            Some(owner) => {
                let held = self.held().get(&id).cloned();
                match held {
                    Some(h) if h.owner == owner && self.inner.leader.holds() => (h.event_id, h.key),
                    _ => return Ok(false),
                }
            }
            None => self.identity(id).await?,
        };
        let (error, wait) = match failed {
            Failed::Retry { error, retry_after } => (
                error,
                Wait::Retry(i64::try_from(retry_after.as_millis()).unwrap_or(i64::MAX)),
            ),
            Failed::Park { error } => (error, Wait::Park),
        };
        self.inner
            .store
            .app_outbox_record_failure(self.name(), (id, &event_id, &key), error, wait)
            .await?;
        if let Ok(mut failed) = self.inner.failed.lock() {
            failed.insert(id);
        }
        if lease.is_some() {
            self.held().remove(&id);
        }
        Ok(true)
    }

    async fn parked_keys(&self) -> Result<Vec<String>, StoreError> {
        let failures = self
            .inner
            .store
            .app_outbox_failures(self.name(), true)
            .await?;
        let mut keys: Vec<String> = failures
            .into_iter()
            .filter(|f| f.parked() && !f.ordering_key.is_empty())
            .map(|f| f.ordering_key)
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    async fn last_id(&self) -> Result<i64, StoreError> {
        let app = &self.inner.app;
        app.bounded("application outbox last id", async {
            let max: Option<i64> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(self.inner.sql.last_id.clone()))
                    .fetch_one(app.pool())
                    .await?;
            Ok(max.unwrap_or(0))
        })
        .await
    }

    async fn pending_up_to(&self, id: i64) -> Result<i64, StoreError> {
        let app = &self.inner.app;
        let pending: i64 = app
            .bounded("application outbox pending", async {
                Ok(
                    sqlx::query_scalar(sqlx::AssertSqlSafe(self.inner.sql.pending_up_to.clone()))
                        .bind(id)
                        .fetch_one(app.pool())
                        .await?,
                )
            })
            .await?;
        let parked = self
            .inner
            .store
            .app_outbox_failures(self.name(), true)
            .await?
            .iter()
            .filter(|f| f.parked() && f.row_id <= id)
            .count();
        Ok(pending.saturating_sub(i64::try_from(parked).unwrap_or(0)))
    }

    fn wakeups(&self) -> CommitWakeups {
        self.inner
            .app
            .wakeups_on(&super::notify_channel(self.name()))
    }
}

impl SlotSource for AppSource {
    fn replication(
        &self,
        slot: &str,
        publication: &str,
    ) -> Result<ReplicationConfig, ReplicationUrlError> {
        replication_config(&self.inner.config.url, slot, publication)
    }

    async fn wal_level(&self) -> Result<String, StoreError> {
        self.inner.app.wal_level().await
    }

    async fn ensure_slot(&self, slot: &str, publication: &str) -> Result<bool, StoreError> {
        let table = quoted(&self.inner.config.table);
        self.inner
            .app
            .ensure_slot_on(&table, slot, publication)
            .await
    }

    async fn slot_reader(&self, slot: &str) -> Result<Option<i32>, StoreError> {
        self.inner.app.replication_slot_reader(slot).await
    }

    async fn slot_lag(&self, slot: &str) -> Result<Option<i64>, StoreError> {
        self.inner.app.replication_slot_lag(slot).await
    }

    async fn wal_position(&self) -> Result<u64, StoreError> {
        self.inner.app.current_wal_lsn().await
    }

    fn row_of_insert(
        &self,
        relation: &Relation,
        values: &[Option<Vec<u8>>],
    ) -> Option<Result<OutboxRow, DecodeError>> {
        let table = &self.inner.config.table;
        let name = table.rsplit('.').next().unwrap_or(table);
        let schema_matches = match table.split_once('.') {
            Some((schema, _)) => relation.namespace == schema,
            None => true,
        };
        (relation.name == name && schema_matches)
            .then(|| self.inner.reading.row_of_insert(relation, values))
    }
}
