//! The checker: from what was sent, the final database state, what is still queued, what
//! the sink saw arrive and when the faults were, count what was lost, duplicated or
//! unexpected. Pure, so its self-test can feed it a state with known defects.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::config::{NS_COUNTER, NS_DOWNSTREAM, NS_ENROLL, NS_FLAKY, ROUTE_DOWNSTREAM};
use crate::workload::{Kind, Sent};

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
}

/// One `dead_letters` row.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub route: String,
    pub message_id: Option<String>,
    pub reason: String,
}

/// One copy of an event that reached the sink queue.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub event_id: String,
    pub at_ms: u64,
    /// The broker's redelivered flag: a copy the sink saw before its ack was lost, not a
    /// second publish.
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
    /// Everything drained (queues, outbox, downstream, sink) within the bound.
    pub drained: bool,
    /// Processes that exited without being killed.
    pub exits: Vec<String>,
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
    /// A copy with no fault whose window holds both it and the event's first copy.
    pub duplicate_events_beyond_window: usize,
    pub duplicate_events_within_window: usize,
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
                    Kind::Counter { .. } => 1,
                    _ => 0,
                };
                if emitted > expected {
                    f.duplicate_effects += 1;
                    f.note(
                        "duplicate_effects",
                        format!("{id}: {emitted} outbox rows, expected {expected}"),
                    );
                } else if emitted < expected {
                    f.lost += 1;
                    f.note(
                        "lost",
                        format!("{id}: {emitted} outbox rows, expected {expected}"),
                    );
                }
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
    f
}

/// How many times `sent`'s effect was applied (`None`: never).
fn effect(state: &State, sent: &Sent, f: &mut Findings) -> Option<u64> {
    let kv = |ns: &str, key: String| state.kv.get(&(ns.to_owned(), key));
    match &sent.kind {
        Kind::Enroll => kv(NS_ENROLL, format!("matricula/{}", sent.number)).map(|_| 1),
        Kind::Counter { .. } => kv(NS_COUNTER, format!("seen/{}", sent.id))
            .map(|v| v.trim().parse::<u64>().unwrap_or(u64::MAX))
            .filter(|&n| n > 0),
        Kind::Flaky { until } => kv(NS_FLAKY, format!("done/{}", sent.id)).map(|attempt| {
            let attempt: u32 = attempt.trim().parse().unwrap_or(0);
            if attempt < *until {
                f.unexpected += 1;
                f.note(
                    "unexpected",
                    format!("{}: acked at attempt {attempt}, before {until}", sent.id),
                );
            }
            1
        }),
        Kind::PoisonJson => kv(NS_ENROLL, format!("matricula/{}", sent.number)).map(|_| 1),
        Kind::PoisonTrap => kv(NS_FLAKY, format!("done/{}", sent.id)).map(|_| 1),
    }
}

/// An input with no effect and no dead letter: still queued, never confirmed, or lost.
fn missing(state: &State, id: &str, f: &mut Findings) {
    if state.queued.contains(id) {
        f.still_queued += 1;
        f.note("still_queued", format!("{id}: no effect, still queued"));
    } else if state.unconfirmed.contains(id) {
        // Every publish of it timed out: the broker may never have taken it.
        f.unconfirmed_without_effect += 1;
    } else {
        f.lost += 1;
        f.note(
            "lost",
            format!("{id}: no effect, no dead letter, not queued"),
        );
    }
}

fn dead_letters_by_id<'a>(
    state: &'a State,
    f: &mut Findings,
) -> HashMap<(&'a str, &'a str), usize> {
    let mut by_id: HashMap<(&str, &str), usize> = HashMap::new();
    for dl in &state.dead_letters {
        if dl.reason.trim().is_empty() {
            f.dead_letters_without_reason += 1;
            f.note(
                "dead_letters_without_reason",
                format!("{:?} on {}", dl.message_id, dl.route),
            );
        }
        match &dl.message_id {
            Some(id) => *by_id.entry((dl.route.as_str(), id.as_str())).or_default() += 1,
            None => {
                f.unexpected += 1;
                f.note(
                    "unexpected",
                    format!("a dead letter on {} without a message id", dl.route),
                );
            }
        }
    }
    f.repeated_dead_letters = by_id
        .iter()
        .map(|((_, id), n)| n.saturating_sub(state.publishes.get(*id).map_or(1, |&p| p as usize)))
        .sum();
    by_id
}

