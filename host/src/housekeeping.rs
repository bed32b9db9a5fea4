//! Retention: idempotency records and published outbox rows are deleted after their
//! configured periods, once a minute.

use crate::common::now_ms;
use crate::config::Config;
use crate::store::Store;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Runs until `stop`.
pub async fn run(config: Config, store: Store, stop: CancellationToken) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let inbox_cutoff =
            now_ms() - i64::try_from(config.store.inbox_retention.as_millis()).unwrap_or(i64::MAX);
        match store.inbox_purge_before(inbox_cutoff).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, "expired idempotency records deleted"),
            Err(e) => tracing::warn!(error = %e, "inbox retention cleanup failed; will retry"),
        }
        let outbox_cutoff =
            now_ms() - i64::try_from(config.relay.retention.as_millis()).unwrap_or(i64::MAX);
        match store.outbox_purge_published_before(outbox_cutoff).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, "published outbox rows deleted"),
            Err(e) => tracing::warn!(error = %e, "outbox retention cleanup failed; will retry"),
        }
    }
}
