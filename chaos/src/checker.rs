//! The checker: from what was sent, the final database state, what is still queued, what
//! the sink saw arrive and when the faults were, count what was lost, duplicated or
//! unexpected. Pure, so its self-test can feed it a state with known defects.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::workload::{Kind, Sent};

/// Routes (also their queues) and plugin namespaces of the campaign's config.
pub const ROUTE_ENROLL: &str = "chaos-enroll";
pub const ROUTE_COUNTER: &str = "chaos-counter";
pub const ROUTE_FLAKY: &str = "chaos-flaky";
pub const ROUTE_DOWNSTREAM: &str = "chaos-downstream";
pub const NS_ENROLL: &str = "enrollment";
pub const NS_COUNTER: &str = "counter";
pub const NS_FLAKY: &str = "mixed";
pub const NS_DOWNSTREAM: &str = "downstream";

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

/// When a fault was active, from injection to healing.
#[derive(Debug, Clone)]
pub struct FaultSpan {
    pub start_ms: u64,
    pub healed_ms: u64,
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
    /// Message ids found in a queue (work queue, retry tier or DLQ) by the final drain.
    pub queued: HashSet<String>,
    /// The sink's arrivals, in arrival order.
    pub sink: Vec<Arrival>,
    pub faults: Vec<FaultSpan>,
    /// How long after a fault a relay may still republish what it had in flight: the
    /// relay lease plus the publish timeout, with margin.
    pub window_ms: u64,
}

/// What the checker found. The first six counts must be zero.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Findings {
    pub inputs: usize,
    pub lost: usize,
    pub duplicate_effects: usize,
    pub unexpected: usize,
    pub dead_letters_without_reason: usize,
    pub order_violations: usize,
    pub duplicate_events_beyond_window: usize,
    pub duplicate_events_within_window: usize,
    pub events: usize,
    pub dead_letters: usize,
    /// Inputs still in a queue after the drain (neither done nor lost).
    pub still_queued: usize,
    /// Dead-letter rows beyond one per confirmed publish of the message: the gateway's
    /// dead-lettering and the archiver are at least once.
    pub repeated_dead_letters: usize,
    /// Up to a few examples per failing kind, for the report.
    pub examples: BTreeMap<String, Vec<String>>,
}

impl Findings {
    /// No loss, no duplicate effect, nothing unexpected, reasons everywhere, order kept, and
    /// duplicate events only within a fault's window.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.duplicate_effects == 0
            && self.unexpected == 0
            && self.dead_letters_without_reason == 0
            && self.order_violations == 0
            && self.duplicate_events_beyond_window == 0
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
        ..Findings::default()
    };
    let dead = dead_letters_by_id(state, &mut f);
    let events = events_by_ordering_key(state);
    let sent_ids: HashSet<&str> = state.sent.iter().map(|s| s.id.as_str()).collect();
    let mut counter_done: BTreeMap<&str, u64> = BTreeMap::new();

    for sent in &state.sent {
        let id = sent.id.as_str();
        let dead_lettered = dead.get(&(sent.kind.route(), id)).copied().unwrap_or(0) > 0;
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

/// An input with no effect and no dead letter: still queued, or lost.
fn missing(state: &State, id: &str, f: &mut Findings) {
    if state.queued.contains(id) {
        f.still_queued += 1;
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

/// Duplicate publishes (inside or beyond a fault's window), events the sink never saw, events
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
        if times.len() > 1 {
            let (lo, hi) = (times[0], times[times.len() - 1]);
            let near_fault = state
                .faults
                .iter()
                .any(|s| s.start_ms <= hi && s.healed_ms + state.window_ms >= lo);
            if near_fault {
                f.duplicate_events_within_window += times.len() - 1;
            } else {
                f.duplicate_events_beyond_window += times.len() - 1;
                f.note(
                    "duplicate_events_beyond_window",
                    format!("event {id} published {} times, no fault near", times.len()),
                );
            }
        }
    }
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
        s.sink.push(Arrival {
            event_id: "ev-1".into(),
            at_ms: 5_000,
            redelivered: false,
        });
        let f = check(&s);
        assert_eq!(f.duplicate_events_beyond_window, 1, "{f:#?}");
        s.faults.push(FaultSpan {
            start_ms: 3_000,
            healed_ms: 3_500,
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
}
