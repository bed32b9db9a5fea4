//! One relay session: a continuous pipeline over one broker connection, under one lease
//! owner name that is never reused.
//!
//! The session claims rows whenever its window (`max_in_flight`) has room, without waiting
//! for earlier rows to finish: a claim may return later rows of a key whose earlier rows
//! this session is still publishing, and they join that key's chain. Confirmed rows go to
//! the marker; failed rows are recorded (attempts, error, backoff) one by one, with no claim
//! running meanwhile, before the rest of their chain is handed back — so a claim never
//! returns a row whose earlier row of the same key failed but is not yet in backoff.
//!
//! A session ends on `stop`, a lost broker or a store error. It then drops the rows it has
//! not started, lets the publishes in flight finish, marks what was confirmed, and only then
//! gives its leases back (a row confirmed but not yet marked must not be freed for another
//! relay to publish again). A lease it cannot give back expires; because the next session
//! has a new owner name, such rows keep holding back the later rows of their key.

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;

use super::chains::{Chains, HeldBytes, Leased, row_bytes};
use super::marker::{MarkSender, Marker};
use super::{Relay, outgoing};
use crate::broker::{ConfirmedPublisher, MAX_BATCH, Outgoing, PublishError};
use crate::common::{FaultPoint, hang_if, retry};
use crate::store::{OutboxRow, StoreError};

/// Why a session ended.
pub(super) enum End {
    /// Asked to stop.
    Stopped,
    /// The broker connection is gone: reconnect.
    Broker(String),
    /// The store failed: wait and start a new session.
    Store(String),
}

/// One batch of rows of one key, published one after another on its own task (publishes
/// spread over the runtime's threads, and a key's next row goes out right after the
/// previous confirm, without a round trip through the session).
type Publishing = tokio::task::JoinHandle<BatchDone>;

/// How a batch ended.
struct BatchDone {
    key: String,
    /// The row that stopped the batch, with its publish error (`None`: it was not
    /// published because its lease was running low).
    failed: Option<(Leased, Option<PublishError>)>,
    /// Rows after the failed one, not published.
    unpublished: Vec<Leased>,
}
type ClaimResult = Result<Vec<OutboxRow>, StoreError>;

/// A claim running in the background, started at `at` for up to `limit` rows and
/// `max_bytes` bytes.
struct Claim {
    rows: BoxFuture<'static, ClaimResult>,
    at: Instant,
    limit: usize,
    max_bytes: u64,
}

/// A row that must not be published now.
struct Failure {
    leased: Leased,
    /// The publish failed with this error: count the attempt and back off. `None`: the
    /// row was never published (its lease was running out): just give it back.
    error: Option<PublishError>,
}

pub(super) struct Session<'a> {
    relay: &'a Relay,
    publisher: ConfirmedPublisher,
    owner: String,
    chains: Chains,
    publishing: FuturesUnordered<Publishing>,
    failures: Vec<Failure>,
    /// Rows leased and not settled: waiting, publishing, awaiting their mark or failing.
    window: usize,
    /// Bytes of the leased rows still in memory (waiting, publishing or failing).
    held: HeldBytes,
    /// The last claim probably stopped at its byte budget: claim again once bytes free up.
    byte_capped: bool,
    /// Some row was marked published: the relay's reconnect backoff starts over.
    progressed: bool,
}

impl<'a> Session<'a> {
    pub fn new(relay: &'a Relay, publisher: ConfirmedPublisher) -> Self {
        Self {
            relay,
            publisher,
            owner: format!(
                "relay-{}-{}",
                std::process::id(),
                uuid::Uuid::now_v7().simple()
            ),
            chains: Chains::default(),
            publishing: FuturesUnordered::new(),
            failures: Vec::new(),
            window: 0,
            held: HeldBytes::default(),
            byte_capped: false,
            progressed: false,
        }
    }

