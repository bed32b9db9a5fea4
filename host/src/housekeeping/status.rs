//! What retention does, for the console: the [`Policy`] in effect and the last purge of each
//! table. The housekeeping task records; the admin server reads.

use super::Policy;
use crate::common::labels::RetentionTable;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// The last successful purge of one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastPurge {
    /// When it ended (unix ms).
    pub at_ms: i64,
    /// Rows it deleted.
    pub purged: u64,
    /// Rows deleted from the table since the gateway started.
    pub total: u64,
}

/// The retention policy in effect and each table's last purge, shared by the housekeeping
/// task and the admin server.
#[derive(Debug)]
pub struct RetentionStatus {
    policy: Policy,
    last: Mutex<BTreeMap<RetentionTable, LastPurge>>,
}

impl RetentionStatus {
    /// Nothing purged yet, under `policy`.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            last: Mutex::default(),
        }
    }

    /// The policy the housekeeping task applies (the config's at start).
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The last successful purge of `table`, if one has run.
    pub fn last(&self, table: RetentionTable) -> Option<LastPurge> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&table)
            .copied()
    }

    /// A purge of `table` ended at `at_ms`, deleting `purged` rows.
    pub(crate) fn record(&self, table: RetentionTable, purged: u64, at_ms: i64) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let total = last.get(&table).map_or(0, |l| l.total) + purged;
        last.insert(
            table,
            LastPurge {
                at_ms,
                purged,
                total,
            },
        );
    }
}
