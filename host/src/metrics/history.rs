//! The last hour of each route, a minute at a time, for the console's charts: deliveries by
//! outcome and dead letters by reason class, counted where the pipeline records them
//! (`Metrics::delivery`, `Metrics::dead_letter`).
//!
//! Memory is bounded: a route holds a ring of [`MINUTES`] one-minute buckets of fixed size
//! (about 10 KiB), reused as the minutes go by, whatever the traffic; at most [`MAX_ROUTES`]
//! routes are kept. Recording takes a read lock on the map of routes and the route's own
//! mutex, held for one increment. A minute nobody recorded into reads as zeros, so a series
//! always has [`MINUTES`] points. The clock is a parameter (`now_ms`), so tests move time.

use super::Metrics;
use crate::common::labels::{FailureKind, Outcome, ReasonClass};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError, RwLock};

/// Minutes kept per route: the console charts the last hour.
pub const MINUTES: usize = 60;
/// Routes kept at most; deliveries of further routes are not charted.
pub const MAX_ROUTES: usize = 1024;
const MINUTE_MS: i64 = 60_000;
const OUTCOMES: usize = Outcome::ALL.len();
/// Every reason class: the two of their own, then one per failure kind ([`class_index`]).
const CLASSES: usize = 2 + FailureKind::ALL.len();

/// One series of a chart: its name (a metric label) and one count per bucket, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Series {
    pub name: &'static str,
    pub counts: Vec<u64>,
}

/// A route's last hour, one point a minute, the current minute last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteHistory {
    /// Start of the first minute (unix ms).
    pub since_ms: i64,
    /// Deliveries settled per minute, one series per outcome (every outcome, in
    /// `Outcome::ALL` order), [`MINUTES`] counts each.
    pub outcomes: Vec<Series>,
    /// Dead letters per minute, one series per reason class that had any in the hour.
    pub dead_letters: Vec<Series>,
}

/// What one minute of one route counted.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Minutes since the epoch; `i64::MIN` for a bucket never used.
    minute: i64,
    outcomes: [u64; OUTCOMES],
    dead_letters: [u64; CLASSES],
}

const EMPTY: Bucket = Bucket {
    minute: i64::MIN,
    outcomes: [0; OUTCOMES],
    dead_letters: [0; CLASSES],
};

/// A route's [`MINUTES`] buckets: minute `m` lives in slot `m mod MINUTES`.
struct Ring {
    buckets: [Bucket; MINUTES],
}

impl Default for Ring {
    fn default() -> Self {
        Self {
            buckets: [EMPTY; MINUTES],
        }
    }
}

impl Ring {
    fn slot(minute: i64) -> usize {
        minute.rem_euclid(MINUTES as i64) as usize
    }

    /// The bucket of `minute`, emptied first if it held an older minute; `None` if it holds
    /// a newer one (the clock went back by an hour or more): that count is dropped.
    fn at(&mut self, minute: i64) -> Option<&mut Bucket> {
        let bucket = &mut self.buckets[Self::slot(minute)];
        if bucket.minute < minute {
            *bucket = Bucket { minute, ..EMPTY };
        }
        (bucket.minute == minute).then_some(bucket)
    }

    /// What `minute` counted (zeros if nothing, or if its slot moved on).
    fn get(&self, minute: i64) -> Bucket {
        let bucket = self.buckets[Self::slot(minute)];
        if bucket.minute == minute {
            bucket
        } else {
            EMPTY
        }
    }
}

/// Every route's last hour.
#[derive(Default)]
pub struct DeliveryHistory {
    routes: RwLock<HashMap<String, Mutex<Ring>>>,
}

impl DeliveryHistory {
    /// A delivery on `route` was settled with `outcome` at `now_ms`.
    pub fn delivery(&self, route: &str, outcome: Outcome, now_ms: i64) {
        self.record(route, now_ms, |b| b.outcomes[outcome as usize] += 1);
    }

    /// A delivery on `route` was dead-lettered for `class` at `now_ms`.
    pub fn dead_letter(&self, route: &str, class: ReasonClass, now_ms: i64) {
        self.record(route, now_ms, |b| b.dead_letters[class_index(class)] += 1);
    }

