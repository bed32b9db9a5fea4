//! The polling feed: rows leased from the source, one session at a time over one broker
//! connection, under one lease owner name that is never reused.
//!
//! A session claims rows whenever its window (`max_in_flight`) has room, without waiting
//! for earlier rows to finish: a claim may return later rows of a key whose earlier rows
//! this session is still publishing, and they join that key's chain. Confirmed rows go to
//! the marker; failed rows are recorded (attempts, error, backoff) one by one, with no claim
//! running meanwhile, before the rest of their chain is handed back — so a claim never
//! returns a row whose earlier row of the same key failed but is not yet in backoff.
//!
//! With immediate dispatch (`Settings::handoff`, Carteiro's own outbox inside `carteiro
//! run`), a session also takes the rows the in-process committer hands over: they were
//! inserted leased to this session's owner, so they join the chains exactly as claimed rows
//! do. They are taken before any claim result, so a claim can never overtake a handed row.
//!
//! A session ends on `stop`, a lost broker or a store error. It then drops the rows it has
//! not started, lets the publishes in flight finish, marks what was confirmed, and only then
//! gives its leases back (a row confirmed but not yet marked must not be freed for another
//! relay to publish again). A lease it cannot give back expires; because the next session
//! has a new owner name, such rows keep holding back the later rows of their key.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::chains::{Chains, HeldBytes, Leased, row_bytes};
use super::marker::{MarkSender, Marker};
use super::publish::{Confirms, KeyDone, KeyPublisher, OnFailure, Unfenced, record_leased_failure};
use super::source::Source;
use super::{Settings, sleep_or_stop};
use crate::broker::{ConfirmedPublisher, PublishError};
use crate::common::retry;
use crate::store::{Handed, OutboxRow, Room, StoreError};

/// Polls `source` until `stop` (also the CDC relay's backlog drain): reconnects to the broker
/// with backoff and runs one session after another.
pub(super) async fn run<S: Source>(settings: &Settings, source: &S, stop: &CancellationToken) {
    let stop = stop.clone();
    tokio::spawn(forward_wakeups(
        source.clone(),
        settings.wake.clone(),
        stop.clone(),
    ));
    let mut backoff = retry::reconnect(settings.reconnect_max).backoff();
    let mut publisher: Option<ConfirmedPublisher> = None;
    while !stop.is_cancelled() {
        let current = match publisher.as_ref().filter(|p| p.is_connected()) {
            Some(p) => p.clone(),
            None => match settings.open_publisher().await {
                Ok(p) => {
                    tracing::info!("outbox relay running");
                    backoff.reset();
                    publisher = Some(p.clone());
                    p
                }
                Err(e) => {
                    tracing::warn!(error = %e, "relay cannot reach the broker; rows wait");
                    sleep_or_stop(backoff.next_delay(), &stop).await;
                    continue;
                }
            },
        };
        let (end, progressed) = Session::new(settings, source, current).run(&stop).await;
        // A session that published rows before it ended was not a failure to retry
        // slower and slower: one bad spell must not leave every later restart waiting
        // the longest delay.
        if progressed {
            backoff.reset();
        }
        match end {
            End::Stopped => break,
            End::Broker(e) => {
                tracing::warn!(error = %e, "relay lost the broker; reconnecting");
                settings.metrics.broker_reconnect("relay");
                publisher = None;
            }
            End::Store(e) => {
                tracing::warn!(error = %e, "relay cannot reach the store; retrying");
            }
        }
        sleep_or_stop(backoff.next_delay(), &stop).await;
    }
}

