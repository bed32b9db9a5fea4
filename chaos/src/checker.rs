//! The checker: from what was sent, the final database state, what is still queued, what
//! the sink saw arrive and when the faults were, count what was lost, duplicated or
//! unexpected. Pure, so its self-test can feed it a state with known defects.
//!
//! - this file: what the checker reads ([`State`]) and finds ([`Findings`]), and [`check`],
//!   which goes through the inputs one by one;
//! - `inputs`: each input's effect, its dead letters, the hot counters, and state nobody
//!   sent;
//! - `events`: the outbox events downstream and at the sink (duplicates judged by the fault
//!   windows, order per key).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::config::{ROUTE_DOWNSTREAM, ROUTE_LARGE, ROUTE_POISON};
use crate::logs::RelayLogs;
use crate::workload::{Kind, Sent};
use events::{check_downstream, check_sink, events_by_ordering_key};
use inputs::{check_counters, check_unexpected_keys, dead_letters_by_id, effect, missing};
use repairs::{check_repairs, edited};

mod events;
mod inputs;
mod repairs;
#[cfg(test)]
mod tests;

/// Events each enrollment emits.
const ENROLL_EVENTS: usize = 3;

/// One outbox row.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: i64,
    pub event_id: String,
    pub route: String,
    pub ordering_key: String,
    pub published: bool,
    /// Failed publish attempts, and the last one's error.
    pub attempts: i64,
    pub last_error: Option<String>,
    /// When the gateway committed it and when a relay's mark committed (Unix ms): what a
    /// duplicate's example reports, so that a failed run says where the time went.
    pub created_at: i64,
    pub published_at: Option<i64>,
}

impl OutboxRow {
    /// An event of an upstream route, which the downstream route consumes (not a downstream
    /// event, nor a row the poison-row fault committed). A large transaction's rows are.
    pub fn is_upstream_event(&self) -> bool {
        self.route != ROUTE_DOWNSTREAM && self.route != ROUTE_POISON
    }
}

/// What the DLQ repair fault's edits reported (`dlq_repair`), for the checker.
#[derive(Debug, Default, Clone)]
pub struct Repairs {
    /// Message ids whose edited copy a `dlq edit` reported sent.
    pub edits_sent: HashSet<String>,
    /// Message ids whose two concurrent edits both reported sent (one copy must be refused).
    pub edits_both_sent: Vec<String>,
}

/// One `dead_letters` row.
#[derive(Debug, Clone, Default)]
pub struct DeadLetter {
    pub id: i64,
    pub route: String,
    pub message_id: Option<String>,
    pub reason: String,
    /// The dead letter whose replayed (or edited) copy this one is.
    pub replay_of: Option<i64>,
    /// Times it was replayed or edited, and whether it was at all and whether edited.
    pub replay_count: i64,
    pub replayed: bool,
    pub edited: bool,
}

/// One copy of an event that reached the sink queue.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Arrival {
    pub event_id: String,
    pub at_ms: u64,
    /// The broker's redelivered flag: not a second publish, but a copy the broker handed to a
    /// sink consumer before (its ack lost, or the consumer gone with the node it was on), so
    /// its place in the sink's order says where the broker put it back, not where it was
    /// published.
    pub redelivered: bool,
}

/// When a fault was active: from injection to the first progress after healing (or to
/// healing, when progress never resumed: a stall).
#[derive(Debug, Clone)]
pub struct FaultSpan {
    pub start_ms: u64,
    pub end_ms: u64,
    /// Progress resumed within the campaign's bound after healing.
    pub recovered: bool,
}

/// Everything the checker reads.
#[derive(Debug, Default)]
pub struct State {
    /// Every distinct input (duplicates by message id are one entry).
    pub sent: Vec<Sent>,
    /// Live kv values: (namespace, key) → value text.
    pub kv: HashMap<(String, String), String>,
    /// Inbox records: (route, key).
    pub inbox: HashSet<(String, String)>,
    pub outbox: Vec<OutboxRow>,
    pub dead_letters: Vec<DeadLetter>,
    /// Confirmed publishes per message id (missing: once).
    pub publishes: HashMap<String, u32>,
    /// Message ids found in a queue (work queue, retry tier or DLQ) after the gateways
    /// stopped: what they held unacked is back in its queue by then.
    pub queued: HashSet<String>,
    /// Message ids in a quorum route's `Q.dlq.parked`: dead letters the broker moved past
    /// the DLQ's delivery limit. Not lost (an operator moves them back), but reported.
    pub parked: HashSet<String>,
    /// Inputs no publish of which was confirmed: the broker may never have had them.
    pub unconfirmed: HashSet<String>,
    /// The sink's arrivals, in arrival order.
    pub sink: Vec<Arrival>,
    pub faults: Vec<FaultSpan>,
    /// How long after a fault a relay may still republish what it had in flight: the
    /// relay lease plus the publish timeout, with margin.
    pub window_ms: u64,
    /// How long before a fault a copy may have been published and still be unmarked when
    /// the fault hit: the publish timeout, with margin.
    pub lead_ms: u64,
    /// Unix ms of the campaign's time 0 (the sink's and the faults' clock).
    pub started_unix_ms: i64,
    /// Everything drained (queues, outbox, downstream, sink) within the bound.
    pub drained: bool,
    /// Processes that exited without being killed.
    pub exits: Vec<String>,
    /// What the relays logged about their publishes: events whose confirm timed out are sent
    /// again (G3, at least once), fault or not; events whose publish failed otherwise stayed
    /// pending and were retried with backoff, so a resend of one whose first copy went out
    /// before a fault (a gateway killed before its mark) can come after that fault's window.
    pub relay_logs: RelayLogs,
    /// What the DLQ repair fault's edits reported.
    pub repairs: Repairs,
}

