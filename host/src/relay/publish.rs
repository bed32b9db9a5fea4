//! Publishing one ordering key's rows, the same for every source and both feeds (polling and
//! the slot): what the relay does around a row once it holds it.
//!
//! A key's rows go out on a task of their own in runs: up to [`MAX_BATCH`] rows for one
//! exchange back to back on one channel (RabbitMQ keeps a channel's order), the next run after
//! their confirms. Each confirmed row goes to the marker at once, also one confirmed behind a
//! failed row of its run (it reached consumers already; sending it again on every retry of the
//! failed row would flood them with duplicates). The first failure stops the key; what then
//! depends on the feed ([`OnFailure`]): a polled row is handed back to the session, which
//! records the failure with its backoff and gives the key's rows back to the table; a row read
//! from the slot is retried here after the backoff, since the slot does not send it again.
//!
//! A row AMQP can never carry is parked with its error (`permanent: cannot be published: ...`):
//! a keyed row holds its key's later rows, an unordered row holds nothing (docs/relay.md).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use super::chains::Leased;
use super::marker::MarkSender;
use super::source::{Failed, Source};
use super::{Settings, outgoing};
use crate::broker::{ConfirmedPublisher, MAX_BATCH, Outgoing, PublishError};
use crate::common::{FaultPoint, hang_if, retry};
use crate::metrics::Metrics;
use crate::store::{OutboxRow, StoreError};
use crate::telemetry::Telemetry;

/// The error a row of a key held by a parked row is parked with, when the feed has read it
/// already (the slot; a polled row just stays pending).
const HELD_BEHIND: &str = "held behind a parked row of its ordering key";

/// The slot changed hands: this session must publish nothing more.
#[derive(Debug, thiserror::Error)]
#[error("replication slot {0} is no longer read by this relay (another relay took it over)")]
pub(super) struct SlotLost(pub String);

/// Asked before every run of publishes: may this session still publish? (The slot's reader;
/// polled rows need none, each row's lease is checked before it goes out.)
pub(super) trait Fence: Clone + Send + Sync + 'static {
    /// `Err`: never again.
    fn admit(&mut self) -> impl Future<Output = Result<(), SlotLost>> + Send;
}

/// No fence beyond the rows' own leases.
#[derive(Clone)]
pub(super) struct Unfenced;

impl Fence for Unfenced {
    async fn admit(&mut self) -> Result<(), SlotLost> {
        Ok(())
    }
}

/// What becomes of a row whose publish failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnFailure {
    /// Stop the key and hand the row back to the session (polling): the rows behind it wait
    /// until the failure is recorded, then go back to the table.
    HandBack,
    /// Record the failure and try again here after the backoff (the slot); park a row AMQP can
    /// never carry here, with the rows of its key behind it.
    RetryHere,
}

/// Where confirmed ids go: to the marker, and (the slot) to the session, whose commit
/// window counts a row as settled at its confirm.
#[derive(Clone)]
pub(super) struct Confirms {
    pub marks: MarkSender,
    pub settled: Option<UnboundedSender<i64>>,
}

impl Confirms {
    fn confirmed(&self, id: i64) {
        self.marks.confirmed(id);
        if let Some(settled) = &self.settled {
            let _ = settled.send(id);
        }
    }
}

/// How a key's publishing ended.
pub(super) struct KeyDone {
    pub key: String,
    /// [`OnFailure::HandBack`]: the row that stopped the key, with its publish error (`None`:
    /// it was not published because its lease was running low).
    pub failed: Option<(Leased, Option<PublishError>)>,
    /// [`OnFailure::HandBack`]: the rows after the failed one, not published.
    pub unpublished: Vec<Leased>,
    /// [`OnFailure::RetryHere`]: the rows parked (settled).
    pub parked: Vec<i64>,
    /// [`OnFailure::RetryHere`]: publishing must stop, and why.
    pub stopped: Option<Stopped>,
}

/// Why a key's task stopped the session's publishing.
pub(super) enum Stopped {
    /// The broker connection is gone.
    Broker(String),
    /// The fence closed: another relay publishes now.
    Fenced(SlotLost),
}

/// What a key's publishing task needs from its session (cheap to clone).
#[derive(Clone)]
pub(super) struct KeyPublisher<S, F> {
    source: S,
    publisher: ConfirmedPublisher,
    timeout: Duration,
    metrics: Arc<Metrics>,
    telemetry: Telemetry,
    fault: Option<FaultPoint>,
    confirms: Confirms,
    fence: F,
    on_failure: OnFailure,
}

impl<S: Source, F: Fence> KeyPublisher<S, F> {
    /// A session's publisher of keys: `publisher` publishes what `source` holds, confirmed
    /// ids go to `confirms`, `fence` is asked before every run.
    pub fn new(
        settings: &Settings,
        source: &S,
        publisher: &ConfirmedPublisher,
        confirms: Confirms,
        fence: F,
        on_failure: OnFailure,
    ) -> Self {
        Self {
            source: source.clone(),
            publisher: publisher.clone(),
            timeout: settings.publish_timeout,
            metrics: settings.metrics.clone(),
            telemetry: settings.telemetry.clone(),
            fault: settings.fault,
            confirms,
            fence,
            on_failure,
        }
    }