    /// `count` into the bucket of `route` for the minute of `now_ms`.
    fn record(&self, route: &str, now_ms: i64, count: impl FnOnce(&mut Bucket)) {
        let minute = now_ms.div_euclid(MINUTE_MS);
        {
            let routes = self.routes.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(ring) = routes.get(route) {
                let mut ring = ring.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(bucket) = ring.at(minute) {
                    count(bucket);
                }
                return;
            }
        }
        // A route's first delivery (or a race with another first one).
        let mut routes = self.routes.write().unwrap_or_else(PoisonError::into_inner);
        if routes.len() >= MAX_ROUTES && !routes.contains_key(route) {
            return;
        }
        let ring = routes.entry(route.to_owned()).or_default();
        let ring = ring.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(bucket) = ring.at(minute) {
            count(bucket);
        }
    }

    /// The hour of `route` up to the minute of `now_ms` (that minute last).
    pub fn last_hour(&self, route: &str, now_ms: i64) -> RouteHistory {
        let minute = now_ms.div_euclid(MINUTE_MS);
        let first = minute - (MINUTES as i64 - 1);
        let buckets: Vec<Bucket> = {
            let routes = self.routes.read().unwrap_or_else(PoisonError::into_inner);
            match routes.get(route) {
                Some(ring) => {
                    let ring = ring.lock().unwrap_or_else(PoisonError::into_inner);
                    (first..=minute).map(|m| ring.get(m)).collect()
                }
                None => vec![EMPTY; MINUTES],
            }
        };
        let outcomes = Outcome::ALL
            .iter()
            .map(|outcome| Series {
                name: outcome.label(),
                counts: buckets
                    .iter()
                    .map(|b| b.outcomes[*outcome as usize])
                    .collect(),
            })
            .collect();
        let dead_letters = classes()
            .map(|class| Series {
                name: class.label(),
                counts: buckets
                    .iter()
                    .map(|b| b.dead_letters[class_index(class)])
                    .collect(),
            })
            .filter(|series| series.counts.iter().any(|n| *n > 0))
            .collect();
        RouteHistory {
            since_ms: first * MINUTE_MS,
            outcomes,
            dead_letters,
        }
    }