/// What the checker found. [`Findings::passed`] says which counts must be zero.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Findings {
    pub inputs: usize,
    pub lost: usize,
    pub duplicate_effects: usize,
    pub unexpected: usize,
    pub dead_letters_without_reason: usize,
    pub order_violations: usize,
    /// Events left out of the order check because their first copy at the sink was a
    /// redelivery: where they were published in their key's order cannot be seen.
    pub order_unobservable: usize,
    /// A copy with no fault whose window holds both it and the event's first copy.
    pub duplicate_events_beyond_window: usize,
    pub duplicate_events_within_window: usize,
    /// Copies of events whose publish a relay saw time out without a confirm, beyond every
    /// fault's window: the documented at-least-once resend, reported but not a failure.
    pub duplicate_events_after_confirm_timeout: usize,
    /// Copies, beyond every window, of events whose first copy lies in a fault's window and
    /// whose publish a relay then logged as failed and retried: the fault's resend, delayed
    /// by the retries' backoff. Reported but not a failure.
    pub duplicate_events_after_failed_publishes: usize,
    /// Copies resent after a fault that hit their row confirmed and not yet marked, however
    /// long after the first copy: the row's mark committed only after the fault began, and
    /// a relay logged a mark it could not write between the two copies (a store that did not
    /// answer).
    /// G3: such a row is sent again (at least once).
    pub duplicate_events_after_delayed_mark: usize,
    /// Time from the start to the last arrival that no fault's window covers: where a
    /// duplicate event is always a finding (the check is not vacuous when this is > 0).
    pub ms_outside_windows: u64,
    pub events: usize,
    pub dead_letters: usize,
    /// Inputs and events with no effect found in a queue after the gateways stopped.
    pub still_queued: usize,
    /// Messages of any kind found in a route's queues after the gateways stopped: the drain
    /// did not finish them.
    pub left_in_queues: usize,
    /// Dead letters parked in `Q.dlq.parked` (not lost; an operator moves them back).
    pub parked_dead_letters: usize,
    /// Outbox rows AMQP cannot carry, committed by the poison-row fault.
    pub poison_rows: usize,
    /// Of those, rows published, retried, or not parked with their error.
    pub poison_rows_not_parked: usize,
    /// Outbox rows the large-transaction fault committed (checked as every other event).
    pub large_rows: usize,
    /// Dead letters replayed by the repair fault's replays, and edited copies sent.
    pub dead_letters_replayed: usize,
    pub edits_sent: usize,
    /// A dead letter two concurrent edits both reported sent, or replayed (or edited) more
    /// than once by runs that each take only what was never replayed.
    pub edits_both_sent: usize,
    pub dead_letters_replayed_twice: usize,
    /// Inputs never confirmed by the broker and with no effect: maybe never received.
    pub unconfirmed_without_effect: usize,
    pub drained: bool,
    pub unexpected_exits: usize,
    /// Faults after which nothing was committed within the campaign's bound.
    pub stalled_faults: usize,
    /// Dead-letter rows beyond one per confirmed publish of the message: the gateway's
    /// dead-lettering and the archiver are at least once.
    pub repeated_dead_letters: usize,
    /// Up to a few examples per failing kind, for the report.
    pub examples: BTreeMap<String, Vec<String>>,
}

impl Findings {
    /// No loss, no duplicate effect, nothing unexpected, reasons everywhere, order kept,
    /// duplicate events only within a fault's window, nothing left queued, drained, every
    /// fault recovered and no process died on its own.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.duplicate_effects == 0
            && self.unexpected == 0
            && self.dead_letters_without_reason == 0
            && self.order_violations == 0
            && self.duplicate_events_beyond_window == 0
            && self.still_queued == 0
            && self.left_in_queues == 0
            && self.drained
            && self.unexpected_exits == 0
            && self.stalled_faults == 0
            && self.poison_rows_not_parked == 0
            && self.edits_both_sent == 0
            && self.dead_letters_replayed_twice == 0
    }

    /// A count above what was sent is a duplicate effect, below it a loss.
    fn compare(&mut self, what: &str, actual: u64, expected: u64) {
        let finding = if actual > expected {
            self.duplicate_effects += 1;
            "duplicate_effects"
        } else if actual < expected {
            self.lost += 1;
            "lost"
        } else {
            return;
        };
        self.note(finding, format!("{what} = {actual}, expected {expected}"));
    }

    fn note(&mut self, kind: &str, example: String) {
        let list = self.examples.entry(kind.to_owned()).or_default();
        if list.len() < 5 {
            list.push(example);
        }
    }
}

