//! The outbox events: each upstream event took effect downstream once, and reached the sink
//! in order per key, with any duplicate copy inside a fault's window.

use std::collections::{HashMap, HashSet};

use super::{FaultSpan, Findings, OutboxRow, State};
use crate::config::NS_DOWNSTREAM;

/// Outbox rows of the upstream routes by ordering key (`route/message id`), in id order.
pub(super) fn events_by_ordering_key(state: &State) -> HashMap<&str, Vec<&OutboxRow>> {
    let mut by_key: HashMap<&str, Vec<&OutboxRow>> = HashMap::new();
    for row in &state.outbox {
        if row.is_upstream_event() {
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

/// Every published upstream event took effect downstream exactly once.
pub(super) fn check_downstream(state: &State, f: &mut Findings) {
    for row in state.outbox.iter().filter(|r| r.is_upstream_event()) {
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

/// Whether the copy at `at` of `row`, first sent at `first_at`, came after a fault that hit
/// the row confirmed and not yet marked: the fault began after the first copy, its window
/// holds this one, the row's mark committed only after the fault began, and a relay logged
/// a mark it could not write between the first copy and this one. (Up to the resend, not
/// the fault: a relay killed while its mark hangs never logs that mark; the store's trouble
/// shows in the marks that fail around it.) However long the mark was held up, the row was
/// in flight when the fault hit (G3 sends it again).
fn resent_unmarked(state: &State, row: &OutboxRow, first_at: u64, at: u64) -> bool {
    let campaign_ms = |unix_ms: i64| unix_ms - state.started_unix_ms;
    let Some(marked) = row.published_at.map(campaign_ms) else {
        return false;
    };
    let first = i64::try_from(first_at).unwrap_or(i64::MAX);
    state.faults.iter().any(|s| {
        let start = i64::try_from(s.start_ms).unwrap_or(i64::MAX);
        let (_, to) = window(state, s);
        first <= start
            && s.start_ms <= at
            && at <= to
            && marked > start
            && state.relay_logs.mark_troubles.iter().any(|t| {
                let logged = campaign_ms(t.at_unix_ms);
                first <= logged && logged <= i64::try_from(at).unwrap_or(i64::MAX)
            })
    })
}

/// Where a row's time went, on the campaign's clock: when it was committed and marked, and
/// its failed attempts.
fn row_story(state: &State, row: &OutboxRow) -> String {
    let at = |unix_ms: i64| (unix_ms - state.started_unix_ms) as f64 / 1e3;
    let marked = row
        .published_at
        .map_or("never marked published".to_owned(), |p| {
            format!("marked published at {:.1} s", at(p))
        });
    let marks = &state.relay_logs.mark_troubles;
    format!(
        "row {} committed at {:.1} s, {marked}, {} failed attempts{}; relays logged {} mark \
         troubles{}",
        row.id,
        at(row.created_at),
        row.attempts,
        row.last_error
            .as_deref()
            .map_or(String::new(), |e| format!(", last: {e}")),
        marks.len(),
        marks
            .first()
            .map_or(String::new(), |m| format!(", the first: {}", m.line))
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
pub(super) fn check_sink(state: &State, events: &HashMap<&str, Vec<&OutboxRow>>, f: &mut Findings) {
    let mut first: HashMap<&str, usize> = HashMap::new();
    // Events whose first copy was a redelivery: the broker took them back from a consumer
    // that never recorded them (a node failure), and redelivered them after later events.
    let mut first_redelivered: HashSet<&str> = HashSet::new();
    let mut copies: HashMap<&str, Vec<u64>> = HashMap::new();
    for (i, a) in state.sink.iter().enumerate() {
        let seen_before = first.contains_key(a.event_id.as_str());
        if seen_before && a.redelivered {
            continue;
        }
        if !seen_before && a.redelivered {
            first_redelivered.insert(a.event_id.as_str());
        }
        first.entry(a.event_id.as_str()).or_insert(i);
        copies.entry(a.event_id.as_str()).or_default().push(a.at_ms);
    }
    let upstream: HashMap<&str, &OutboxRow> = state
        .outbox
        .iter()
        .filter(|r| r.is_upstream_event())
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
            if state.relay_logs.confirm_timeouts.contains(*id) {
                f.duplicate_events_after_confirm_timeout += 1;
                continue;
            }
            let mut windows = state.faults.iter().map(|s| window(state, s));
            if windows.any(|(from, to)| from <= first_at && at <= to) {
                f.duplicate_events_within_window += 1;
            } else if state.relay_logs.failed_publishes.contains(*id)
                && state
                    .faults
                    .iter()
                    .map(|s| window(state, s))
                    .any(|(from, to)| from <= first_at && first_at <= to)
            {
                f.duplicate_events_after_failed_publishes += 1;
            } else if resent_unmarked(state, upstream[id], first_at, at) {
                f.duplicate_events_after_delayed_mark += 1;
            } else {
                f.duplicate_events_beyond_window += 1;
                f.note(
                    "duplicate_events_beyond_window",
                    format!(
                        "event {id}: first copy at {:.1} s, another at {:.1} s, no fault's \
                         window holds both ({})",
                        first_at as f64 / 1e3,
                        at as f64 / 1e3,
                        row_story(state, upstream[id])
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
    f.order_unobservable = first_redelivered.len();
    for (key, rows) in events {
        let arrived: Vec<usize> = rows
            .iter()
            .filter(|r| !first_redelivered.contains(r.event_id.as_str()))
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
