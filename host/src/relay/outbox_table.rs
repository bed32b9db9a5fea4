//! Carteiro's own outbox as a relay [`Source`]: the `outbox` table of the store, which the
//! pipeline's commits fill. Polled on SQLite and PostgreSQL, or read from a replication
//! slot on PostgreSQL, whose connection takes the store URL's host, role and TLS.

use std::time::Duration;

use pgwire_replication::ReplicationConfig;

use super::cdc::{DecodeError, Relation, ReplicationUrlError, outbox_row, replication_config};
use super::source::{Failed, SlotSource, Source};
use crate::store::{CommitWakeups, OutboxRow, Store, StoreError};

/// The table PostgreSQL names in the slot's Relation messages.
const TABLE: &str = "outbox";

/// The store's `outbox` table.
#[derive(Clone)]
pub struct OutboxTable {
    store: Store,
    /// The store's URL, for the replication connection only (never logged).
    url: String,
}

impl OutboxTable {
    /// The outbox of `store`, opened on `url`.
    pub fn new(store: Store, url: &str) -> Self {
        Self {
            store,
            url: url.to_owned(),
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Source for OutboxTable {
    async fn claim(
        &self,
        limit: usize,
        max_bytes: u64,
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        self.store
            .outbox_claim(limit, max_bytes, owner, millis(lease))
            .await
    }

    async fn release_rows(&self, owner: &str, ids: &[i64]) -> Result<u64, StoreError> {
        self.store.outbox_release_rows(owner, ids).await
    }

    async fn release(&self, owner: &str) -> Result<u64, StoreError> {
        self.store.outbox_release(owner).await
    }

    async fn mark_published(&self, ids: &[i64]) -> Result<u64, StoreError> {
        self.store.outbox_mark_published_many(ids).await
    }

    async fn existing_among(&self, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
        self.store.outbox_existing_among(ids).await
    }

    async fn unpublished_among(&self, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
        self.store.outbox_unpublished_among(ids).await
    }

    async fn record_failure(
        &self,
        id: i64,
        lease: Option<&str>,
        failed: Failed<'_>,
    ) -> Result<bool, StoreError> {
        match (lease, failed) {
            (Some(owner), Failed::Retry { error, retry_after }) => {
                self.store
                    .outbox_mark_failed(id, owner, error, millis(retry_after))
                    .await
            }
            (Some(owner), Failed::Park { error }) => self.store.outbox_park(id, owner, error).await,
            (None, Failed::Retry { error, .. }) => {
                self.store.outbox_record_failure(id, error, false).await?;
                Ok(true)
            }
            (None, Failed::Park { error }) => {
                self.store.outbox_record_failure(id, error, true).await?;
                Ok(true)
            }
        }
    }

    async fn parked_keys(&self) -> Result<Vec<String>, StoreError> {
        self.store.outbox_parked_keys().await
    }

    async fn last_id(&self) -> Result<i64, StoreError> {
        self.store.outbox_max_id().await
    }

    async fn pending_up_to(&self, id: i64) -> Result<i64, StoreError> {
        self.store.outbox_backlog_up_to(id).await
    }

    fn wakeups(&self) -> CommitWakeups {
        self.store.commit_wakeups()
    }
}

impl SlotSource for OutboxTable {
    fn replication(
        &self,
        slot: &str,
        publication: &str,
    ) -> Result<ReplicationConfig, ReplicationUrlError> {
        replication_config(&self.url, slot, publication)
    }

    async fn wal_level(&self) -> Result<String, StoreError> {
        self.store.wal_level().await
    }

    async fn ensure_slot(&self, slot: &str, publication: &str) -> Result<bool, StoreError> {
        self.store.ensure_outbox_slot(slot, publication).await
    }

    async fn slot_reader(&self, slot: &str) -> Result<Option<i32>, StoreError> {
        self.store.replication_slot_reader(slot).await
    }

    async fn slot_lag(&self, slot: &str) -> Result<Option<i64>, StoreError> {
        self.store.replication_slot_lag(slot).await
    }

    async fn wal_position(&self) -> Result<u64, StoreError> {
        self.store.current_wal_lsn().await
    }

    fn row_of_insert(
        &self,
        relation: &Relation,
        values: &[Option<Vec<u8>>],
    ) -> Option<Result<OutboxRow, DecodeError>> {
        (relation.name == TABLE).then(|| outbox_row(relation, values))
    }
}
