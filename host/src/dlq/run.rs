//! A replay run: every dead letter matching a filter, oldest first, in pages, each marked
//! replayed right after its own confirm, so a run that finishes can be re-run (it finds
//! nothing) and a run that was interrupted can be re-run (it takes only what is left).
//!
//! What a run takes: the matching dead letters not replayed yet (all matching ones with
//! `include_replayed`), archived before the run started (its highest id is fixed first, so a
//! message that fails again during the run and is archived anew is left for the next run),
//! in id order, at most `limit` of them.
//!
//! Concurrent runs (a console job beside `carteiro dlq replay`, a double click) split the
//! rows: each row is claimed (`replaying_by`, a lease by the database's clock) before it is
//! published, and a row another run holds or has replayed is skipped.
//!
//! Exactly once, and its one window: a row is claimed, published, its confirm awaited, then
//! it is marked (`replayed_at`, `replay_count + 1`). A run killed between a confirm and its
//! mark (one row at most: rows go out one after another) leaves that row unmarked, and the
//! next run publishes it again once its claim expired. A mark that fails after a confirm
//! stops the run at that row (`ReplayReport::unmarked`), so no second row goes out unmarked. Both copies carry the same message id, so the route's inbox lets
//! the second one through only if the first had not committed yet — effects stay once (G2)
//! while its inbox record is kept (`[store] inbox_retention`). Every other row is published
//! exactly once over all runs. `include_replayed` runs do not resume: a re-run takes every
//! matching row again.

use std::time::Duration;

use crate::broker::ConfirmedPublisher;
use crate::broker::seal::SealKey;
use crate::store::{DeadLetterFilter, DeadLetterStat, Store};

use super::{ReplayError, ReplayRun, Replayed, replay};

/// Rows read per page.
pub const PAGE: i64 = 100;
/// A run stops after this many failed rows in a row (the broker is probably gone).
const MAX_FAILURES_IN_A_ROW: usize = 5;

/// How a run goes.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Take rows already replayed too (and do not skip them on a re-run).
    pub include_replayed: bool,
    /// Stop after this many replays; the report says how many matching rows remain.
    pub limit: Option<u64>,
    /// At most this many replays per second.
    pub rate_per_sec: Option<f64>,
    /// Send every one to this queue instead of where it came from (`--to-queue`).
    pub to_queue: Option<String>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayReport {
    /// Rows the run meant to replay (`min(matching, limit)`).
    pub planned: u64,
    /// Rows published, confirmed and marked.
    pub replayed: u64,
    /// Rows whose replay failed: id and why (left unmarked for the next run).
    pub failed: Vec<(i64, String)>,
    /// Matching rows left for a later run (not replayed yet; for `include_replayed`, not
    /// reached by this run).
    pub remaining: u64,
    /// The run stopped at `limit`.
    pub stopped_by_limit: bool,
    /// The run gave up early (failures in a row, or a mark that failed after a confirm).
    pub gave_up: Option<String>,
    /// Rows another replay running at the same time held or replayed first: not published.
    pub skipped: u64,
    /// A row published and confirmed whose mark failed (the run stopped there): it still
    /// reads unreplayed, and a re-run publishes it again.
    pub unmarked: Option<i64>,
}

/// Told about a run's progress.
pub trait Progress {
    /// The run will replay `planned` rows.
    fn start(&mut self, planned: u64);
    /// `done` rows replayed so far.
    fn advance(&mut self, done: u64);
    /// The run is over.
    fn finish(&mut self, report: &ReplayReport);
}

/// No progress reports.
pub struct Quiet;

impl Progress for Quiet {
    fn start(&mut self, _: u64) {}
    fn advance(&mut self, _: u64) {}
    fn finish(&mut self, _: &ReplayReport) {}
}

/// Passes progress on to `inner` and into the `carteiro_replay_*` metrics, so a replay the
/// gateway runs (the console, the JSON API) shows on `/metrics`.
pub struct Metered<'a> {
    pub metrics: &'a crate::metrics::Metrics,
    pub inner: &'a mut dyn Progress,
    planned: u64,
    done: u64,
    /// Started and not finished: a run dropped part-way (stopped) takes itself off the
    /// gauges when dropped.
    running: bool,
}