/// The next rows handed over, or never when immediate dispatch is off.
async fn recv_handed(handed: &mut Option<UnboundedReceiver<Handed>>) -> Option<Handed> {
    match handed {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Wakes the relay on the source's commit wake-ups (other processes' commits), until `stop`.
async fn forward_wakeups<S: Source>(
    source: S,
    wake: std::sync::Arc<tokio::sync::Notify>,
    stop: CancellationToken,
) {
    let mut wakeups = source.wakeups();
    loop {
        tokio::select! {
            () = wakeups.next() => wake.notify_one(),
            () = stop.cancelled() => return,
        }
    }
}

/// Why a session ended.
enum End {
    /// Asked to stop.
    Stopped,
    /// The broker connection is gone: reconnect.
    Broker(String),
    /// The store failed: wait and start a new session.
    Store(StoreError),
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

struct Session<'a, S> {
    settings: &'a Settings,
    source: &'a S,
    publisher: ConfirmedPublisher,
    owner: String,
    chains: Chains,
    publishing: FuturesUnordered<tokio::task::JoinHandle<KeyDone>>,
    failures: Vec<Failure>,
    /// Rows leased and not settled: waiting, publishing, awaiting their mark or failing.
    window: usize,
    /// Bytes of the leased rows still in memory (waiting, publishing or failing).
    held: HeldBytes,
    /// The last claim probably stopped at its byte budget: claim again once bytes free up.
    byte_capped: bool,
    /// Some row was marked published: the relay's reconnect backoff starts over.
    progressed: bool,
    /// The window's row count, shared with the committer (immediate dispatch's room).
    shared_window: Arc<AtomicUsize>,
    /// Rows handed over and not yet taken, counted by the committer.
    handed_queued: Arc<AtomicUsize>,
}

impl<'a, S: Source> Session<'a, S> {
    fn new(settings: &'a Settings, source: &'a S, publisher: ConfirmedPublisher) -> Self {
        Self {
            settings,
            source,
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
            shared_window: Arc::default(),
            handed_queued: Arc::default(),
        }
    }

    /// Runs the session until it ends; also says whether it marked any row published.
    async fn run(mut self, stop: &CancellationToken) -> (End, bool) {
        tracing::debug!(owner = %self.owner, "relay session started");
        let (marker, mut marked) = Marker::spawn(self.source.clone());
        let publisher = self.key_publisher(marker.sender());
        let mut handed = self.open_handoff().await;
        let mut claim: Option<Claim> = None;
        let mut want_claim = true;
        let poll = self.settings.poll_interval;
        let poll_timer = tokio::time::sleep(poll);
        tokio::pin!(poll_timer);
        let end = loop {
            if claim.is_none()
                && !self.failures.is_empty()
                && let Err(e) = self.settle_failures().await
            {
                break End::Store(e);
            }
            if claim.is_none() && want_claim && self.room() >= self.min_claim() && self.bytes_room()
            {
                want_claim = false;
                self.byte_capped = false;
                claim = Some(self.claim());
            }
            self.shared_window.store(self.window, Ordering::Relaxed);
            tokio::select! {
                // First: a handed row must join its chain before any claim result (module doc).
                biased;
                Some(rows) = recv_handed(&mut handed) => self.take_handed(rows, &publisher),
                Some(joined) = self.publishing.next(), if !self.publishing.is_empty() => {
                    let end = match joined {
                        Ok(done) => self.finished(done, &publisher),
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
                            if self.settings.handoff.is_some() {
                                self.settings.metrics.outbox.claimed.inc_by(rows.len() as u64);
                            }
                            self.admit(rows, done.at, &publisher);
                        }
                        Err(e) => break End::Store(e),
                    }
                }
                Some(ids) = marked.recv() => {
                    self.progressed = true;
                    self.window = self.window.saturating_sub(ids.len());
                    want_claim |= self.byte_capped;
                }
                () = self.settings.wake.notified() => want_claim = true,
                () = &mut poll_timer => {
                    want_claim = true;
                    poll_timer.as_mut().reset(Instant::now() + poll);
                }
                () = stop.cancelled() => break End::Stopped,
            }
        };
        let progressed = self.progressed;
        self.quiesce(claim, handed, marker, publisher, &end).await;
        (end, progressed)
    }

    /// Opens immediate dispatch to this session, when the relay has it.
    async fn open_handoff(&self) -> Option<UnboundedReceiver<Handed>> {
        let handoff = self.settings.handoff.as_ref()?;
        let room = Room {
            window: self.shared_window.clone(),
            bytes: self.held.shared(),
            queued: self.handed_queued.clone(),
            max_rows: self.settings.max_in_flight,
            max_bytes: self.settings.max_in_flight_bytes,
        };
        Some(handoff.open(&self.owner, self.settings.lease, room).await)
    }

    /// Ends immediate dispatch to this session: once it returns, no commit leases rows to
    /// this owner any more. Rows handed and not taken stay leased to it: the session's end
    /// gives them back with the rest.
    async fn close_handoff(&self, handed: Option<UnboundedReceiver<Handed>>) {
        let (Some(handoff), Some(mut handed)) = (self.settings.handoff.as_ref(), handed) else {
            return;
        };
        handoff.close(&self.owner).await;
        handed.close();
        let mut dropped = 0;
        while let Ok(rows) = handed.try_recv() {
            dropped += rows.rows.len();
        }
        tracing::debug!(owner = %self.owner, dropped, "immediate dispatch closed");
    }

    /// Rows a commit handed over, leased to this session: each starts now or joins its chain.
    fn take_handed(&mut self, handed: Handed, publisher: &KeyPublisher<S, Unfenced>) {
        let n = handed.rows.len();
        self.settings.metrics.outbox.handed.inc_by(n as u64);
        self.admit(handed.rows, Instant::from_std(handed.began), publisher);
        self.handed_queued.fetch_sub(n, Ordering::Relaxed);
    }

    /// What each key's publishing task gets: this session's publisher, handing failures back.
    fn key_publisher(&self, marks: MarkSender) -> KeyPublisher<S, Unfenced> {
        let confirms = Confirms {
            marks,
            settled: None,
        };
        let (settings, source) = (self.settings, self.source);
        KeyPublisher::new(
            settings,
            source,
            &self.publisher,
            confirms,
            Unfenced,
            OnFailure::HandBack,
        )
    }

    fn room(&self) -> usize {
        self.settings.max_in_flight.saturating_sub(self.window)
    }

    /// Claims are worth a query only for a good share of the window.
    fn min_claim(&self) -> usize {
        (self.settings.max_in_flight / 4).max(1)
    }

    /// Room for a claim in bytes: a quarter of the byte window free, or nothing held (a
    /// claim always takes at least one row, however large).
    fn bytes_room(&self) -> bool {
        let held = self.held.get();
        held == 0
            || self.settings.max_in_flight_bytes.saturating_sub(held)
                >= self.settings.max_in_flight_bytes / 4
    }

    fn claim(&self) -> Claim {
        let limit = self.room();
        let max_bytes = self
            .settings
            .max_in_flight_bytes
            .saturating_sub(self.held.get())
            .max(1);
        let source = self.source.clone();
        let owner = self.owner.clone();
        let lease = self.settings.lease;
        Claim {
            rows: Box::pin(async move { source.claim(limit, max_bytes, &owner, lease).await }),
            at: Instant::now(),
            limit,
            max_bytes,
        }
    }

    /// Rows of a claim (id order): each starts now or joins its key's chain.
    fn admit(
        &mut self,
        rows: Vec<OutboxRow>,
        claimed_at: Instant,
        publisher: &KeyPublisher<S, Unfenced>,
    ) {
        // Starting later than this, the publish could outlast the lease.
        let start_by = claimed_at + self.settings.lease
            - self.settings.publish_timeout
            - Duration::from_secs(1).min(self.settings.publish_timeout);
        self.window += rows.len();
        let mut starting = Vec::new();
        for row in rows {
            let leased = Leased {
                _held: self.held.hold(&row),
                row,
                start_by: Some(start_by.into_std()),
            };
            if let Some(now) = self.chains.admit(leased) {
                starting.push(now);
            }
        }
        for first in starting {
            let mut batch = self.chains.take_waiting(&first.row.event.ordering_key);
            batch.insert(0, first);
            self.publishing.push(publisher.spawn(batch, false));
        }
    }

    /// A key's batch ended. Returns why the session must end, if it must.
    fn finished(&mut self, done: KeyDone, publisher: &KeyPublisher<S, Unfenced>) -> Option<End> {
        match done.failed {
            None => {
                let next = self.chains.next_batch(&done.key);
                if !next.is_empty() {
                    self.publishing.push(publisher.spawn(next, false));
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

    /// Records each failure in the source, then gives back the rows that waited behind it.
    /// Runs only while no claim is running, so the next claim sees the failed row in backoff.
    async fn settle_failures(&mut self) -> Result<(), StoreError> {
        for Failure { leased, error } in std::mem::take(&mut self.failures) {
            let row = &leased.row;
            let mut give_back = Vec::new();
            match error {
                Some(error) => self.record(row, &error).await?,
                None => {
                    tracing::warn!(event_id = %row.event.event_id, "outbox row not published before its lease ran low; giving it back");
                    give_back.push(row.id);
                }
            }
            let waiting = self.chains.settle(&row.event.ordering_key);
            give_back.extend(waiting.iter().map(|l| l.row.id));
            self.source.release_rows(&self.owner, &give_back).await?;
            self.window = self.window.saturating_sub(1 + waiting.len());
        }
        Ok(())
    }

    async fn record(&self, row: &OutboxRow, error: &PublishError) -> Result<(), StoreError> {
        let metrics = &self.settings.metrics;
        record_leased_failure(self.source, metrics, &self.owner, row, error).await
    }

    /// Session end: see the module doc.
    async fn quiesce(
        mut self,
        claim: Option<Claim>,
        handed: Option<UnboundedReceiver<Handed>>,
        marker: Marker,
        publisher: KeyPublisher<S, Unfenced>,
        end: &End,
    ) {
        let dropped = self.chains.clear();
        if let Some(claim) = claim {
            // Let it finish: its rows are then leased by this owner and given back below.
            let _ = claim.rows.await;
        }
        // Only after the claim: a commit waiting for SQLite's one writer, which an unfinished
        // claim holds, would keep the hand-off from closing.
        self.close_handoff(handed).await;
        // Confirmed rows reach the marker from the tasks themselves.
        while let Some(joined) = self.publishing.next().await {
            let Ok(KeyDone {
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
                    let _ = self.record(&leased.row, &error).await;
                }
            }
        }
        // Marks first: a confirmed row must not be freed for another relay to publish again.
        drop(publisher);
        marker.close().await;
        match self.source.release(&self.owner).await {
            Ok(released) => {
                tracing::debug!(owner = %self.owner, released, dropped, "relay session ended")
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not give leases back; they expire on their own")
            }
        }
    }
}