    /// Runs the session until it ends; also says whether it marked any row published.
    pub async fn run(mut self, stop: &tokio_util::sync::CancellationToken) -> (End, bool) {
        tracing::debug!(owner = %self.owner, "relay session started");
        let (marker, mut marked) = Marker::spawn(self.relay.store.clone());
        let marks = marker.sender();
        let mut claim: Option<Claim> = None;
        let mut want_claim = true;
        let poll = self.relay.poll_interval;
        let poll_timer = tokio::time::sleep(poll);
        tokio::pin!(poll_timer);
        let end = loop {
            if claim.is_none()
                && !self.failures.is_empty()
                && let Err(e) = self.settle_failures().await
            {
                break End::Store(e.to_string());
            }
            if claim.is_none() && want_claim && self.room() >= self.min_claim() && self.bytes_room()
            {
                want_claim = false;
                self.byte_capped = false;
                claim = Some(self.claim());
            }
            tokio::select! {
                Some(joined) = self.publishing.next(), if !self.publishing.is_empty() => {
                    let end = match joined {
                        Ok(done) => self.finished(done, &marks),
                        // A panic lost track of a leased row: end the session, which gives
                        // every lease of this owner back.
                        Err(e) => Some(End::Broker(format!("a publish task failed: {e}"))),
                    };
                    if let Some(end) = end {
                        break end;
                    }
                }
                result = async {
                    match claim.as_mut() {
                        Some(c) => (&mut c.rows).await,
                        None => std::future::pending().await,
                    }
                } => {
                    let Some(done) = claim.take() else { continue };
                    match result {
                        Ok(rows) => {
                            // A full claim: more rows are probably waiting.
                            want_claim |= rows.len() >= done.limit;
                            // Many bytes for fewer rows than asked: the byte budget stopped it.
                            let bytes: u64 = rows.iter().map(row_bytes).sum();
                            self.byte_capped = rows.len() < done.limit && bytes >= done.max_bytes / 2;
                            self.admit(rows, done.at, &marks);
                        }
                        Err(e) => break End::Store(e.to_string()),
                    }
                }
                Some(ids) = marked.recv() => {
                    self.progressed = true;
                    self.window = self.window.saturating_sub(ids.len());
                    want_claim |= self.byte_capped;
                }
                () = self.relay.wake.notified() => want_claim = true,
                () = &mut poll_timer => {
                    want_claim = true;
                    poll_timer.as_mut().reset(Instant::now() + poll);
                }
                () = stop.cancelled() => break End::Stopped,
            }
        };
        let progressed = self.progressed;
        self.quiesce(claim, marker, marks, &end).await;
        (end, progressed)
    }

    fn room(&self) -> usize {
        self.relay.max_in_flight.saturating_sub(self.window)
    }

    /// Claims are worth a query only for a good share of the window.
    fn min_claim(&self) -> usize {
        (self.relay.max_in_flight / 4).max(1)
    }

    /// Room for a claim in bytes: a quarter of the byte window free, or nothing held (a
    /// claim always takes at least one row, however large).
    fn bytes_room(&self) -> bool {
        let held = self.held.get();
        held == 0
            || self.relay.max_in_flight_bytes.saturating_sub(held)
                >= self.relay.max_in_flight_bytes / 4
    }

    fn claim(&self) -> Claim {
        let limit = self.room();
        let max_bytes = self
            .relay
            .max_in_flight_bytes
            .saturating_sub(self.held.get())
            .max(1);
        let store = self.relay.store.clone();
        let owner = self.owner.clone();
        let lease_ms = i64::try_from(self.relay.lease.as_millis()).unwrap_or(i64::MAX);
        let rows_limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let bytes_limit = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        Claim {
            rows: Box::pin(async move {
                store
                    .outbox_claim(rows_limit, bytes_limit, &owner, lease_ms)
                    .await
            }),
            at: Instant::now(),
            limit,
            max_bytes,
        }
    }

    /// Rows of a claim (id order): each starts now or joins its key's chain.
    fn admit(&mut self, rows: Vec<OutboxRow>, claimed_at: Instant, marks: &MarkSender) {
        // Starting later than this, the publish could outlast the lease.
        let start_by = claimed_at + self.relay.lease
            - self.relay.publish_timeout
            - Duration::from_secs(1).min(self.relay.publish_timeout);
        self.window += rows.len();
        let mut starting = Vec::new();
        for row in rows {
            let leased = Leased {
                _held: self.held.hold(&row),
                row,
                start_by: start_by.into_std(),
            };
            if let Some(now) = self.chains.admit(leased) {
                starting.push(now);
            }
        }
        for first in starting {
            let mut batch = self.chains.take_waiting(&first.row.event.ordering_key);
            batch.insert(0, first);
            self.start(batch, marks);
        }
    }

