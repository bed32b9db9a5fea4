//! Immediate dispatch: the group committer inserts a batch's outbox rows already leased to
//! the in-process relay's session and hands them to it in memory after the commit, so the
//! relay publishes them without reading them back out of the table (docs/architecture.md,
//! "Immediate dispatch").
//!
//! Rows and leases exclude each other as claims do: a handed row is leased in the
//! transaction that inserts it, so no other relay (or later session) can claim it until
//! the session marks it published or gives it back. A session *opens* the hand-off under its
//! own lease owner and *closes* it before it gives its leases back; closing waits for the
//! commits that are inserting rows under that owner, so no row is ever leased to a session
//! that is gone (a crash leaves the leases to expire, and the table path publishes them).
//!
//! Per-key order: a commit hands a row only when no unpublished row of its ordering key is
//! in the table already (`held_keys`); otherwise the row goes to the table unleased and is
//! claimed behind the earlier one.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedRwLockReadGuard, RwLock, mpsc};

pub(crate) use super::request::HandoffLease;
use crate::store::{CommitRequest, OutboxRow};

/// Committed rows on their way to the relay session, with when their commit began (their
/// lease, timed by the database's clock inside the transaction, started no earlier).
pub struct Handed {
    /// When the committing transaction began.
    pub began: Instant,
    /// The rows, in id order.
    pub rows: Vec<OutboxRow>,
}

/// The slot between the committer and the in-process relay. Cheap to clone.
#[derive(Clone, Default)]
pub struct Handoff(Arc<RwLock<Option<Taker>>>);

/// The session taking rows now.
struct Taker {
    owner: String,
    lease: Duration,
    rows: mpsc::UnboundedSender<Handed>,
    room: Room,
}

/// How much the session may still take: it bounds its memory as claims do (rows and bytes
/// of its window), sharing its counts here.
#[derive(Clone)]
pub struct Room {
    /// Rows the session holds (its window).
    pub window: Arc<AtomicUsize>,
    /// Bytes of payload and headers the session holds.
    pub bytes: Arc<AtomicU64>,
    /// Rows handed and not yet taken into the window.
    pub queued: Arc<AtomicUsize>,
    pub max_rows: usize,
    pub max_bytes: u64,
}

impl Room {
    fn fits(&self, rows: usize) -> bool {
        let held = self.window.load(Ordering::Relaxed) + self.queued.load(Ordering::Relaxed);
        held + rows <= self.max_rows && self.bytes.load(Ordering::Relaxed) < self.max_bytes
    }
}

/// A commit's permission to lease its rows to the open session: while it lives, the session
/// cannot close.
pub(crate) struct Permit {
    taker: OwnedRwLockReadGuard<Option<Taker>, Taker>,
}

impl Handoff {
    /// Opens the hand-off to a relay session leasing as `owner` for `lease`; rows arrive on
    /// the receiver. Replaces (and so closes) any earlier session's.
    pub async fn open(
        &self,
        owner: &str,
        lease: Duration,
        room: Room,
    ) -> mpsc::UnboundedReceiver<Handed> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.0.write().await = Some(Taker {
            owner: owner.to_owned(),
            lease,
            rows: tx,
            room,
        });
        rx
    }

    /// Closes the hand-off of `owner`'s session: returns once no commit is leasing rows to
    /// it any more. Rows already handed stay leased to `owner` until it gives them back.
    pub async fn close(&self, owner: &str) {
        let mut slot = self.0.write().await;
        if slot.as_ref().is_some_and(|t| t.owner == owner) {
            *slot = None;
        }
    }

    /// A permit for a commit of `rows` outbox rows, if a session is open and has room. Never
    /// waits: a session that is closing gets none, and the rows go to the table.
    pub(crate) fn permit(&self, rows: usize) -> Option<Permit> {
        let guard = self.0.clone().try_read_owned().ok()?;
        let taker = OwnedRwLockReadGuard::try_map(guard, Option::as_ref).ok()?;
        taker.room.fits(rows).then_some(Permit { taker })
    }
}

impl Permit {
    pub(crate) fn lease(&self) -> HandoffLease<'_> {
        let taker = &self.taker;
        HandoffLease {
            owner: &taker.owner,
            lease_ms: i64::try_from(taker.lease.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// Hands the committed `rows` over (nothing to do when there are none).
    pub(crate) fn hand(self, began: Instant, rows: Vec<OutboxRow>) {
        if rows.is_empty() {
            return;
        }
        let taker = &self.taker;
        taker.room.queued.fetch_add(rows.len(), Ordering::Relaxed);
        // A session that ended without closing (a panic) lets the leases expire.
        let _ = taker.rows.send(Handed { began, rows });
    }
}

/// The rows of `requests` whose event ids a commit at `at` leased (`handed`), moved out of
/// the requests, in id order.
pub(crate) fn handed_rows(
    handed: &HashMap<String, i64>,
    at: i64,
    requests: Vec<CommitRequest>,
) -> Vec<OutboxRow> {
    if handed.is_empty() {
        return Vec::new();
    }
    let mut rows: Vec<OutboxRow> = requests
        .into_iter()
        .flat_map(|r| r.outbox)
        .filter_map(|event| {
            Some(OutboxRow {
                id: *handed.get(event.event_id.as_str())?,
                event,
                created_at: at,
                attempts: 0,
                last_error: None,
                message_type: None,
                refused: None,
            })
        })
        .collect();
    rows.sort_by_key(|r| r.id);
    rows
}
