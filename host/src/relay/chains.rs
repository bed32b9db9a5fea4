//! Per-ordering-key chains of the rows a relay session holds, the relay's in-memory half of
//! the ordering rule, for both feeds (polling and the slot).
//!
//! A key has at most one batch of rows publishing at a time (one row after another, each
//! after the previous one's confirm); rows taken later for the same key wait behind it in
//! order (claims return rows in id order, and later claims return only later rows; the slot
//! sends commits in commit order) and go out as the key's next batch. A failed polled row
//! stops its chain: the rows behind it are handed back to the store only after the failure
//! is recorded there (see `poll::Session::settle_failures`), so no later row of that key
//! starts before the failed one is published. The one exception is
//! the failed row's own pipelined run: rows behind it in that run may be confirmed already,
//! and those are marked (sending them again on every retry would only duplicate them), so
//! they arrive before it. Rows with an empty ordering key are not ordered and never wait.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::store::OutboxRow;

/// A row this relay session holds: leased (polling) or read from the slot.
#[derive(Debug)]
pub(super) struct Leased {
    pub row: OutboxRow,
    /// Last moment a publish of this row may start: later, the lease could run out while the
    /// publish is still waiting for its confirm, and another relay could take the row.
    /// `None`: no lease (read from the slot, fenced as a whole instead).
    pub start_by: Option<Instant>,
    /// Counts the row's bytes in the session's window until the row is dropped.
    pub _held: Held,
}

/// Bytes of the rows a session holds in memory (payload and headers): each [`Held`] adds
/// its row's size on creation and takes it away when dropped, wherever the row ends
/// (published, failed and settled, given back, or dropped at the session's end).
#[derive(Debug, Clone, Default)]
pub(super) struct HeldBytes(Arc<AtomicU64>);

impl HeldBytes {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// The count itself, for the committer to read (immediate dispatch's room).
    pub fn shared(&self) -> Arc<AtomicU64> {
        self.0.clone()
    }

    /// Counts `row` until the returned guard is dropped.
    pub fn hold(&self, row: &OutboxRow) -> Held {
        let bytes = row_bytes(row);
        self.0.fetch_add(bytes, Ordering::Relaxed);
        Held {
            total: self.0.clone(),
            bytes,
        }
    }
}

/// One row's share of [`HeldBytes`].
#[derive(Debug)]
pub(super) struct Held {
    total: Arc<AtomicU64>,
    bytes: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// What a row weighs in memory, as the claim's byte budget counts it.
pub(super) fn row_bytes(row: &OutboxRow) -> u64 {
    let headers: usize = row
        .event
        .headers
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    (row.event.payload.len() + headers) as u64
}

#[derive(Debug, Default)]
struct Chain {
    waiting: VecDeque<Leased>,
    /// The row publishing for this key failed: nothing more starts until `settle`.
    stopped: bool,
}

/// The chains of one relay session.
#[derive(Debug, Default)]
pub(super) struct Chains {
    by_key: HashMap<String, Chain>,
}

impl Chains {
    /// A freshly leased row: returns it when it may be published now (its key has no row in
    /// flight), or queues it behind its key's chain.
    pub fn admit(&mut self, leased: Leased) -> Option<Leased> {
        let key = &leased.row.event.ordering_key;
        if key.is_empty() {
            return Some(leased);
        }
        match self.by_key.get_mut(key) {
            Some(chain) => {
                chain.waiting.push_back(leased);
                None
            }
            None => {
                self.by_key.insert(key.clone(), Chain::default());
                Some(leased)
            }
        }
    }

    /// The rows in flight for `key` were all confirmed: the rows of that key to publish
    /// next, in id order (all that queued up meanwhile). Empty: the chain ends.
    pub fn next_batch(&mut self, key: &str) -> Vec<Leased> {
        let Some(chain) = self.by_key.get_mut(key) else {
            return Vec::new();
        };
        if chain.stopped {
            return Vec::new();
        }
        let next: Vec<Leased> = chain.waiting.drain(..).collect();
        if next.is_empty() {
            self.by_key.remove(key);
        }
        next
    }

    /// The rows queued behind the batch just started for `key`, to join that batch (a claim
    /// that brought several rows of an idle key). The chain stays.
    pub fn take_waiting(&mut self, key: &str) -> Vec<Leased> {
        match self.by_key.get_mut(key) {
            Some(chain) if !chain.stopped => chain.waiting.drain(..).collect(),
            _ => Vec::new(),
        }
    }

    /// A row of `key` failed (or may not start): the chain stops. `unpublished` (the rows
    /// handed out after it, not published) go back to the head of the queue; they, and
    /// rows leased for the key from now on, stay queued until `settle`.
    pub fn stop(&mut self, key: &str, unpublished: Vec<Leased>) {
        if let Some(chain) = self.by_key.get_mut(key) {
            chain.stopped = true;
            for leased in unpublished.into_iter().rev() {
                chain.waiting.push_front(leased);
            }
        }
    }

