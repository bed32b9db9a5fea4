//! What the relay reads rows from: a [`Source`] is a table of rows to publish and the
//! bookkeeping on it (leases, marks, failures, parked rows, wake-ups on commits). The relay
//! does the rest the same way for every source: chains per ordering key, publishing runs
//! with confirms, marks in group commits, parking, backoff and fencing (docs/architecture.md,
//! "The relay and its sources").
//!
//! A source is read by polling (leases, [`Source::claim`]) or, when it is also a
//! [`SlotSource`], from a PostgreSQL logical replication slot (`cdc`). Carteiro's own outbox
//! is one source (`outbox_table`).

use std::future::Future;
use std::time::Duration;

use pgwire_replication::ReplicationConfig;

use super::cdc::{DecodeError, Relation, ReplicationUrlError};
use crate::store::{CommitWakeups, OutboxRow, StoreError};

/// A failed publish, as the source records it on its row.
#[derive(Debug, Clone, Copy)]
pub(super) enum Failed<'a> {
    /// Publishing may succeed later (unroutable, nacked, no confirm): count the attempt and
    /// keep `error`. A leased row is given back, to be claimed again once `retry_after` has
    /// passed by the database's clock; a row read from the slot is retried by the relay.
    Retry {
        error: &'a str,
        retry_after: Duration,
    },
    /// AMQP can never carry it: count the attempt and park it with `error`. A parked row
    /// holds its ordering key's later rows (an unordered row holds nothing) until an operator
    /// deals with it.
    Park { error: &'a str },
}

/// A table the relay publishes from. Rows are handed out in id order; rows sharing a
/// non-empty ordering key go out in that order (see [`Source::claim`]).
pub(super) trait Source: Clone + Send + Sync + 'static {
    /// Leases to `owner`, for `lease` by the database's clock, up to `limit` publishable rows
    /// holding at most `max_bytes` (the first row always), in id order. Publishable: not
    /// published, not in backoff, not parked, not leased, and no row of its ordering key is
    /// in backoff, parked or leased by another owner. Rows `owner` leases itself do not hold
    /// their key back: an owner is one relay session, which keeps every row it leased in
    /// memory or confirmed.
    fn claim(
        &self,
        limit: usize,
        max_bytes: u64,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<OutboxRow>, StoreError>> + Send;

    /// Gives back `ids` if `owner` still leases them and they are not published.
    fn release_rows(
        &self,
        owner: &str,
        ids: &[i64],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Gives back every unpublished row `owner` leases (a session that ends).
    fn release(&self, owner: &str) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Marks `ids` published, whoever leases them; returns how many changed. Only rows whose
    /// own confirm arrived (G3).
    fn mark_published(&self, ids: &[i64]) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Which of `ids` exist, published or not, sorted.
    fn existing_among(
        &self,
        ids: &[i64],
    ) -> impl Future<Output = Result<Vec<i64>, StoreError>> + Send;

    /// Which of `ids` are still to publish (not published, not parked), sorted.
    fn unpublished_among(
        &self,
        ids: &[i64],
    ) -> impl Future<Output = Result<Vec<i64>, StoreError>> + Send;

    /// Records `failed` on row `id`. With `lease`, only while that owner still leases the row
    /// (a relay that slept past its lease must not touch a row another relay owns); returns
    /// whether it did. Without (a row read from the slot), always true.
    fn record_failure(
        &self,
        id: i64,
        lease: Option<&str>,
        failed: Failed<'_>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The ordering keys a parked row holds.
    fn parked_keys(&self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// The highest id so far (0 when empty).
    fn last_id(&self) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Rows up to `id` still to publish (not published, not parked).
    fn pending_up_to(&self, id: i64) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Wake-ups on commits by other processes (the poll interval is the backstop).
    fn wakeups(&self) -> CommitWakeups;
}

/// A source in a PostgreSQL database, readable from a logical replication slot (`cdc`).
pub(super) trait SlotSource: Source {
    /// The replication connection's settings for `slot` and `publication`.
    fn replication(
        &self,
        slot: &str,
        publication: &str,
    ) -> Result<ReplicationConfig, ReplicationUrlError>;

    /// The database's `wal_level` (the slot needs `logical`).
    fn wal_level(&self) -> impl Future<Output = Result<String, StoreError>> + Send;

    /// Creates the publication (inserts into the table only) and the `pgoutput` slot when
    /// missing; returns whether it created the slot.
    fn ensure_slot(
        &self,
        slot: &str,
        publication: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The backend process that reads `slot` now (`None`: nobody, or no such slot).
    fn slot_reader(
        &self,
        slot: &str,
    ) -> impl Future<Output = Result<Option<i32>, StoreError>> + Send;

    /// Bytes of WAL `slot` holds back (`None`: no such slot).
    fn slot_lag(&self, slot: &str) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;

    /// The server's current WAL position.
    fn wal_position(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The row an insert into `relation` carries; `None` when `relation` is not this
    /// source's table.
    fn row_of_insert(
        &self,
        relation: &Relation,
        values: &[Option<Vec<u8>>],
    ) -> Option<Result<OutboxRow, DecodeError>>;
}
