//! The campaign's summary: printed after every run, written as Markdown for full runs.

use std::collections::BTreeMap;
use std::fmt::{Display, Write};

use crate::campaign::Outcome;
use crate::faults::Fault;

/// Markdown: the setup, faults by kind with their longest recovery, and the checker's counts.
pub fn markdown(o: &Outcome, command: &str, date: &str) -> String {
    let mut s = String::new();
    let setup = format!(
        "{}{}",
        match o.backend {
            crate::campaign::Backend::Sqlite => {
                "SQLite, one gateway (its relay inside, immediate dispatch)"
            }
            crate::campaign::Backend::Postgres if o.cdc => {
                "PostgreSQL, two gateways and two CDC relays (one reads the slot, one stands by)"
            }
            crate::campaign::Backend::Postgres => {
                "PostgreSQL, two gateways (each with its relay inside, immediate dispatch) and two \
                 relay processes"
            }
        },
        if o.cluster {
            ", 3-node RabbitMQ cluster, quorum queues"
        } else {
            ", one RabbitMQ node"
        }
    );
    let _ = writeln!(s, "# Fault campaign: {setup}\n");
    let _ = writeln!(
        s,
        "{date}, seed {}, {:.0} s, `{command}`\n\nLoad average before the run \
         (`/proc/loadavg`): {}\n",
        o.seed,
        o.seconds,
        o.load_before.trim()
    );
    let _ = writeln!(
        s,
        "**Result: {}**\n",
        if o.passed() { "passed" } else { "FAILED" }
    );
    let _ = writeln!(
        s,
        "| fault | injected | longest recovery | throughput during it / without |\n\
         |---|---:|---:|---:|"
    );
    let mut by_kind: BTreeMap<Fault, (usize, Option<u64>, bool)> = BTreeMap::new();
    for f in &o.faults {
        let e = by_kind.entry(f.fault).or_insert((0, Some(0), true));
        e.0 += 1;
        match f.recovered_ms {
            Some(r) => e.1 = e.1.map(|m| m.max(r - f.healed_ms)),
            None => e.2 = false,
        }
    }
    for (fault, (n, longest, all)) in &by_kind {
        let longest = match (all, longest) {
            (true, Some(ms)) => format!("{:.2} s", *ms as f64 / 1e3),
            _ => "no recovery".to_owned(),
        };
        let during = o
            .rate_by_fault
            .iter()
            .find(|(k, _)| k == fault)
            .map_or("–".to_owned(), |(_, rate)| share(*rate, o.rate_quiet));
        let _ = writeln!(s, "| {} | {n} | {longest} | {during} |", fault.name());
    }
    let _ = writeln!(
        s,
        "| **all** | **{}** | | {} |\n",
        o.faults.len(),
        share(o.rate_faults, o.rate_quiet)
    );
    let f = &o.findings;
    // Each row shows its count with `Display`, so a row is its label and a reference.
    let rows: &[(&str, &dyn Display)] = &[
        ("inputs (distinct)", &f.inputs),
        (
            "messages published (with duplicates and unconfirmed resends)",
            &(o.published + o.republished),
        ),
        (
            "duplicates by message id published",
            &o.duplicates_published,
        ),
        ("events emitted", &f.events),
        ("dead letters", &f.dead_letters),
        ("**lost**", &f.lost),
        ("**duplicate effects**", &f.duplicate_effects),
        ("**unexpected**", &f.unexpected),
        (
            "**dead letters without a reason**",
            &f.dead_letters_without_reason,
        ),
        (
            "**per-key order violations downstream**",
            &f.order_violations,
        ),
        (
            "events whose first sink copy was a redelivery (their order not observable)",
            &f.order_unobservable,
        ),
        (
            "**duplicate events beyond a fault's window**",
            &f.duplicate_events_beyond_window,
        ),
        (
            "duplicate events within a fault's window",
            &f.duplicate_events_within_window,
        ),
        (
            "duplicate events resent after a relay's confirm timeout (at least once)",
            &f.duplicate_events_after_confirm_timeout,
        ),
        (
            "duplicate events resent after a fault, past its window by failed publishes' backoff (at least once)",
            &f.duplicate_events_after_failed_publishes,
        ),
        (
            "duplicate events resent after a fault that hit them confirmed and not yet marked, the store holding up their mark (at least once)",
            &f.duplicate_events_after_delayed_mark,
        ),
        (
            "dead letters archived twice (at least once)",
            &f.repeated_dead_letters,
        ),
        (
            "time outside every fault's window (a duplicate there fails)",
            &format!("{:.0} s", f.ms_outside_windows as f64 / 1e3),
        ),
        (
            "**inputs or events with no effect, still queued**",
            &f.still_queued,
        ),
        (
            "**messages left in a route's queues once the gateways stopped**",
            &f.left_in_queues,
        ),
        (
            "dead letters parked in `Q.dlq.parked` (not lost; `carteiro dlq unpark`)",
            &f.parked_dead_letters,
        ),
        (
            "inputs never confirmed by the broker, with no effect (not lost)",
            &f.unconfirmed_without_effect,
        ),
        ("unpublishable outbox rows committed", &f.poison_rows),
        (
            "rows of large outbox transactions (checked as every event)",
            &f.large_rows,
        ),
        (
            "**of those, not parked once with their error**",
            &f.poison_rows_not_parked,
        ),
        (
            "dead letters replayed by concurrent replays / edited copies sent",
            &format!("{} / {}", f.dead_letters_replayed, f.edits_sent),
        ),
        (
            "**dead letters two concurrent edits both sent**",
            &f.edits_both_sent,
        ),
        (
            "**dead letters replayed or edited more than once**",
            &f.dead_letters_replayed_twice,
        ),
        ("**drained**", &o.drained),
        ("**faults with no recovery**", &f.stalled_faults),
        (
            "**processes that exited unprompted**",
            &o.unexpected_exits.len(),
        ),
        (
            "throughput during faults / without",
            &format!(
                "{:.0} / {:.0} commits/s = {:.0}%",
                o.rate_faults,
                o.rate_quiet,
                if o.rate_quiet > 0.0 {
                    100.0 * o.rate_faults / o.rate_quiet
                } else {
                    0.0
                }
            ),
        ),
    ];
    let _ = writeln!(s, "| checked | count |\n|---|---:|");
    for (what, n) in rows {
        let _ = writeln!(s, "| {what} | {n} |");
    }
    if !f.examples.is_empty() {
        let _ = writeln!(s, "\n## Examples\n");
        for (kind, list) in &f.examples {
            for e in list {
                let _ = writeln!(s, "- {kind}: {}", e.replace('\n', " "));
            }
        }
    }
    s
}

/// `rate` as a share of `quiet`, e.g. `54%`.
fn share(rate: f64, quiet: f64) -> String {
    if quiet > 0.0 {
        format!("{:.0}%", 100.0 * rate / quiet)
    } else {
        "–".to_owned()
    }
}