    /// The failure of `key`'s chain is recorded in the store: forget the chain and return
    /// the rows that waited behind it, to be released.
    pub fn settle(&mut self, key: &str) -> Vec<Leased> {
        self.by_key
            .remove(key)
            .map(|chain| chain.waiting.into())
            .unwrap_or_default()
    }

    /// Session end: forget every chain; returns how many rows were still waiting.
    pub fn clear(&mut self) -> usize {
        self.by_key.drain().map(|(_, c)| c.waiting.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewOutboxRow;

    fn leased(id: i64, key: &str) -> Leased {
        let event = NewOutboxRow {
            event_id: uuid::Uuid::now_v7().to_string(),
            route: "r".into(),
            plugin: "p".into(),
            exchange: "x".into(),
            routing_key: "k".into(),
            headers: Vec::new(),
            content_type: None,
            payload: Vec::new(),
            ordering_key: key.into(),
        };
        let row = OutboxRow {
            id,
            event,
            created_at: 0,
            attempts: 0,
            last_error: None,
            message_type: None,
            refused: None,
        };
        Leased {
            _held: HeldBytes::default().hold(&row),
            row,
            start_by: None,
        }
    }

    #[test]
    fn held_bytes_follow_the_rows_alive() {
        let bytes = HeldBytes::default();
        let mut row = leased(1, "A").row;
        row.event.payload = vec![0; 1000];
        row.event.headers = vec![("x-a".into(), "12345".into())];
        let a = bytes.hold(&row);
        let b = bytes.hold(&row);
        assert_eq!(bytes.get(), 2 * 1008);
        drop(a);
        assert_eq!(bytes.get(), 1008);
        drop(b);
        assert_eq!(bytes.get(), 0);
    }

    fn id(l: Option<Leased>) -> Option<i64> {
        l.map(|l| l.row.id)
    }

    fn ids(batch: Vec<Leased>) -> Vec<i64> {
        batch.into_iter().map(|l| l.row.id).collect()
    }

    #[test]
    fn one_batch_per_key_in_flight_in_id_order() {
        let mut c = Chains::default();
        assert_eq!(id(c.admit(leased(1, "A"))), Some(1));
        assert_eq!(id(c.admit(leased(2, "B"))), Some(2));
        assert_eq!(id(c.admit(leased(3, "A"))), None);
        // A later claim appends to the running chain.
        assert_eq!(id(c.admit(leased(7, "A"))), None);
        assert_eq!(ids(c.next_batch("A")), vec![3, 7]);
        assert_eq!(id(c.admit(leased(8, "A"))), None);
        assert_eq!(ids(c.next_batch("A")), vec![8]);
        assert!(c.next_batch("A").is_empty());
        // The chain ended: the next row of A starts at once.
        assert_eq!(id(c.admit(leased(9, "A"))), Some(9));
        assert_eq!(id(c.admit(leased(10, "A"))), None);
        // Rows of one claim join the batch started for their key; the chain stays.
        assert_eq!(ids(c.take_waiting("A")), vec![10]);
        assert!(c.next_batch("A").is_empty());
        assert!(c.next_batch("B").is_empty());
    }

    #[test]
    fn unordered_rows_never_wait() {
        let mut c = Chains::default();
        assert_eq!(id(c.admit(leased(1, ""))), Some(1));
        assert_eq!(id(c.admit(leased(2, ""))), Some(2));
        assert!(c.next_batch("").is_empty());
        assert!(c.settle("").is_empty());
    }

    #[test]
    fn a_failure_stops_its_chain_until_settled() {
        let mut c = Chains::default();
        assert_eq!(id(c.admit(leased(1, "A"))), Some(1));
        assert_eq!(id(c.admit(leased(2, "A"))), None);
        assert_eq!(id(c.admit(leased(3, "B"))), Some(3));
        assert_eq!(ids(c.next_batch("A")), vec![2]);
        assert_eq!(id(c.admit(leased(5, "A"))), None);
        // 2 fails; 4 had been handed out with it and was not published.
        c.stop("A", vec![leased(4, "A")]);
        // Nothing of A starts any more, even rows leased after the failure.
        assert!(c.next_batch("A").is_empty());
        assert_eq!(id(c.admit(leased(6, "A"))), None);
        // Other keys go on.
        assert_eq!(id(c.admit(leased(7, "B"))), None);
        assert_eq!(ids(c.next_batch("B")), vec![7]);
        assert_eq!(ids(c.settle("A")), vec![4, 5, 6]);
        // Settled: a row of A leased later (after the failure is in the store) starts.
        assert_eq!(id(c.admit(leased(8, "A"))), Some(8));
        assert_eq!(c.clear(), 0);
    }
}