    /// Publishes `rows` (of one key, in order) on a task of their own. `held`: a parked row
    /// holds the key, so they are parked behind it at once.
    pub fn spawn(&self, rows: Vec<Leased>, held: bool) -> JoinHandle<KeyDone> {
        let task = self.clone();
        tokio::spawn(task.publish(rows.into(), held))
    }

    async fn publish(mut self, mut rows: VecDeque<Leased>, held: bool) -> KeyDone {
        let key = rows
            .front()
            .map(|l| l.row.event.ordering_key.clone())
            .unwrap_or_default();
        let mut done = KeyDone {
            key,
            failed: None,
            unpublished: Vec::new(),
            parked: Vec::new(),
            stopped: None,
        };
        if held {
            self.park_all(rows, HELD_BEHIND, &mut done).await;
            return done;
        }
        let mut attempts: u32 = 0;
        while !rows.is_empty() {
            let (run, messages, refused) = next_run(&mut rows);
            if run.is_empty() {
                // The head row may not go out: AMQP cannot carry it, or its lease runs low.
                match self.on_failure {
                    OnFailure::HandBack => {
                        done.failed = rows.pop_front().map(|l| (l, refused));
                        done.unpublished = rows.into();
                    }
                    OnFailure::RetryHere => self.park_refused(rows, refused, &mut done).await,
                }
                return done;
            }
            if let Err(why) = self.fence.admit().await {
                done.stopped = Some(Stopped::Fenced(why));
                return done;
            }
            let publish = self.publisher.publish_in_order(messages, self.timeout);
            let results = self
                .telemetry
                .publish_run(run.iter().map(|l| &l.row), publish)
                .await;
            let Some((failed, error, behind)) = self.settle_run(&done.key, run, results).await
            else {
                attempts = 0;
                continue;
            };
            if self.on_failure == OnFailure::HandBack {
                done.failed = Some((failed, error));
                done.unpublished = behind;
                done.unpublished.extend(rows);
                return done;
            }
            for leased in behind.into_iter().rev() {
                rows.push_front(leased);
            }
            rows.push_front(failed);
            match error {
                Some(e @ PublishError::ChannelClosed(_)) if !self.publisher.is_connected() => {
                    done.stopped = Some(Stopped::Broker(e.to_string()));
                    return done;
                }
                // The publisher refused it (a routing key over 255 bytes, headers over
                // frame_max): as permanent as a row `outgoing` refuses.
                refused @ Some(PublishError::Invalid(_)) => {
                    self.park_refused(rows, refused, &mut done).await;
                    return done;
                }
                Some(error) => {
                    attempts += 1;
                    if let Some(first) = rows.front() {
                        self.retry_later(&first.row, attempts, &error).await;
                    }
                }
                // Not sent, with no error of its own (a run stops only after an error, so
                // this should not happen): wait as after a failure, then send it again.
                None => {
                    attempts += 1;
                    tokio::time::sleep(retry::ROW_PUBLISH.delay_after(attempts)).await;
                }
            }
        }
        done
    }

    /// Confirmed rows of `run` go to the marker (also those behind a failed row: they reached
    /// their queues). Returns the first row that failed, its error (`None`: not sent), and the
    /// rows behind it that were not confirmed, in order.
    async fn settle_run(
        &self,
        key: &str,
        run: Vec<Leased>,
        results: Vec<Result<(), PublishError>>,
    ) -> Option<(Leased, Option<PublishError>, Vec<Leased>)> {
        let mut results = results.into_iter();
        let mut failed: Option<(Leased, Option<PublishError>)> = None;
        let mut behind = Vec::new();
        let mut overtook = 0;
        for leased in run {
            match results.next() {
                Some(Ok(())) => {
                    // Test-only: stop dead after this row's confirm, before its mark.
                    hang_if(self.fault, FaultPoint::RelayHangAfterConfirm).await;
                    self.metrics.outbox.published.inc();
                    let id = leased.row.id;
                    // Its bytes leave the window before the session hears of the confirm.
                    drop(leased);
                    self.confirms.confirmed(id);
                    overtook += usize::from(failed.is_some());
                }
                // The first failure stops the key; `None`: the run stopped before it.
                result if failed.is_none() => failed = Some((leased, result.and_then(Result::err))),
                // Failed or not sent behind the first failure: after it, in order.
                _ => behind.push(leased),
            }
        }
        let (failed, error) = failed?;
        if overtook > 0 {
            tracing::warn!(ordering_key = %key, event_id = %failed.row.event.event_id, overtook, "outbox rows published ahead of an earlier row of their key that failed in the same run; that row follows them when it is retried");
        }
        Some((failed, error, behind))
    }

