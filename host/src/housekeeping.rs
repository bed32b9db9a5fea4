//! Retention, once a minute: idempotency records after `[store] inbox_retention`, published
//! outbox rows after `[relay] retention`, and kv delete tombstones after
//! [`KV_TOMBSTONE_RETENTION`]. Each purge deletes in chunks of short transactions.

use crate::common::now_ms;
use crate::config::Config;
use crate::store::Store;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a kv delete tombstone is kept. A tombstone exists so that a value read before a
/// delete cannot pass its version check after the key is recreated (no ABA): the version
/// read is checked at commit, so a tombstone must outlive any read-to-commit window — one
/// handler run (a plugin `timeout`, seconds), its conflict re-runs, the commit queue and the
/// store's client-side bound (`statement_timeout` + 5 s). A day is thousands of times that,
/// and a deployment whose plugins run for hours has other problems first.
pub const KV_TOMBSTONE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Rows one [`sweep`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Idempotency records.
    pub inbox: u64,
    /// Published outbox rows.
    pub outbox: u64,
    /// kv delete tombstones.
    pub kv_tombstones: u64,
}

/// Runs [`sweep`] once a minute until `stop`.
pub async fn run(config: Config, store: Store, stop: CancellationToken) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        sweep(&config, &store, now_ms()).await;
    }
}

/// One retention pass as of `now_ms`. A failed purge is logged and retried next pass.
pub async fn sweep(config: &Config, store: &Store, now_ms: i64) -> Swept {
    let before = |keep: Duration| now_ms - i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
    let mut swept = Swept::default();
    match store
        .inbox_purge_before(before(config.store.inbox_retention))
        .await
    {
        Ok(n) => swept.inbox = n,
        Err(e) => tracing::warn!(error = %e, "inbox retention cleanup failed; will retry"),
    }
    match store
        .outbox_purge_published_before(before(config.relay.retention))
        .await
    {
        Ok(n) => swept.outbox = n,
        Err(e) => tracing::warn!(error = %e, "outbox retention cleanup failed; will retry"),
    }
    match store
        .kv_purge_tombstones_before(before(KV_TOMBSTONE_RETENTION))
        .await
    {
        Ok(n) => swept.kv_tombstones = n,
        Err(e) => tracing::warn!(error = %e, "kv tombstone cleanup failed; will retry"),
    }
    if swept != Swept::default() {
        tracing::info!(
            inbox = swept.inbox,
            outbox = swept.outbox,
            kv_tombstones = swept.kv_tombstones,
            "retention: expired rows deleted"
        );
    }
    swept
}
