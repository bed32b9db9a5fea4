//! The publication and the replication slot the CDC relay reads, created at start when
//! missing (by the source: the SQL is the store's), and the alert on the slot's retained WAL
//! (how far behind its confirmed position is).

use std::time::{Duration, Instant};

use crate::common::alert::{Change, LoggedAlert};
use crate::relay::source::SlotSource;
use crate::store::StoreError;

/// Why the CDC relay cannot start on this PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error(
        "PostgreSQL runs with wal_level = {0}; the CDC relay ([relay] mode = \"cdc\") needs \
         wal_level = logical (and max_replication_slots, max_wal_senders of at least 1 each): \
         set it in postgresql.conf or with `ALTER SYSTEM SET wal_level = logical` and restart \
         PostgreSQL, or use [relay] mode = \"poll\""
    )]
    WalLevel(String),
    #[error("replication slot or publication setup failed: {0}")]
    Database(#[from] StoreError),
}

impl SlotError {
    /// A setting to change, not an outage: retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        matches!(self, SlotError::WalLevel(_))
    }
}

/// Checks `wal_level`, then has `source` create its publication and `pgoutput` slot when
/// missing. Returns whether this call created the slot.
pub async fn ensure<S: SlotSource>(
    source: &S,
    slot: &str,
    publication: &str,
) -> Result<bool, SlotError> {
    let wal_level = source.wal_level().await?;
    if wal_level != "logical" {
        return Err(SlotError::WalLevel(wal_level));
    }
    Ok(source.ensure_slot(slot, publication).await?)
}

/// The `[relay] max_slot_lag` alert: raised when the slot holds more WAL than the bound,
/// logged again every `remind` while raised, cleared under it.
#[derive(Debug)]
pub struct LagAlert {
    /// Where the alert's (monotonic) clock starts.
    origin: Instant,
    state: LoggedAlert,
}

impl Default for LagAlert {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            state: LoggedAlert::default(),
        }
    }
}

impl LagAlert {
    pub fn is_raised(&self) -> bool {
        self.state.is_raised()
    }

    pub fn observe(
        &mut self,
        bytes: u64,
        max: u64,
        now: Instant,
        remind: Duration,
    ) -> Option<Change> {
        let now = now.saturating_duration_since(self.origin);
        self.state.observe(bytes > max, now, remind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_alert_raises_reminds_and_clears() {
        let mut alert = LagAlert::default();
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        assert_eq!(alert.observe(10, 100, t0, minute), None);
        assert_eq!(alert.observe(101, 100, t0, minute), Some(Change::Raised));
        assert!(alert.is_raised());
        assert_eq!(alert.observe(500, 100, t0 + minute / 2, minute), None);
        assert_eq!(
            alert.observe(500, 100, t0 + minute, minute),
            Some(Change::Reminder)
        );
        assert_eq!(
            alert.observe(100, 100, t0 + minute, minute),
            Some(Change::Cleared)
        );
        assert!(!alert.is_raised());
    }
}