    /// The slot: the failure of the head of `rows` is recorded on it, and it is tried again
    /// after the backoff (its key and the slot position wait meanwhile).
    async fn retry_later(&self, row: &OutboxRow, attempts: u32, error: &PublishError) {
        self.metrics.outbox.failed.inc();
        let retry_after = retry::ROW_PUBLISH.delay_after(attempts);
        tracing::warn!(event_id = %row.event.event_id, exchange = %row.event.exchange, routing_key = %row.event.routing_key, attempts, %error, "outbox publish failed; retrying (its key and the slot wait)");
        let error = error.to_string();
        let failed = Failed::Retry {
            error: &error,
            retry_after,
        };
        // Best effort: the row is retried either way, and the count is for people.
        let _ = self.source.record_failure(row.id, None, failed).await;
        tokio::time::sleep(retry_after).await;
    }

    /// The head of `rows` can never be published (`refused` says why): park it and, for a
    /// keyed row, the key's rows behind it (an unordered row's batch is itself alone).
    async fn park_refused(
        &self,
        rows: VecDeque<Leased>,
        refused: Option<PublishError>,
        done: &mut KeyDone,
    ) {
        let why = match refused {
            Some(PublishError::Invalid(why)) => why,
            other => other.map(|e| e.to_string()).unwrap_or_default(),
        };
        if let Some(head) = rows.front() {
            unpublishable(&head.row, &why);
        }
        self.metrics.outbox.failed.inc();
        self.park_all(rows, &parked_error(&why), done).await;
    }

    /// Parks every row of `rows` with `error`; they are settled.
    async fn park_all(&self, rows: VecDeque<Leased>, error: &str, done: &mut KeyDone) {
        for leased in rows {
            let failed = Failed::Park { error };
            let _ = self
                .source
                .record_failure(leased.row.id, None, failed)
                .await;
            done.parked.push(leased.row.id);
        }
    }
}

/// Takes the next run off the head of `rows`: rows for one exchange, at most [`MAX_BATCH`],
/// each with lease enough left to start now, with their messages. When the run stops at a row
/// that cannot go out at all (AMQP cannot carry it), the error is returned for it (it stays at
/// the head); a row whose lease runs low also stays at the head, with no error.
fn next_run(rows: &mut VecDeque<Leased>) -> (Vec<Leased>, Vec<Outgoing>, Option<PublishError>) {
    let mut run: Vec<Leased> = Vec::new();
    let mut messages = Vec::new();
    let now = std::time::Instant::now();
    while let Some(head) = rows.front() {
        let same_exchange = run
            .first()
            .is_none_or(|f| f.row.event.exchange == head.row.event.exchange);
        let lease_low = head.start_by.is_some_and(|by| now > by);
        if run.len() == MAX_BATCH || !same_exchange || lease_low {
            break;
        }
        match outgoing(&head.row) {
            Ok(message) => {
                messages.push(message);
                run.extend(rows.pop_front());
            }
            Err(e) => return (run, messages, Some(PublishError::Invalid(e.to_string()))),
        }
    }
    (run, messages, None)
}

/// What a row AMQP can never carry is parked with.
fn parked_error(why: &str) -> String {
    format!("permanent: cannot be published: {why}")
}

fn unpublishable(row: &OutboxRow, why: &str) {
    tracing::error!(event_id = %row.event.event_id, exchange = %row.event.exchange, routing_key = %row.event.routing_key, %why, "outbox row can never be published; parked with its error");
}

/// Polling: records the failed publish of leased `row` (its attempts counted in the table):
/// parked when AMQP can never carry it, else held back for the backoff its attempts give. The
/// lease ends either way.
pub(super) async fn record_leased_failure<S: Source>(
    source: &S,
    metrics: &Metrics,
    owner: &str,
    row: &OutboxRow,
    error: &PublishError,
) -> Result<(), StoreError> {
    metrics.outbox.failed.inc();
    let attempts = row.attempts + 1;
    let held = if let PublishError::Invalid(why) = error {
        // Publishing it again can never help: park the row (it keeps holding its ordering
        // key) with the reason, for `carteiro outbox status` and the operator.
        unpublishable(row, why);
        let error = parked_error(why);
        let failed = Failed::Park { error: &error };
        source.record_failure(row.id, Some(owner), failed).await?
    } else {
        let retry_after =
            retry::ROW_PUBLISH.delay_after(u32::try_from(attempts).unwrap_or(u32::MAX));
        tracing::warn!(event_id = %row.event.event_id, exchange = %row.event.exchange, routing_key = %row.event.routing_key, attempts, %error, "outbox publish failed; the row stays pending");
        let error = error.to_string();
        let failed = Failed::Retry {
            error: &error,
            retry_after,
        };
        source.record_failure(row.id, Some(owner), failed).await?
    };
    // A failure recorded for a row whose lease another relay took meanwhile is dropped:
    // that relay owns the row now.
    if !held {
        tracing::warn!(event_id = %row.event.event_id, "outbox row's lease ran out before its failure was recorded; another relay owns it now");
    }
    Ok(())
}