    /// How many routes are kept (for tests).
    #[cfg(test)]
    fn routes(&self) -> usize {
        self.routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Every reason class: the handler's verdict, the attempt limit, then each failure kind.
fn classes() -> impl Iterator<Item = ReasonClass> {
    [ReasonClass::Handler, ReasonClass::RetriesExhausted]
        .into_iter()
        .chain(FailureKind::ALL.iter().map(|kind| ReasonClass::Kind(*kind)))
}

/// Where a bucket counts `class`: below [`CLASSES`], one place per class.
fn class_index(class: ReasonClass) -> usize {
    match class {
        ReasonClass::Handler => 0,
        ReasonClass::RetriesExhausted => 1,
        ReasonClass::Kind(kind) => 2 + kind as usize,
    }
}

impl Metrics {
    /// `route`'s last hour up to the minute of `now_ms`, for the console's charts.
    pub fn last_hour(&self, route: &str, now_ms: i64) -> RouteHistory {
        self.history.last_hour(route, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10:00:00 on some day, in unix ms: a whole minute.
    const T0: i64 = 1_767_261_600_000;

    fn at(minutes: i64, seconds: i64) -> i64 {
        T0 + minutes * MINUTE_MS + seconds * 1000
    }

    fn series<'h>(history: &'h [Series], name: &str) -> &'h [u64] {
        &history
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no series {name}: {history:?}"))
            .counts
    }

    #[test]
    fn buckets_rotate_with_the_clock() {
        let h = DeliveryHistory::default();
        for _ in 0..3 {
            h.delivery("q", Outcome::Acked, at(0, 5));
        }
        h.delivery("q", Outcome::Acked, at(0, 59));
        h.delivery("q", Outcome::Retried, at(1, 0));
        h.delivery("q", Outcome::Retried, at(1, 30));
        h.delivery("other", Outcome::Acked, at(1, 30));

        let now = h.last_hour("q", at(1, 45));
        assert_eq!(now.since_ms, at(-58, 0), "the first of 60 minutes");
        assert_eq!(now.outcomes.len(), Outcome::ALL.len(), "every outcome");
        for s in &now.outcomes {
            assert_eq!(s.counts.len(), MINUTES, "{}", s.name);
        }
        let acked = series(&now.outcomes, "acked");
        assert_eq!(&acked[57..], [0, 4, 0]);
        assert_eq!(&series(&now.outcomes, "retried")[58..], [0, 2]);
        assert_eq!(series(&now.outcomes, "dead_lettered"), [0; MINUTES]);

        // Ten minutes later, with no traffic: the same counts, ten points further back.
        let later = h.last_hour("q", at(11, 0));
        let acked = series(&later.outcomes, "acked");
        assert_eq!((acked[48], acked[49], acked[59]), (4, 0, 0));
        assert_eq!(acked.iter().sum::<u64>(), 4);
        let unknown = h.last_hour("never-seen", at(11, 0));
        assert!(unknown.outcomes.iter().all(|s| s.counts == [0; MINUTES]));
    }

    #[test]
    fn minutes_older_than_an_hour_expire() {
        let h = DeliveryHistory::default();
        h.delivery("q", Outcome::Acked, at(0, 0));
        let total = |now| -> u64 {
            series(&h.last_hour("q", now).outcomes, "acked")
                .iter()
                .sum()
        };
        assert_eq!(total(at(59, 59)), 1, "the 60th minute still shows it");
        assert_eq!(total(at(60, 0)), 0, "an hour on, it is gone");
        // Its slot is reused by the minute an hour on: only the new count is there.
        h.delivery("q", Outcome::Acked, at(60, 1));
        h.delivery("q", Outcome::Acked, at(60, 2));
        assert_eq!(total(at(60, 3)), 2);
        // A clock that went back an hour does not wipe the newer minute.
        h.delivery("q", Outcome::Acked, at(0, 30));
        assert_eq!(total(at(60, 4)), 2);
    }

    #[test]
    fn memory_is_bounded_by_the_ring_and_the_route_cap() {
        let h = DeliveryHistory::default();
        // A day of traffic, one delivery a minute: the hour shows 60, one per point.
        for minute in 0..24 * 60 {
            h.delivery("q", Outcome::Acked, at(minute, 10));
        }
        let acked = h.last_hour("q", at(24 * 60 - 1, 30));
        assert_eq!(series(&acked.outcomes, "acked"), [1; MINUTES]);
        assert_eq!(
            std::mem::size_of::<Ring>(),
            MINUTES * std::mem::size_of::<Bucket>()
        );

        for n in 0..MAX_ROUTES + 5 {
            h.delivery(&format!("route-{n}"), Outcome::Acked, at(0, 0));
        }
        assert_eq!(h.routes(), MAX_ROUTES, "routes past the cap are not kept");
        let past_cap = h.last_hour(&format!("route-{}", MAX_ROUTES + 1), at(0, 0));
        assert_eq!(series(&past_cap.outcomes, "acked"), [0; MINUTES]);
        h.delivery("q", Outcome::Duplicate, at(24 * 60 - 1, 40));
        let kept = h.last_hour("q", at(24 * 60 - 1, 50));
        assert_eq!(
            series(&kept.outcomes, "duplicate")[59],
            1,
            "known routes go on"
        );
    }

    #[test]
    fn dead_letters_are_counted_by_the_classes_that_had_any() {
        let h = DeliveryHistory::default();
        for _ in 0..3 {
            h.dead_letter("q", ReasonClass::Handler, at(0, 1));
        }
        h.dead_letter("q", ReasonClass::RetriesExhausted, at(0, 2));
        h.dead_letter("q", FailureKind::Timeout.class(), at(-1, 0));
        let hour = h.last_hour("q", at(0, 3));
        let names: Vec<&str> = hour.dead_letters.iter().map(|s| s.name).collect();
        assert_eq!(names, ["handler", "retries-exhausted", "timeout"]);
        assert_eq!(series(&hour.dead_letters, "handler")[59], 3);
        assert_eq!(series(&hour.dead_letters, "retries-exhausted")[59], 1);
        assert_eq!(&series(&hour.dead_letters, "timeout")[58..], [1, 0]);
        assert!(h.last_hour("other", at(0, 3)).dead_letters.is_empty());
        // Every class has a place of its own.
        let mut places: Vec<usize> = classes().map(class_index).collect();
        places.sort_unstable();
        places.dedup();
        assert_eq!(places.len(), classes().count());
        assert!(places.iter().all(|p| *p < CLASSES));
    }

    #[test]
    fn times_around_the_epoch_do_not_panic() {
        let h = DeliveryHistory::default();
        h.delivery("q", Outcome::Requeued, -1);
        h.delivery("q", Outcome::Requeued, 0);
        let hour = h.last_hour("q", 0);
        assert_eq!(&series(&hour.outcomes, "requeued")[58..], [1, 1]);
    }
}