impl<'a> Metered<'a> {
    pub fn new(metrics: &'a crate::metrics::Metrics, inner: &'a mut dyn Progress) -> Self {
        Self {
            metrics,
            inner,
            planned: 0,
            done: 0,
            running: false,
        }
    }

    /// Takes this run off the `running` and `remaining` gauges.
    fn leave(&mut self) {
        self.running = false;
        let left = self.planned.saturating_sub(self.done);
        self.metrics.replay.remaining.dec_by(saturating_i64(left));
        self.metrics.replay.running.dec();
    }
}

impl Drop for Metered<'_> {
    fn drop(&mut self) {
        if self.running {
            self.leave();
        }
    }
}

impl Progress for Metered<'_> {
    fn start(&mut self, planned: u64) {
        self.planned = planned;
        self.running = true;
        self.metrics.replay.running.inc();
        self.metrics
            .replay
            .remaining
            .inc_by(saturating_i64(planned));
        self.inner.start(planned);
    }

    fn advance(&mut self, done: u64) {
        let step = done.saturating_sub(self.done);
        self.done = done;
        self.metrics.replay.replayed.inc_by(step);
        self.metrics.replay.remaining.dec_by(saturating_i64(step));
        self.inner.advance(done);
    }

    fn finish(&mut self, report: &ReplayReport) {
        self.metrics
            .replay
            .failed
            .inc_by(report.failed.len() as u64);
        if self.running {
            self.leave();
        }
        self.inner.finish(report);
    }
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The rows a run with `filter` takes, as a filter (limit and paging cleared).
pub fn selection(filter: &DeadLetterFilter, include_replayed: bool) -> DeadLetterFilter {
    DeadLetterFilter {
        replayed: if include_replayed { None } else { Some(false) },
        limit: None,
        after_id: None,
        ..filter.clone()
    }
}

/// What a run would take: how many rows, and their groups (route and reason), largest
/// first. Nothing is published.
pub async fn dry_run(
    store: &Store,
    filter: &DeadLetterFilter,
    include_replayed: bool,
) -> anyhow::Result<(u64, Vec<DeadLetterStat>)> {
    let selection = selection(filter, include_replayed);
    let count = store.dead_letters_count(&selection).await?;
    let groups = store.dead_letter_groups(&selection).await?;
    Ok((u64::try_from(count).unwrap_or(0), groups))
}

/// Replays what `filter` selects (see the module doc) and reports what it did.
pub async fn replay_matching(
    store: &Store,
    publisher: &ConfirmedPublisher,
    seal: &SealKey,
    publish_timeout: Duration,
    filter: &DeadLetterFilter,
    options: &ReplayOptions,
    progress: &mut dyn Progress,
) -> anyhow::Result<ReplayReport> {
    let mut selection = selection(filter, options.include_replayed);
    let mut report = ReplayReport::default();
    let Some(last) = store.dead_letters_max_id(&selection).await? else {
        progress.start(0);
        progress.finish(&report);
        return Ok(report);
    };
    selection.before_id = Some(selection.before_id.map_or(last + 1, |b| b.min(last + 1)));
    let matching = u64::try_from(store.dead_letters_count(&selection).await?).unwrap_or(0);
    report.planned = options.limit.map_or(matching, |l| l.min(matching));
    progress.start(report.planned);

    // An include-replayed run takes rows replayed before it started, not those a concurrent
    // run replays meanwhile.
    let replayed_before = options.include_replayed.then(crate::common::now_ms);
    let claims = Claims::new(store);
    let mut pace = options.rate_per_sec.map(Pace::new);
    let mut cursor: Option<i64> = None;
    let mut failures_in_a_row = 0;
    'pages: loop {
        let page_filter = DeadLetterFilter {
            after_id: cursor,
            ..selection.clone()
        };
        let page = store.dead_letters_oldest_first(&page_filter, PAGE).await?;
        if page.is_empty() {
            break;
        }
        for d in page {
            if report.replayed >= report.planned {
                report.stopped_by_limit = options.limit.is_some();
                break 'pages;
            }
            if let Some(pace) = pace.as_mut() {
                pace.wait().await;
            }
            cursor = Some(d.id);
            let owner = &claims.owner;
            match replay(
                store,
                publisher,
                seal,
                &d,
                publish_timeout,
                replayed_before,
                ReplayRun {
                    owner: Some(owner),
                    to_queue: options.to_queue.as_deref(),
                },
            )
            .await
            {
                Ok(Replayed::Done) => {
                    report.replayed += 1;
                    failures_in_a_row = 0;
                    progress.advance(report.replayed);
                }
                Ok(Replayed::Skipped) => report.skipped += 1,
                // Published but not marked: stop at once, so at most this one row is out
                // unmarked, and say so rather than call it a failure.
                Err(e @ ReplayError::Unmarked { .. }) => {
                    report.replayed += 1;
                    progress.advance(report.replayed);
                    report.unmarked = Some(d.id);
                    report.gave_up = Some(e.to_string());
                    break 'pages;
                }
                Err(e) => {
                    tracing::warn!(id = d.id, route = %d.letter.route, error = %e, "replay failed; the dead letter stays unreplayed");
                    report.failed.push((d.id, format!("{e:#}")));
                    failures_in_a_row += 1;
                    if failures_in_a_row >= MAX_FAILURES_IN_A_ROW {
                        report.gave_up = Some(format!(
                            "{MAX_FAILURES_IN_A_ROW} replays in a row failed; the last: {e:#}"
                        ));
                        break 'pages;
                    }
                }
            }
        }
    }
    let left = if options.include_replayed {
        let unreached = DeadLetterFilter {
            after_id: cursor,
            ..selection.clone()
        };
        store.dead_letters_count(&unreached).await? + report.failed.len() as i64
    } else {
        store.dead_letters_count(&selection).await?
    };
    report.remaining = u64::try_from(left).unwrap_or(0);
    progress.finish(&report);
    Ok(report)
}

