//! Retention, once a minute: idempotency records after `[store] inbox_retention`, published
//! outbox rows after `[outbox] retain_published`, archived dead letters after
//! `[dead_letters] retain` (only when set; by default only the replayed ones), and kv delete
//! tombstones after [`KV_TOMBSTONE_RETENTION`]. Each purge deletes in batches of short
//! transactions with a pause between them (`store::RETENTION_BATCH`, `RETENTION_PAUSE`);
//! what each pass deleted goes to the `carteiro_retention_*` metrics and, through
//! [`RetentionStatus`], to the console.
//!
//! # Layout
//! - this file: the [`Policy`] a pass applies, [`sweep`] (one pass), [`run`] (the task).
//! - `config`: `[outbox]` and `[dead_letters]`.
//! - `status`: [`RetentionStatus`], what the last purge of each table did, for the console.

mod config;
mod status;

pub use config::{DeadLettersConfig, Expire, OutboxConfig};
pub use status::{LastPurge, RetentionStatus};

use crate::common::labels::RetentionTable;
use crate::common::now_ms;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a kv delete tombstone is kept. A tombstone exists so that a value read before a
/// delete cannot pass its version check after the key is recreated (no ABA): the version
/// read is checked at commit, so a tombstone must outlive any read-to-commit window — one
/// handler run (a plugin `timeout`, seconds), its conflict re-runs, the commit queue and the
/// store's client-side bound (`statement_timeout` + 5 s). A day is thousands of times that,
/// and a deployment whose plugins run for hours has other problems first.
pub const KV_TOMBSTONE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// What a retention pass deletes: how long each table keeps its rows, from the config
/// (`Config::retention`). Read at start: a reload does not change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Idempotency records (`[store] inbox_retention`).
    pub inbox: Duration,
    /// Published outbox rows (`[outbox] retain_published`).
    pub outbox: Duration,
    /// Archived dead letters (`[dead_letters] retain`); `None`: kept forever.
    pub dead_letters: Option<Duration>,
    /// Which dead letters past their age go (`[dead_letters] expire`).
    pub expire: Expire,
}

/// What one [`sweep`] deleted, per table: `Some(rows)` when that purge succeeded (possibly
/// deleting nothing), `None` when it failed (logged; the next pass tries again) or, for dead
/// letters, when no `retain` is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Idempotency records.
    pub inbox: Option<u64>,
    /// Published outbox rows.
    pub outbox: Option<u64>,
    /// kv delete tombstones.
    pub kv_tombstones: Option<u64>,
    /// Archived dead letters.
    pub dead_letters: Option<u64>,
}

impl Swept {
    /// Each table whose purge succeeded, with the rows it deleted.
    pub fn succeeded(&self) -> impl Iterator<Item = (RetentionTable, u64)> {
        [
            (RetentionTable::DeadLetters, self.dead_letters),
            (RetentionTable::Outbox, self.outbox),
            (RetentionTable::Inbox, self.inbox),
            (RetentionTable::KvTombstones, self.kv_tombstones),
        ]
        .into_iter()
        .filter_map(|(table, purged)| Some((table, purged?)))
    }

    /// Records the purges that succeeded, as of `at_ms`: counted in `metrics`
    /// (`carteiro_retention_*`) and kept in `status` for the console.
    pub fn record(&self, at_ms: i64, metrics: &Metrics, status: &RetentionStatus) {
        for (table, purged) in self.succeeded() {
            metrics.retention_purged(table, purged, at_ms);
            status.record(table, purged, at_ms);
        }
    }
}

/// Time between the end of one retention pass and the start of the next.
pub const PASS_INTERVAL: Duration = Duration::from_secs(60);

/// Runs [`sweep`] at once, then [`PASS_INTERVAL`] after each pass ended (a pass through a
/// backlog of millions may take minutes), until `stop`, with the policy `status` holds;
/// records each pass in `metrics` and `status`. A pass still running at `stop` is
/// abandoned: its current batch rolls back, the batches before it stay deleted.
pub async fn run(
    status: Arc<RetentionStatus>,
    store: Store,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let policy = status.policy();
    loop {
        let swept = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            swept = sweep(&policy, &store, now_ms()) => swept,
        };
        swept.record(now_ms(), &metrics, &status);
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(PASS_INTERVAL) => {}
        }
    }
}