    /// Publishes `batch` (rows of one key, id order) on a new task, pipelined: runs of up to
    /// [`MAX_BATCH`] rows for one exchange go out back to back on one channel (RabbitMQ keeps
    /// a channel's order) and the next run follows their confirms. Each confirmed row goes
    /// to the marker at once, also one confirmed behind a failed row of its run (it reached
    /// consumers already; sending it again on every retry of the failed row would flood
    /// them with duplicates). The first failure stops the batch: the rows behind it that
    /// were not confirmed go back to the key's chain and out again, in order, once the
    /// failure is settled.
    fn start(&mut self, batch: Vec<Leased>, marks: &MarkSender) {
        let Some(key) = batch.first().map(|l| l.row.event.ordering_key.clone()) else {
            return;
        };
        let publisher = self.publisher.clone();
        let timeout = self.relay.publish_timeout;
        let fault = self.relay.fault;
        let metrics = self.relay.metrics.clone();
        let telemetry = self.relay.telemetry.clone();
        let marks = marks.clone();
        self.publishing.push(tokio::spawn(async move {
            let mut rows: VecDeque<Leased> = batch.into();
            while !rows.is_empty() {
                let (run, messages, held_back) = next_run(&mut rows);
                if run.is_empty() {
                    // The head row may not go out: its lease runs low, or it is invalid.
                    let failed = rows.pop_front().map(|leased| (leased, held_back));
                    return BatchDone {
                        key,
                        failed,
                        unpublished: rows.into(),
                    };
                }
                let publish = publisher.publish_in_order(messages, timeout);
                let results = telemetry
                    .publish_run(run.iter().map(|l| &l.row), publish)
                    .await;
                let mut results = results.into_iter();
                let mut failed: Option<(Leased, Option<PublishError>)> = None;
                let mut unpublished = Vec::new();
                let mut overtook = 0;
                for leased in run {
                    match results.next() {
                        // Confirmed, so it reached its queues, even behind a failed row: it
                        // is marked, or every retry of that row would send it again.
                        Some(Ok(())) => {
                            // Test-only: stop dead after this row's confirm, before its mark.
                            hang_if(fault, FaultPoint::RelayHangAfterConfirm).await;
                            metrics.outbox.published.inc();
                            marks.confirmed(leased.row.id);
                            overtook += usize::from(failed.is_some());
                        }
                        // The first failure stops the key; `None`: the run stopped before it.
                        result if failed.is_none() => {
                            failed = Some((leased, result.and_then(Result::err)));
                        }
                        // Failed or not sent behind the first failure: after it, in order.
                        _ => unpublished.push(leased),
                    }
                }
                if let Some(failed) = failed {
                    if overtook > 0 {
                        tracing::warn!(ordering_key = %key, event_id = %failed.0.row.event.event_id, overtook, "outbox rows published ahead of an earlier row of their key that failed in the same run; that row follows them when it is retried");
                    }
                    unpublished.extend(rows);
                    return BatchDone {
                        key,
                        failed: Some(failed),
                        unpublished,
                    };
                }
            }
            BatchDone {
                key,
                failed: None,
                unpublished: Vec::new(),
            }
        }));
    }

    /// A batch ended. Returns why the session must end, if it must.
    fn finished(&mut self, done: BatchDone, marks: &MarkSender) -> Option<End> {
        match done.failed {
            None => {
                let next = self.chains.next_batch(&done.key);
                if !next.is_empty() {
                    self.start(next, marks);
                }
                None
            }
            // The rows stay leased; the session end gives them back.
            Some((_, Some(PublishError::ChannelClosed(e)))) if !self.publisher.is_connected() => {
                Some(End::Broker(e))
            }
            Some((leased, error)) => {
                self.chains.stop(&done.key, done.unpublished);
                self.failures.push(Failure { leased, error });
                None
            }
        }
    }

    /// Records each failure in the store, then gives back the rows that waited behind it.
    /// Runs only while no claim is running, so the next claim sees the failed row in backoff.
    async fn settle_failures(&mut self) -> Result<(), StoreError> {
        for Failure { leased, error } in std::mem::take(&mut self.failures) {
            let row = &leased.row;
            let mut give_back = Vec::new();
            match error {
                Some(error) => record_failure(self.relay, &self.owner, row, &error).await?,
                None => {
                    tracing::warn!(event_id = %row.event.event_id, "outbox row not published before its lease ran low; giving it back");
                    give_back.push(row.id);
                }
            }
            let waiting = self.chains.settle(&row.event.ordering_key);
            give_back.extend(waiting.iter().map(|l| l.row.id));
            self.relay
                .store
                .outbox_release_rows(&self.owner, &give_back)
                .await?;
            self.window = self.window.saturating_sub(1 + waiting.len());
        }
        Ok(())
    }