/// The claims of one run. A run stopped by dropping its future (a console job's Stop) may
/// hold a claim on the row it was publishing; dropping this gives it back at once, so the
/// next run need not wait for the lease to end.
struct Claims {
    store: Store,
    owner: String,
}

impl Claims {
    fn new(store: &Store) -> Self {
        Self {
            store: store.clone(),
            owner: uuid::Uuid::now_v7().to_string(),
        }
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        let (store, owner) = (self.store.clone(), std::mem::take(&mut self.owner));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // Best effort: a claim that is not given back expires with its lease.
            runtime.spawn(async move { store.dead_letter_release_replay(None, &owner).await });
        }
    }
}

/// Spaces replays `1/rate` seconds apart, from the first one.
struct Pace {
    started: Option<tokio::time::Instant>,
    gap: Duration,
    sent: u32,
}

impl Pace {
    /// `rate_per_sec` is clamped into [`RATES`] (callers refuse rates outside it first).
    fn new(rate_per_sec: f64) -> Self {
        let rate = if rate_per_sec.is_nan() {
            *RATES.end()
        } else {
            rate_per_sec.clamp(*RATES.start(), *RATES.end())
        };
        let gap = Duration::from_secs_f64(1.0 / rate);
        Self {
            started: None,
            gap,
            sent: 0,
        }
    }

    async fn wait(&mut self) {
        let started = *self.started.get_or_insert_with(tokio::time::Instant::now);
        tokio::time::sleep_until(started + self.gap * self.sent).await;
        self.sent = self.sent.saturating_add(1);
    }
}

/// The replay rates accepted, per second: from one every 100 s to 10,000 a second (a
/// rate outside would sleep for ages between rows, or not be a limit at all).
pub const RATES: std::ops::RangeInclusive<f64> = 0.01..=10_000.0;

/// A replay rate that is not one: out of [`RATES`], or not a number.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RateError {
    /// A number of replays per second outside [`RATES`].
    #[error(
        "rate {rate} is out of range: replays per second must be between {} and {}",
        RATES.start(),
        RATES.end()
    )]
    OutOfRange { rate: f64 },
    /// Text (`--rate`, a form) that holds a rate outside [`RATES`].
    #[error(
        "rate {rate} is out of range: replays per second must be between {} and {}; got `{text}`",
        RATES.start(),
        RATES.end()
    )]
    OutOfRangeGiven { rate: f64, text: String },
    /// Text that is not a rate at all.
    #[error(
        "expected a rate like `50/s` (replays per second, between {} and {}), got `{text}`",
        RATES.start(),
        RATES.end()
    )]
    NotARate { text: String },
}