/// One retention pass as of `now_ms`. A failed purge is logged and retried next pass; the
/// other tables' purges go on.
pub async fn sweep(policy: &Policy, store: &Store, now_ms: i64) -> Swept {
    let before = |keep: Duration| cutoff(now_ms, keep);
    let inbox = store.inbox_purge_before(before(policy.inbox)).await;
    let outbox = store
        .outbox_purge_published_before(before(policy.outbox))
        .await;
    let kv_tombstones = store
        .kv_purge_tombstones_before(before(KV_TOMBSTONE_RETENTION))
        .await;
    let dead_letters = match policy.dead_letters {
        Some(retain) => {
            let replayed_only = policy.expire == Expire::Replayed;
            let purged = store
                .dead_letters_purge_expired(before(retain), replayed_only)
                .await;
            logged(RetentionTable::DeadLetters, purged)
        }
        None => None,
    };
    let swept = Swept {
        inbox: logged(RetentionTable::Inbox, inbox),
        outbox: logged(RetentionTable::Outbox, outbox),
        kv_tombstones: logged(RetentionTable::KvTombstones, kv_tombstones),
        dead_letters,
    };
    if swept.succeeded().any(|(_, purged)| purged > 0) {
        tracing::info!(
            inbox = swept.inbox.unwrap_or(0),
            outbox = swept.outbox.unwrap_or(0),
            kv_tombstones = swept.kv_tombstones.unwrap_or(0),
            dead_letters = swept.dead_letters.unwrap_or(0),
            "retention: expired rows deleted"
        );
    }
    swept
}

/// `keep` before `now_ms` (unix ms), saturating.
fn cutoff(now_ms: i64, keep: Duration) -> i64 {
    now_ms.saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
}

/// The rows a purge of `table` deleted, or `None` once its failure is logged.
fn logged(table: RetentionTable, purged: Result<u64, StoreError>) -> Option<u64> {
    purged
        .inspect_err(|e| {
            tracing::warn!(table = %table, error = %e, "retention purge failed; will retry");
        })
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_recorded_for_each_table_whose_purge_succeeded() {
        let metrics = Metrics::default();
        let status = RetentionStatus::new(Policy {
            inbox: Duration::from_secs(3600),
            outbox: Duration::from_secs(24 * 3600),
            dead_letters: Some(Duration::from_secs(30 * 24 * 3600)),
            expire: Expire::Replayed,
        });
        let first = Swept {
            inbox: Some(3),
            outbox: Some(0),
            kv_tombstones: None,
            dead_letters: Some(1_204),
        };
        first.record(1_700_000_000_000, &metrics, &status);
        let second = Swept {
            dead_letters: Some(6),
            ..Swept::default()
        };
        second.record(1_700_000_060_000, &metrics, &status);

        let text = metrics.encode();
        for line in [
            "carteiro_retention_purged_total{table=\"dead_letters\"} 1210",
            "carteiro_retention_purged_total{table=\"inbox\"} 3",
            "carteiro_retention_purged_total{table=\"outbox\"} 0",
            "carteiro_retention_last_success_timestamp_seconds{table=\"dead_letters\"} 1700000060",
            "carteiro_retention_last_success_timestamp_seconds{table=\"outbox\"} 1700000000",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        assert!(
            !text.contains("table=\"kv_tombstones\""),
            "a failed purge is no success: {text}"
        );
        assert_eq!(
            status.last(RetentionTable::DeadLetters),
            Some(LastPurge {
                at_ms: 1_700_000_060_000,
                purged: 6,
                total: 1_210,
            })
        );
        assert_eq!(status.last(RetentionTable::KvTombstones), None);
    }

    #[test]
    fn cutoffs_saturate() {
        assert_eq!(cutoff(10_000, Duration::from_secs(3)), 7_000);
        assert_eq!(cutoff(0, Duration::MAX), -i64::MAX);
    }
}