    /// Session end: see the module doc.
    async fn quiesce(mut self, claim: Option<Claim>, marker: Marker, marks: MarkSender, end: &End) {
        let dropped = self.chains.clear();
        if let Some(claim) = claim {
            // Let it finish: its rows are then leased by this owner and given back below.
            let _ = claim.rows.await;
        }
        // Confirmed rows reach the marker from the tasks themselves.
        while let Some(joined) = self.publishing.next().await {
            let Ok(BatchDone {
                failed: Some((leased, Some(error))),
                ..
            }) = joined
            else {
                continue;
            };
            let broker_gone =
                matches!(error, PublishError::ChannelClosed(_)) && !self.publisher.is_connected();
            if !broker_gone {
                self.failures.push(Failure {
                    leased,
                    error: Some(error),
                });
            }
        }
        if !matches!(end, End::Store(_)) {
            for Failure { leased, error } in std::mem::take(&mut self.failures) {
                if let Some(error) = error {
                    // Best effort: if it fails, the row is given back below without backoff.
                    let _ = record_failure(self.relay, &self.owner, &leased.row, &error).await;
                }
            }
        }
        // Marks first: a confirmed row must not be freed for another relay to publish again.
        drop(marks);
        marker.close().await;
        match self.relay.store.outbox_release(&self.owner).await {
            Ok(released) => {
                tracing::debug!(owner = %self.owner, released, dropped, "relay session ended")
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not give leases back; they expire on their own")
            }
        }
    }
}

/// Takes the next run off the head of `rows`: rows for one exchange, at most [`MAX_BATCH`],
/// each with lease enough left to start now, with their messages. When the run stops at a
/// row that cannot go out at all (invalid), the error is returned for it (it stays at the
/// head); a row whose lease runs low also stays at the head, with no error.
fn next_run(rows: &mut VecDeque<Leased>) -> (Vec<Leased>, Vec<Outgoing>, Option<PublishError>) {
    let mut run: Vec<Leased> = Vec::new();
    let mut messages = Vec::new();
    let now = std::time::Instant::now();
    while let Some(head) = rows.front() {
        let same_exchange = run
            .first()
            .is_none_or(|f| f.row.event.exchange == head.row.event.exchange);
        if run.len() == MAX_BATCH || !same_exchange || now > head.start_by {
            break;
        }
        match outgoing(&head.row) {
            Ok(message) => {
                messages.push(message);
                run.extend(rows.pop_front());
            }
            Err(e) => {
                let error = PublishError::Invalid(e.to_string());
                return (run, messages, Some(error));
            }
        }
    }
    (run, messages, None)
}

/// Counts the failed attempt, keeps the error, backs the row off (its lease ends).
async fn record_failure(
    relay: &Relay,
    owner: &str,
    row: &OutboxRow,
    error: &PublishError,
) -> Result<(), StoreError> {
    relay.metrics.outbox.failed.inc();
    let attempts = row.attempts + 1;
    if let PublishError::Invalid(why) = error {
        // Publishing it again can never help: park the row (it keeps holding its ordering
        // key) with the reason, for `carteiro outbox status` and the operator.
        tracing::error!(event_id = %row.event.event_id, exchange = %row.event.exchange, routing_key = %row.event.routing_key, %why, "outbox row can never be published; parked with its error");
        let error = format!("permanent: cannot be published: {why}");
        let held = relay.store.outbox_park(row.id, owner, &error).await?;
        lease_lost_unless(held, row);
        return Ok(());
    }
    let delay = retry::ROW_PUBLISH.delay_after(u32::try_from(attempts).unwrap_or(u32::MAX));
    let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    tracing::warn!(event_id = %row.event.event_id, exchange = %row.event.exchange, routing_key = %row.event.routing_key, attempts, %error, "outbox publish failed; the row stays pending");
    let held = relay
        .store
        .outbox_mark_failed(row.id, owner, &error.to_string(), delay_ms)
        .await?;
    lease_lost_unless(held, row);
    Ok(())
}

/// A failure recorded for a row whose lease another relay took meanwhile is dropped: that
/// relay owns the row now.
fn lease_lost_unless(held: bool, row: &OutboxRow) {
    if !held {
        tracing::warn!(event_id = %row.event.event_id, "outbox row's lease ran out before its failure was recorded; another relay owns it now");
    }
}