/// Checks a rate (replays per second) against [`RATES`].
pub fn check_rate(rate: f64) -> Result<f64, RateError> {
    if RATES.contains(&rate) {
        Ok(rate)
    } else {
        Err(RateError::OutOfRange { rate })
    }
}

/// `50/s`, `50`, `0.5/s`: replays per second, within [`RATES`].
pub fn parse_rate(text: &str) -> Result<f64, RateError> {
    let number = text.trim().strip_suffix("/s").unwrap_or(text.trim());
    match number.trim().parse::<f64>() {
        Ok(rate) => check_rate(rate).map_err(|_| RateError::OutOfRangeGiven {
            rate,
            text: text.to_owned(),
        }),
        Err(_) => Err(RateError::NotARate {
            text: text.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metered_progress_moves_the_replay_metrics() {
        let metrics = crate::metrics::Metrics::default();
        let mut quiet = Quiet;
        let mut metered = Metered::new(&metrics, &mut quiet);
        metered.start(5);
        assert_eq!(metrics.replay.running.get(), 1);
        assert_eq!(metrics.replay.remaining.get(), 5);
        metered.advance(1);
        metered.advance(3);
        assert_eq!(metrics.replay.replayed.get(), 3);
        assert_eq!(metrics.replay.remaining.get(), 2);
        let report = ReplayReport {
            planned: 5,
            replayed: 3,
            failed: vec![(9, "nack".into())],
            ..Default::default()
        };
        metered.finish(&report);
        drop(metered);
        assert_eq!(metrics.replay.failed.get(), 1);
        assert_eq!(metrics.replay.remaining.get(), 0);
        assert_eq!(metrics.replay.running.get(), 0);
        // A run stopped part-way (its future dropped) leaves the gauges too.
        let mut quiet = Quiet;
        let mut stopped = Metered::new(&metrics, &mut quiet);
        stopped.start(4);
        stopped.advance(1);
        drop(stopped);
        assert_eq!(metrics.replay.replayed.get(), 4);
        assert_eq!(metrics.replay.remaining.get(), 0);
        assert_eq!(metrics.replay.running.get(), 0);
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("50/s"), Ok(50.0));
        assert_eq!(parse_rate("0.5/s"), Ok(0.5));
        assert_eq!(parse_rate("20"), Ok(20.0));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("-1/s").is_err());
        assert!(parse_rate("fast").is_err());
        for edge in ["1e-300", "1e300", "inf", "NaN", "0.001", "10001"] {
            assert!(parse_rate(edge).is_err(), "{edge}");
        }
        assert_eq!(parse_rate("0.01/s"), Ok(0.01));
        assert_eq!(parse_rate("10000/s"), Ok(10_000.0));
        // The texts operators read (clap, the console, the JSON API).
        assert_eq!(
            check_rate(0.0).unwrap_err().to_string(),
            "rate 0 is out of range: replays per second must be between 0.01 and 10000"
        );
        assert_eq!(
            parse_rate("0/s").unwrap_err().to_string(),
            "rate 0 is out of range: replays per second must be between 0.01 and 10000; got `0/s`"
        );
        assert_eq!(
            parse_rate("fast").unwrap_err().to_string(),
            "expected a rate like `50/s` (replays per second, between 0.01 and 10000), got `fast`"
        );
    }

    #[test]
    fn pace_never_panics_at_the_edges() {
        for rate in [1e-300, 1e300, f64::NAN, f64::INFINITY, 0.0, -1.0] {
            let pace = Pace::new(rate);
            assert!(
                pace.gap <= Duration::from_secs(100),
                "{rate}: {:?}",
                pace.gap
            );
            assert!(
                pace.gap >= Duration::from_micros(100),
                "{rate}: {:?}",
                pace.gap
            );
        }
    }

    #[tokio::test]
    async fn pace_spaces_replays() {
        let mut pace = Pace::new(50.0);
        let start = tokio::time::Instant::now();
        for _ in 0..11 {
            pace.wait().await;
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}
