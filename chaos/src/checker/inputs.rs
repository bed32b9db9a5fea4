//! What the inputs did: how many times each one's effect was applied, its dead letters, the
//! hot counters against the messages that took effect, and kv keys or inbox records for
//! nothing sent.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Findings, State};
use crate::config::{NS_BATCH, NS_COUNTER, NS_DOWNSTREAM, NS_ENROLL, NS_FLAKY, ROUTE_DOWNSTREAM};
use crate::workload::{Kind, Sent};

/// How many times `sent`'s effect was applied (`None`: never).
pub(super) fn effect(state: &State, sent: &Sent, f: &mut Findings) -> Option<u64> {
    let kv = |ns: &str, key: String| state.kv.get(&(ns.to_owned(), key));
    match &sent.kind {
        Kind::Enroll => kv(NS_ENROLL, format!("matricula/{}", sent.number)).map(|_| 1),
        Kind::Counter { .. } => times(kv(NS_COUNTER, format!("seen/{}", sent.id))),
        Kind::Batch { .. } => times(kv(NS_BATCH, format!("done/{}", sent.id))),
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

/// A count kept in kv: how many times an effect was applied (`None`: never).
fn times(value: Option<&String>) -> Option<u64> {
    value
        .map(|v| v.trim().parse::<u64>().unwrap_or(u64::MAX))
        .filter(|&n| n > 0)
}

/// An input with no effect and no dead letter: still queued, never confirmed, or lost.
pub(super) fn missing(state: &State, id: &str, f: &mut Findings) {
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

pub(super) fn dead_letters_by_id<'a>(
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
        // A replayed or edited copy that came back is a dead letter of its own, no repeat.
        if dl.replay_of.is_some() {
            continue;
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

/// Each hot counter equals the number of its messages that took effect; `runs` their total.
pub(super) fn check_counters(state: &State, done: &BTreeMap<&str, u64>, f: &mut Findings) {
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
        f.compare(
            &format!("counter/{key}"),
            read(format!("counter/{key}")),
            expected,
        );
    }
    f.compare("runs", read("runs".to_owned()), total);
}

/// kv keys and inbox records for messages never sent.
pub(super) fn check_unexpected_keys(state: &State, sent_ids: &HashSet<&str>, f: &mut Findings) {
    let numbers: HashSet<String> = state.sent.iter().map(|s| s.number.to_string()).collect();
    let event_ids: HashSet<&str> = state.outbox.iter().map(|r| r.event_id.as_str()).collect();
    for (ns, key) in state.kv.keys() {
        let known = match (ns.as_str(), key.split_once('/')) {
            (NS_ENROLL, Some(("matricula", n))) => numbers.contains(n),
            (NS_COUNTER, Some(("seen", id))) => sent_ids.contains(id),
            (NS_COUNTER, Some(("counter", _))) | (NS_COUNTER | NS_DOWNSTREAM, None) => true,
            (NS_FLAKY | NS_BATCH, Some(("done", id))) => sent_ids.contains(id),
            (NS_BATCH, Some(("batch-len", id))) => sent_ids.contains(id),
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
