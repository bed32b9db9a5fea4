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

use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;

use super::chains::{Chains, Leased};
use super::marker::Marker;
use super::{Relay, outgoing};
use crate::broker::{ConfirmedPublisher, PublishError};
use crate::pipeline::headers::now_ms;
use crate::pipeline::{FaultPoint, hang_if};
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

type Publishing = BoxFuture<'static, (Leased, Result<(), PublishError>)>;
type ClaimResult = Result<Vec<OutboxRow>, StoreError>;

/// A claim running in the background, started at `at` for up to `limit` rows.
struct Claim {
    rows: BoxFuture<'static, ClaimResult>,
    at: Instant,
    limit: usize,
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
        }
    }

    pub async fn run(mut self, stop: &tokio_util::sync::CancellationToken) -> End {
        tracing::debug!(owner = %self.owner, "relay session started");
        let (marker, mut marked) = Marker::spawn(self.relay.store.clone());
        let mut claim: Option<Claim> = None;
        let mut want_claim = true;
        let poll = self.relay.poll_interval;
        let mut next_poll = Instant::now() + poll;
        let end = loop {
            if claim.is_none() && !self.failures.is_empty() {
                if let Err(e) = self.settle_failures().await {
                    break End::Store(e.to_string());
                }
            }
            if claim.is_none() && want_claim && self.room() >= self.min_claim() {
                want_claim = false;
                claim = Some(self.claim());
            }
            tokio::select! {
                Some((leased, result)) = self.publishing.next(), if !self.publishing.is_empty() => {
                    if let Some(end) = self.published(leased, result, &marker) {
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
                            self.admit(rows, done.at);
                        }
                        Err(e) => break End::Store(e.to_string()),
                    }
                }
                Some(n) = marked.recv() => self.window = self.window.saturating_sub(n),
                () = self.relay.wake.notified() => want_claim = true,
                () = tokio::time::sleep_until(next_poll) => {
                    want_claim = true;
                    next_poll = Instant::now() + poll;
                }
                () = stop.cancelled() => break End::Stopped,
            }
        };
        self.quiesce(claim, marker, &end).await;
        end
    }

    fn room(&self) -> usize {
        self.relay.max_in_flight.saturating_sub(self.window)
    }

    /// Claims are worth a query only for a good share of the window.
    fn min_claim(&self) -> usize {
        (self.relay.max_in_flight / 4).max(1)
    }

    fn claim(&self) -> Claim {
        let limit = self.room();
        let store = self.relay.store.clone();
        let owner = self.owner.clone();
        let lease_ms = i64::try_from(self.relay.lease.as_millis()).unwrap_or(i64::MAX);
        let rows_limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Claim {
            rows: Box::pin(async move { store.outbox_pending(rows_limit, &owner, lease_ms).await }),
            at: Instant::now(),
            limit,
        }
    }

    /// Rows of a claim (id order): each starts now or joins its key's chain.
    fn admit(&mut self, rows: Vec<OutboxRow>, claimed_at: Instant) {
        // Starting later than this, the publish could outlast the lease.
        let start_by = claimed_at + self.relay.lease
            - self.relay.publish_timeout
            - Duration::from_secs(1).min(self.relay.publish_timeout);
        self.window += rows.len();
        for row in rows {
            let leased = Leased {
                row,
                start_by: start_by.into_std(),
            };
            if let Some(now) = self.chains.admit(leased) {
                self.start(now);
            }
        }
    }

    fn start(&mut self, leased: Leased) {
        if std::time::Instant::now() > leased.start_by {
            self.chains.stop(&leased.row.ordering_key);
            self.failures.push(Failure {
                leased,
                error: None,
            });
            return;
        }
        let publisher = self.publisher.clone();
        let timeout = self.relay.publish_timeout;
        let fault = self.relay.fault;
        self.publishing.push(Box::pin(async move {
            let result = publisher.publish(outgoing(&leased.row), timeout).await;
            if result.is_ok() {
                // Test-only: stop dead after this row's confirm, before its mark.
                hang_if(fault, FaultPoint::RelayHangAfterConfirm).await;
            }
            (leased, result)
        }));
    }

    /// One publish ended. Returns why the session must end, if it must.
    fn published(
        &mut self,
        leased: Leased,
        result: Result<(), PublishError>,
        marker: &Marker,
    ) -> Option<End> {
        match result {
            Ok(()) => {
                self.relay.metrics.outbox_published.inc();
                marker.confirmed(leased.row.id);
                if let Some(next) = self.chains.confirmed(&leased.row.ordering_key) {
                    self.start(next);
                }
                None
            }
            // The row stays leased; the session end gives it back.
            Err(PublishError::ChannelClosed(e)) if !self.publisher.is_connected() => {
                Some(End::Broker(e))
            }
            Err(error) => {
                self.chains.stop(&leased.row.ordering_key);
                self.failures.push(Failure {
                    leased,
                    error: Some(error),
                });
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
                Some(error) => record_failure(self.relay, row, &error).await?,
                None => {
                    tracing::warn!(event_id = %row.event_id, "outbox row not published before its lease ran low; giving it back");
                    give_back.push(row.id);
                }
            }
            let waiting = self.chains.settle(&row.ordering_key);
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
    async fn quiesce(mut self, claim: Option<Claim>, marker: Marker, end: &End) {
        let dropped = self.chains.clear();
        if let Some(claim) = claim {
            // Let it finish: its rows are then leased by this owner and given back below.
            let _ = claim.rows.await;
        }
        while let Some((leased, result)) = self.publishing.next().await {
            match result {
                Ok(()) => {
                    self.relay.metrics.outbox_published.inc();
                    marker.confirmed(leased.row.id);
                }
                Err(PublishError::ChannelClosed(_)) if !self.publisher.is_connected() => {}
                Err(error) => self.failures.push(Failure {
                    leased,
                    error: Some(error),
                }),
            }
        }
        if !matches!(end, End::Store(_)) {
            for Failure { leased, error } in std::mem::take(&mut self.failures) {
                if let Some(error) = error {
                    // Best effort: if it fails, the row is given back below without backoff.
                    let _ = record_failure(self.relay, &leased.row, &error).await;
                }
            }
        }
        // Marks first: a confirmed row must not be freed for another relay to publish again.
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

/// Counts the failed attempt, keeps the error, backs the row off (its lease ends).
async fn record_failure(
    relay: &Relay,
    row: &OutboxRow,
    error: &PublishError,
) -> Result<(), StoreError> {
    relay.metrics.outbox_failed.inc();
    let attempts = row.attempts + 1;
    let delay_ms = (500_i64 << attempts.clamp(0, 7)).min(60_000);
    tracing::warn!(event_id = %row.event_id, exchange = %row.exchange, routing_key = %row.routing_key, attempts, %error, "outbox publish failed; the row stays pending");
    relay
        .store
        .outbox_mark_failed(row.id, &error.to_string(), now_ms() + delay_ms)
        .await
}