/// Outbox rows of the upstream routes by ordering key (`route/message id`), in id order.
fn events_by_ordering_key(state: &State) -> HashMap<&str, Vec<&OutboxRow>> {
    let mut by_key: HashMap<&str, Vec<&OutboxRow>> = HashMap::new();
    for row in &state.outbox {
        if row.route != ROUTE_DOWNSTREAM {
            by_key
                .entry(row.ordering_key.as_str())
                .or_default()
                .push(row);
        }
    }
    for rows in by_key.values_mut() {
        rows.sort_by_key(|r| r.id);
    }
    by_key
}

/// Each hot counter equals the number of its messages that took effect; `runs` their total.
fn check_counters(state: &State, done: &BTreeMap<&str, u64>, f: &mut Findings) {
    let read = |key: String| {
        state
            .kv
            .get(&(NS_COUNTER.to_owned(), key))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut total = 0;
    for (key, &expected) in done {
        total += expected;
        compare(
            &format!("counter/{key}"),
            read(format!("counter/{key}")),
            expected,
            f,
        );
    }
    compare("runs", read("runs".to_owned()), total, f);
}

fn compare(what: &str, actual: u64, expected: u64, f: &mut Findings) {
    if actual > expected {
        f.duplicate_effects += 1;
        f.note(
            "duplicate_effects",
            format!("{what} = {actual}, expected {expected}"),
        );
    } else if actual < expected {
        f.lost += 1;
        f.note("lost", format!("{what} = {actual}, expected {expected}"));
    }
}

/// kv keys and inbox records for messages never sent.
fn check_unexpected_keys(state: &State, sent_ids: &HashSet<&str>, f: &mut Findings) {
    let numbers: HashSet<String> = state.sent.iter().map(|s| s.number.to_string()).collect();
    let event_ids: HashSet<&str> = state.outbox.iter().map(|r| r.event_id.as_str()).collect();
    for (ns, key) in state.kv.keys() {
        let known = match (ns.as_str(), key.split_once('/')) {
            (NS_ENROLL, Some(("matricula", n))) => numbers.contains(n),
            (NS_COUNTER, Some(("seen", id))) => sent_ids.contains(id),
            (NS_COUNTER, Some(("counter", _))) | (NS_COUNTER | NS_DOWNSTREAM, None) => true,
            (NS_FLAKY, Some(("done", id))) => sent_ids.contains(id),
            (NS_DOWNSTREAM, Some(("seen", id))) => event_ids.contains(id),
            _ => false,
        };
        if !known {
            f.unexpected += 1;
            f.note("unexpected", format!("kv {ns}/{key} for nothing sent"));
        }
    }
    for (route, key) in &state.inbox {
        let known = if route == ROUTE_DOWNSTREAM {
            event_ids.contains(key.as_str())
        } else {
            sent_ids.contains(key.as_str())
        };
        if !known {
            f.unexpected += 1;
            f.note(
                "unexpected",
                format!("inbox {route}/{key} for nothing sent"),
            );
        }
    }
}

/// Every published upstream event took effect downstream exactly once.
fn check_downstream(state: &State, f: &mut Findings) {
    for row in state.outbox.iter().filter(|r| r.route != ROUTE_DOWNSTREAM) {
        f.events += 1;
        let seen = state
            .kv
            .get(&(NS_DOWNSTREAM.to_owned(), format!("seen/{}", row.event_id)))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if seen > 1 {
            f.duplicate_effects += 1;
            f.note(
                "duplicate_effects",
                format!("event {} applied {seen} times downstream", row.event_id),
            );
        } else if seen == 0 {
            if state.queued.contains(&row.event_id) {
                f.still_queued += 1;
                f.note(
                    "still_queued",
                    format!("event {}: no effect downstream, still queued", row.event_id),
                );
            } else {
                f.lost += 1;
                let how = if row.published {
                    "published"
                } else {
                    "never published"
                };
                f.note(
                    "lost",
                    format!(
                        "event {} ({how}) never took effect downstream",
                        row.event_id
                    ),
                );
            }
        }
    }
}

/// The time around fault `s` in which a duplicate publish is what at-least-once allows:
/// from `lead_ms` before it (a copy in flight when it hit) to `window_ms` after progress
/// resumed (the lease of what a dead relay held, then its republish).
fn window(state: &State, s: &FaultSpan) -> (u64, u64) {
    (
        s.start_ms.saturating_sub(state.lead_ms),
        s.end_ms + state.window_ms,
    )
}

/// Time from 0 to the last arrival that no fault's window covers.
fn outside_windows(state: &State) -> u64 {
    let end = state.sink.iter().map(|a| a.at_ms).max().unwrap_or(0);
    let mut spans: Vec<(u64, u64)> = state.faults.iter().map(|s| window(state, s)).collect();
    spans.sort_unstable();
    let (mut covered, mut reach) = (0, 0);
    for (from, to) in spans {
        let (from, to) = (from.max(reach).min(end), to.min(end));
        if to > from {
            covered += to - from;
            reach = to;
        }
    }
    end - covered
}

/// Duplicate publishes (each copy judged by the fault windows), events the sink never saw, events
/// nobody emitted, and per-key order of first arrivals.
fn check_sink(state: &State, events: &HashMap<&str, Vec<&OutboxRow>>, f: &mut Findings) {
    let mut first: HashMap<&str, usize> = HashMap::new();
    let mut copies: HashMap<&str, Vec<u64>> = HashMap::new();
    for (i, a) in state.sink.iter().enumerate() {
        let seen_before = first.contains_key(a.event_id.as_str());
        if seen_before && a.redelivered {
            continue;
        }
        first.entry(a.event_id.as_str()).or_insert(i);
        copies.entry(a.event_id.as_str()).or_default().push(a.at_ms);
    }
    let upstream: HashMap<&str, &OutboxRow> = state
        .outbox
        .iter()
        .filter(|r| r.route != ROUTE_DOWNSTREAM)
        .map(|r| (r.event_id.as_str(), r))
        .collect();
    for (id, times) in &copies {
        if !upstream.contains_key(id) {
            f.unexpected += 1;
            f.note(
                "unexpected",
                format!("event {id} reached the sink but is in no outbox"),
            );
            continue;
        }
        let first_at = times[0];
        for &at in &times[1..] {
            if state
                .faults
                .iter()
                .map(|s| window(state, s))
                .any(|(from, to)| from <= first_at && at <= to)
            {
                f.duplicate_events_within_window += 1;
            } else {
                f.duplicate_events_beyond_window += 1;
                f.note(
                    "duplicate_events_beyond_window",
                    format!(
                        "event {id}: first copy at {:.1} s, another at {:.1} s, no fault's \
                         window holds both",
                        first_at as f64 / 1e3,
                        at as f64 / 1e3
                    ),
                );
            }
        }
    }
    f.ms_outside_windows = outside_windows(state);
    for row in upstream.values() {
        if row.published && !first.contains_key(row.event_id.as_str()) {
            f.lost += 1;
            f.note(
                "lost",
                format!(
                    "event {} marked published, never reached the sink",
                    row.event_id
                ),
            );
        }
    }
    for (key, rows) in events {
        let arrived: Vec<usize> = rows
            .iter()
            .filter_map(|r| first.get(r.event_id.as_str()).copied())
            .collect();
        if arrived.windows(2).any(|w| w[0] > w[1]) {
            f.order_violations += 1;
            f.note(
                "order_violations",
                format!("{key}: events arrived out of order"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ROUTE_COUNTER, ROUTE_ENROLL, ROUTE_FLAKY};

    fn sent(number: u64, kind: Kind) -> Sent {
        Sent::new(number, kind)
    }

    fn kv(state: &mut State, ns: &str, key: &str, value: &str) {
        state.kv.insert((ns.into(), key.into()), value.into());
    }

    fn event(state: &mut State, id: i64, route: &str, source: &str, at_ms: u64) -> String {
        let event_id = format!("ev-{id}");
        state.outbox.push(OutboxRow {
            id,
            event_id: event_id.clone(),
            route: route.into(),
            ordering_key: format!("{route}/{source}"),
            published: true,
        });
        kv(state, NS_DOWNSTREAM, &format!("seen/{event_id}"), "1");
        state.sink.push(Arrival {
            event_id: event_id.clone(),
            at_ms,
            redelivered: false,
        });
        event_id
    }

    /// One enrollment, two counter messages on one key, one flaky and one poison message,
    /// every effect once.
    fn clean() -> State {
        let mut s = State {
            window_ms: 1_000,
            lead_ms: 500,
            drained: true,
            ..State::default()
        };
        let enroll = sent(1, Kind::Enroll);
        let c1 = sent(2, Kind::Counter { key: "hot".into() });
        let c2 = sent(3, Kind::Counter { key: "hot".into() });
        let flaky = sent(4, Kind::Flaky { until: 3 });
        let poison = sent(5, Kind::PoisonJson);
        kv(&mut s, NS_ENROLL, "matricula/1", "{}");
        for i in 0..3 {
            event(&mut s, 1 + i, ROUTE_ENROLL, &enroll.id, 10 + i as u64);
        }
        for (i, c) in [&c1, &c2].into_iter().enumerate() {
            kv(&mut s, NS_COUNTER, &format!("seen/{}", c.id), "1");
            event(&mut s, 10 + i as i64, ROUTE_COUNTER, &c.id, 20);
        }
        kv(&mut s, NS_COUNTER, "counter/hot", "2");
        kv(&mut s, NS_COUNTER, "runs", "2");
        kv(&mut s, NS_FLAKY, &format!("done/{}", flaky.id), "3");
        s.dead_letters.push(DeadLetter {
            route: ROUTE_ENROLL.into(),
            message_id: Some(poison.id.clone()),
            reason: "invalid matricula.confirmada: expected value".into(),
        });
        for x in [&enroll, &c1, &c2, &flaky, &poison] {
            s.inbox.insert((x.kind.route().into(), x.id.clone()));
        }
        s.sent = vec![enroll, c1, c2, flaky, poison];
        s
    }

    #[test]
    fn a_clean_state_passes() {
        let f = check(&clean());
        assert!(f.passed(), "{f:#?}");
        assert_eq!((f.inputs, f.events, f.dead_letters), (5, 5, 1));
    }

    #[test]
    fn one_lost_message_and_one_duplicate_effect_are_both_reported() {
        let mut s = clean();
        // The second counter message's effects vanished (and its event with them)...
        let lost = s.sent[2].id.clone();
        s.kv.remove(&(NS_COUNTER.into(), format!("seen/{lost}")));
        s.kv.insert((NS_COUNTER.into(), "counter/hot".into()), "1".into());
        s.kv.insert((NS_COUNTER.into(), "runs".into()), "1".into());
        s.outbox
            .retain(|r| r.ordering_key != format!("{ROUTE_COUNTER}/{lost}"));
        s.sink.retain(|a| a.event_id != "ev-11");
        s.kv.remove(&(NS_DOWNSTREAM.into(), "seen/ev-11".into()));
        // ...and the first one's applied twice.
        let twice = s.sent[1].id.clone();
        s.kv.insert((NS_COUNTER.into(), format!("seen/{twice}")), "2".into());
        let f = check(&s);
        assert!(!f.passed());
        assert_eq!(f.lost, 1, "{f:#?}");
        assert_eq!(f.duplicate_effects, 1, "{f:#?}");
        assert!(f.examples["lost"][0].contains(&lost), "{f:#?}");
        assert!(
            f.examples["duplicate_effects"][0].contains(&twice),
            "{f:#?}"
        );
    }

    #[test]
    fn a_queued_message_is_not_lost_and_an_unsent_effect_is_unexpected() {
        let mut s = clean();
        let flaky = s.sent[3].id.clone();
        s.kv.remove(&(NS_FLAKY.into(), format!("done/{flaky}")));
        s.queued.insert(flaky);
        kv(&mut s, NS_ENROLL, "matricula/999", "{}");
        let f = check(&s);
        assert_eq!((f.lost, f.still_queued, f.unexpected), (0, 1, 1), "{f:#?}");
    }

    #[test]
    fn counters_above_their_messages_are_duplicates() {
        let mut s = clean();
        kv(&mut s, NS_COUNTER, "counter/hot", "3");
        assert_eq!(check(&s).duplicate_effects, 1);
    }

    #[test]
    fn duplicate_events_are_judged_by_the_fault_window() {
        let mut s = clean();
        s.sink[0].at_ms = 2_800;
        s.sink.push(Arrival {
            event_id: "ev-1".into(),
            at_ms: 4_400,
            redelivered: false,
        });
        let f = check(&s);
        assert_eq!(f.duplicate_events_beyond_window, 1, "{f:#?}");
        s.faults.push(FaultSpan {
            start_ms: 3_000,
            end_ms: 3_500,
            recovered: true,
        });
        let f = check(&s);
        assert_eq!(
            (
                f.duplicate_events_beyond_window,
                f.duplicate_events_within_window
            ),
            (0, 1)
        );
        assert!(f.passed());
        // A redelivery to the sink itself (its ack was lost) is not a second publish.
        s.faults.clear();
        s.sink.last_mut().expect("arrival").redelivered = true;
        assert!(check(&s).passed());
    }

    #[test]
    fn out_of_order_events_and_reasonless_dead_letters_fail() {
        let mut s = clean();
        s.sink.swap(0, 1);
        s.dead_letters[0].reason = " ".into();
        let f = check(&s);
        assert_eq!((f.order_violations, f.dead_letters_without_reason), (1, 1));
    }

    #[test]
    fn a_poison_message_published_twice_may_be_dead_lettered_twice() {
        let mut s = clean();
        let poison = s.sent[4].id.clone();
        s.dead_letters.push(s.dead_letters[0].clone());
        assert_eq!(check(&s).repeated_dead_letters, 1);
        s.publishes.insert(poison, 2);
        let f = check(&s);
        assert_eq!(f.repeated_dead_letters, 0);
        assert!(f.passed());
    }

    #[test]
    fn a_good_message_dead_lettered_is_unexpected() {
        let mut s = clean();
        let flaky = s.sent[3].id.clone();
        s.kv.remove(&(NS_FLAKY.into(), format!("done/{flaky}")));
        s.dead_letters.push(DeadLetter {
            route: ROUTE_FLAKY.into(),
            message_id: Some(flaky),
            reason: "store unavailable".into(),
        });
        let f = check(&s);
        assert_eq!((f.unexpected, f.lost), (1, 0), "{f:#?}");
    }

    fn fault(start_ms: u64, end_ms: u64) -> FaultSpan {
        FaultSpan {
            start_ms,
            end_ms,
            recovered: true,
        }
    }

    fn copy(s: &mut State, event_id: &str, at_ms: u64) {
        s.sink.push(Arrival {
            event_id: event_id.into(),
            at_ms,
            redelivered: false,
        });
    }

    /// Faults every 2 s, whose windows (1 s after, 0.5 s before) overlap into one stretch:
    /// the old "any fault between the first and the last copy" rule passed every duplicate
    /// in it. Each copy now needs one fault whose window holds it and the first copy.
    #[test]
    fn a_duplicate_spread_over_several_faults_windows_fails_even_when_they_overlap() {
        let mut s = clean();
        s.faults = (0..20)
            .map(|i| fault(10_000 + i * 2_000, 10_500 + i * 2_000))
            .collect();
        s.sink[0].at_ms = 10_200;
        copy(&mut s, "ev-1", 40_100);
        let f = check(&s);
        assert_eq!(f.duplicate_events_beyond_window, 1, "{f:#?}");
        assert!(!f.passed());
        assert!(f.examples["duplicate_events_beyond_window"][0].contains("ev-1"));
        // The same copy soon after the first, in one fault's window, is at least once.
        s.sink.last_mut().expect("copy").at_ms = 11_400;
        let f = check(&s);
        assert_eq!(
            (
                f.duplicate_events_beyond_window,
                f.duplicate_events_within_window
            ),
            (0, 1),
            "{f:#?}"
        );
        assert!(f.passed());
    }

    #[test]
    fn a_duplicate_outside_every_window_fails_and_that_time_is_measured() {
        let mut s = clean();
        s.faults = vec![fault(1_000, 2_000), fault(20_000, 21_000)];
        s.sink[0].at_ms = 8_000;
        copy(&mut s, "ev-1", 9_000);
        let f = check(&s);
        assert_eq!(f.duplicate_events_beyond_window, 1, "{f:#?}");
        assert!(!f.passed());
        // 0..30 s, minus the windows 0.5..3 s and 19.5..22 s.
        s.sink.last_mut().expect("copy").at_ms = 30_000;
        assert_eq!(check(&s).ms_outside_windows, 30_000 - 2_500 - 2_500);
    }

    #[test]
    fn an_input_left_in_a_queue_fails_the_run() {
        let mut s = clean();
        let flaky = s.sent[3].id.clone();
        s.kv.remove(&(NS_FLAKY.into(), format!("done/{flaky}")));
        s.queued.insert(flaky);
        let f = check(&s);
        assert_eq!(
            (f.lost, f.still_queued, f.left_in_queues),
            (0, 1, 1),
            "{f:#?}"
        );
        assert!(!f.passed());
    }

    /// A redelivery of a finished message, still in its queue: the drain did not finish.
    #[test]
    fn any_message_left_in_a_queue_fails_the_run_even_with_its_effect_done() {
        let mut s = clean();
        s.queued.insert(s.sent[0].id.clone());
        let f = check(&s);
        assert_eq!((f.still_queued, f.left_in_queues), (0, 1), "{f:#?}");
        assert!(!f.passed());
    }

    #[test]
    fn an_event_with_no_downstream_effect_left_in_a_queue_fails_the_run() {
        let mut s = clean();
        s.kv.remove(&(NS_DOWNSTREAM.into(), "seen/ev-2".into()));
        s.queued.insert("ev-2".into());
        let f = check(&s);
        assert_eq!((f.lost, f.still_queued), (0, 1), "{f:#?}");
        assert!(!f.passed());
    }

    #[test]
    fn a_run_that_did_not_drain_fails() {
        let mut s = clean();
        s.drained = false;
        assert!(!check(&s).passed());
    }

    #[test]
    fn a_process_that_exited_on_its_own_fails_the_run() {
        let mut s = clean();
        s.exits
            .push("gateway-1 exited (exit status: 1) at 12.0 s".into());
        let f = check(&s);
        assert_eq!(f.unexpected_exits, 1);
        assert!(!f.passed());
    }

    #[test]
    fn a_fault_with_no_recovery_fails_the_run() {
        let mut s = clean();
        s.faults.push(FaultSpan {
            recovered: false,
            ..fault(1_000, 2_000)
        });
        let f = check(&s);
        assert_eq!(f.stalled_faults, 1);
        assert!(!f.passed());
    }

    /// The publisher gave up on a message whose publishes all timed out: the broker may never
    /// have had it, so no effect is not a loss. Once confirmed, it is.
    #[test]
    fn an_input_never_confirmed_with_no_effect_is_not_lost_but_a_confirmed_one_is() {
        let mut s = clean();
        let flaky = s.sent[3].id.clone();
        s.kv.remove(&(NS_FLAKY.into(), format!("done/{flaky}")));
        s.unconfirmed.insert(flaky.clone());
        let f = check(&s);
        assert_eq!((f.lost, f.unconfirmed_without_effect), (0, 1), "{f:#?}");
        assert!(f.passed());
        s.unconfirmed.clear();
        let f = check(&s);
        assert_eq!(f.lost, 1, "{f:#?}");
        assert!(!f.passed());
    }

    /// A poison input's dead letter parked in `Q.dlq.parked` is not lost, and is counted; a
    /// good input parked was dead-lettered, which is unexpected.
    #[test]
    fn parked_dead_letters_are_counted_not_lost_and_a_good_one_parked_fails() {
        let mut s = clean();
        let poison = s.sent[4].id.clone();
        s.dead_letters.clear();
        s.parked.insert(poison);
        let f = check(&s);
        assert_eq!((f.lost, f.parked_dead_letters), (0, 1), "{f:#?}");
        assert!(f.passed());
        let flaky = s.sent[3].id.clone();
        s.kv.remove(&(NS_FLAKY.into(), format!("done/{flaky}")));
        s.parked.insert(flaky);
        let f = check(&s);
        assert_eq!((f.unexpected, f.lost), (1, 0), "{f:#?}");
        assert!(!f.passed());
    }

    #[test]
    fn an_event_marked_published_that_never_reached_the_sink_is_lost() {
        let mut s = clean();
        s.sink.retain(|a| a.event_id != "ev-3");
        let f = check(&s);
        assert_eq!(f.lost, 1, "{f:#?}");
        assert!(!f.passed());
    }

    #[test]
    fn an_event_applied_twice_downstream_or_missing_there_fails() {
        let mut s = clean();
        kv(&mut s, NS_DOWNSTREAM, "seen/ev-2", "2");
        kv(&mut s, NS_DOWNSTREAM, "seen/ev-3", "0");
        let f = check(&s);
        assert_eq!((f.duplicate_effects, f.lost), (1, 1), "{f:#?}");
    }

    #[test]
    fn an_enrollment_with_too_few_or_too_many_outbox_rows_fails() {
        let mut s = clean();
        s.outbox.retain(|r| r.id != 3);
        s.sink.retain(|a| a.event_id != "ev-3");
        assert_eq!(check(&s).lost, 1);
        let mut s = clean();
        let enroll = s.sent[0].id.clone();
        event(&mut s, 4, ROUTE_ENROLL, &enroll, 30);
        assert_eq!(check(&s).duplicate_effects, 1);
    }

    #[test]
    fn a_transient_input_acked_too_early_or_a_poison_input_that_took_effect_is_unexpected() {
        let mut s = clean();
        let flaky = s.sent[3].id.clone();
        kv(&mut s, NS_FLAKY, &format!("done/{flaky}"), "2");
        assert_eq!(check(&s).unexpected, 1);
        let mut s = clean();
        kv(&mut s, NS_ENROLL, "matricula/5", "{}");
        assert_eq!(check(&s).unexpected, 1);
    }

    #[test]
    fn events_and_inbox_records_for_nothing_sent_are_unexpected() {
        let mut s = clean();
        s.inbox.insert((ROUTE_COUNTER.into(), "m-999".into()));
        copy(&mut s, "ev-999", 50);
        let f = check(&s);
        assert_eq!(f.unexpected, 2, "{f:#?}");
        assert!(!f.passed());
    }
}