/// Checks `state`.
pub fn check(state: &State) -> Findings {
    let mut f = Findings {
        inputs: state.sent.len(),
        dead_letters: state.dead_letters.len(),
        left_in_queues: state.queued.len(),
        parked_dead_letters: state.parked.len(),
        drained: state.drained,
        unexpected_exits: state.exits.len(),
        stalled_faults: state.faults.iter().filter(|s| !s.recovered).count(),
        ..Findings::default()
    };
    for exit in &state.exits {
        f.note("unexpected_exits", exit.clone());
    }
    if !state.queued.is_empty() {
        let mut ids: Vec<&String> = state.queued.iter().collect();
        ids.sort();
        for id in ids.into_iter().take(5) {
            f.note(
                "left_in_queues",
                format!("{id} still queued after the gateways stopped"),
            );
        }
    }
    let dead = dead_letters_by_id(state, &mut f);
    let events = events_by_ordering_key(state);
    let sent_ids: HashSet<&str> = state.sent.iter().map(|s| s.id.as_str()).collect();
    let mut counter_done: BTreeMap<&str, u64> = BTreeMap::new();

    for sent in &state.sent {
        let id = sent.id.as_str();
        // A parked dead letter is dead-lettered too, only not archived yet.
        let dead_lettered = dead.get(&(sent.kind.route(), id)).copied().unwrap_or(0) > 0
            || state.parked.contains(id);
        let done = effect(state, sent, &mut f);
        let emitted = events
            .get(format!("{}/{id}", sent.kind.route()).as_str())
            .map_or(0, Vec::len);
        match (&sent.kind, done) {
            (Kind::PoisonTrap, Some(_)) if edited(state, id) => {}
            (Kind::PoisonJson | Kind::PoisonTrap, Some(_)) => {
                f.unexpected += 1;
                f.note("unexpected", format!("{id}: poison message took effect"));
            }
            (Kind::PoisonJson | Kind::PoisonTrap, None) => {
                if !dead_lettered {
                    missing(state, id, &mut f);
                }
            }
            (_, None) => {
                if dead_lettered {
                    f.unexpected += 1;
                    f.note(
                        "unexpected",
                        format!("{id}: a good message was dead-lettered"),
                    );
                } else {
                    missing(state, id, &mut f);
                }
            }
            (kind, Some(times)) => {
                if times > 1 {
                    f.duplicate_effects += 1;
                    f.note(
                        "duplicate_effects",
                        format!("{id}: effect applied {times} times"),
                    );
                }
                if dead_lettered {
                    f.unexpected += 1;
                    f.note(
                        "unexpected",
                        format!("{id}: took effect and was dead-lettered"),
                    );
                }
                let expected = match kind {
                    Kind::Enroll => ENROLL_EVENTS,
                    Kind::Counter { .. } | Kind::Batch { .. } => 1,
                    _ => 0,
                };
                f.compare(
                    &format!("{id}: outbox rows"),
                    emitted as u64,
                    expected as u64,
                );
                if let Kind::Counter { key } = kind {
                    *counter_done.entry(key.as_str()).or_default() += 1;
                }
            }
        }
    }
    check_counters(state, &counter_done, &mut f);
    check_unexpected_keys(state, &sent_ids, &mut f);
    check_downstream(state, &mut f);
    check_sink(state, &events, &mut f);
    check_poison_rows(state, &mut f);
    check_repairs(state, &mut f);
    f.large_rows = state
        .outbox
        .iter()
        .filter(|r| r.route == ROUTE_LARGE)
        .count();
    f
}

/// Every row the poison-row fault committed is parked: never published, one attempt, and
/// its error kept (docs/relay.md). Whether it held nothing else back the other checks say:
/// every other event must have taken effect.
fn check_poison_rows(state: &State, f: &mut Findings) {
    for row in state.outbox.iter().filter(|r| r.route == ROUTE_POISON) {
        f.poison_rows += 1;
        let error = row.last_error.as_deref().unwrap_or("");
        if row.published
            || row.attempts != 1
            || !error.starts_with("permanent: cannot be published")
        {
            f.poison_rows_not_parked += 1;
            f.note(
                "poison_rows_not_parked",
                format!(
                    "outbox row {} ({}): published {}, {} attempts, error {error:?}",
                    row.id, row.event_id, row.published, row.attempts
                ),
            );
        }
    }
}
