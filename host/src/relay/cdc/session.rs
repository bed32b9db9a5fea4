//! One replication session: reads commits from the slot (while the window has room), hands
//! each outbox row to its ordering key's chain as it is read (one publishing task per key at
//! a time, rows in commit order; each unordered row on its own), sends confirmed ids to the
//! marker, and reports to the slot the end of the newest commit settled in full along with
//! every earlier one.
//!
//! Rows are admitted one by one, not a transaction at a time, and reading stops while the
//! window (`max_in_flight`, `max_in_flight_bytes`) is full, even inside a transaction: a
//! commit of any size holds at most the window in memory, plus the replication client's small
//! read-ahead ([`super::conn`]).
//!
//! A failed publish (nack, unroutable, timeout) is recorded in the table (attempts, error)
//! and retried with backoff in memory: it holds only its own key's later rows, and the slot
//! position, which is what makes WAL pile up while the broker is down. A row AMQP can never
//! carry is parked (as the polling relay parks it): a keyed row holds its key's later rows,
//! parked behind it; an unordered row holds nothing.
//!
//! Every publish first asks the session's [`Fence`] whether the slot is still this session's.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use tokio_util::sync::CancellationToken;

use super::fence::{Fence, SlotLost};
use super::pgoutput::{self, Message, Relations};
use super::window::CommitWindow;
use crate::broker::{ConfirmedPublisher, MAX_BATCH, Outgoing, PublishError};
use crate::common::retry;
use crate::relay::chains::row_bytes;
use crate::relay::marker::{MarkSender, Marker};
use crate::relay::{Relay, outgoing};
use crate::store::{OutboxRow, Store};

/// Rows of a re-sent commit whose state in the table is read with one query.
const RECHECK_CHUNK: usize = 64;

/// Why a session ended.
pub(super) enum End {
    Stopped,
    Broker(String),
    Stream(String),
    Store(String),
    /// Another relay reads the slot now.
    Fenced(String),
}

/// How one key's batch ended.
struct KeyDone {
    key: String,
    /// Rows parked (never publishable, or behind such a row): settled.
    parked: Vec<i64>,
    /// The broker connection is gone.
    broker_lost: Option<String>,
    /// The slot is no longer this session's: nothing was published after that was known.
    fenced: Option<SlotLost>,
}

impl KeyDone {
    fn new(key: String) -> Self {
        Self {
            key,
            parked: Vec::new(),
            broker_lost: None,
            fenced: None,
        }
    }
}

/// What a key's publishing task needs from its session.
#[derive(Clone)]
struct Publishing {
    publisher: ConfirmedPublisher,
    store: Store,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    telemetry: crate::telemetry::Telemetry,
    timeout: Duration,
    marks: MarkSender,
    confirmed: tokio::sync::mpsc::UnboundedSender<i64>,
    fence: Fence,
}

pub(super) struct Session<'a> {
    relay: &'a Relay,
    publisher: ConfirmedPublisher,
    client: ReplicationClient,
    fence: Fence,
    /// Commits ending at or before this were maybe published already by a predecessor.
    recheck_until: u64,
    /// The open transaction is one of those: its rows wait in `to_check` for a look at the
    /// table before they go out.
    recheck: bool,
    to_check: Vec<OutboxRow>,
    relations: Relations,
    window: CommitWindow,
    bytes: HashMap<i64, u64>,
    /// Bytes of the rows read and not settled (or dropped as published already).
    held_bytes: u64,
    /// Per key: rows waiting while a batch of that key publishes.
    waiting: HashMap<String, VecDeque<OutboxRow>>,
    publishing: FuturesUnordered<tokio::task::JoinHandle<KeyDone>>,
    parked: HashSet<String>,
    /// Rows the broker confirmed, from the publish tasks: the slot may move past their
    /// commits at once. Their marks follow; a row confirmed and not marked when the relay
    /// dies is published again by the next start's backlog drain (the one duplicate window).
    /// Waiting for the mark instead held a PostgreSQL shutdown: its walsender waits for the
    /// slot's position while the mark's database write is refused.
    confirmed_tx: tokio::sync::mpsc::UnboundedSender<i64>,
    confirmed_rx: tokio::sync::mpsc::UnboundedReceiver<i64>,
}

impl<'a> Session<'a> {
    pub fn new(
        relay: &'a Relay,
        publisher: ConfirmedPublisher,
        client: ReplicationClient,
        fence: Fence,
        recheck_until: u64,
    ) -> Self {
        let (confirmed_tx, confirmed_rx) = tokio::sync::mpsc::unbounded_channel();
        Self {
            relay,
            publisher,
            client,
            fence,
            recheck_until,
            recheck: false,
            to_check: Vec::new(),
            relations: Relations::default(),
            window: CommitWindow::default(),
            bytes: HashMap::new(),
            held_bytes: 0,
            waiting: HashMap::new(),
            publishing: FuturesUnordered::new(),
            confirmed_tx,
            confirmed_rx,
            parked: HashSet::new(),
        }
    }

    pub async fn run(mut self, stop: &CancellationToken) -> End {
        match self.relay.store.outbox_parked_keys().await {
            Ok(keys) => self.parked = keys.into_iter().collect(),
            Err(e) => return End::Store(e.to_string()),
        }
        let (marker, mut marked) = Marker::spawn(self.relay.store.clone());
        let marks = marker.sender();
        let end = loop {
            let room = self.window.rows_in_flight() + self.to_check.len()
                < self.relay.max_in_flight
                && self.held_bytes < self.relay.max_in_flight_bytes;
            tokio::select! {
                event = self.client.recv(), if room => {
                    match event {
                        Ok(Some(event)) => {
                            if let Err(end) = self.event(event, &marks).await {
                                break end;
                            }
                        }
                        Ok(None) => break End::Stream("the replication stream ended".into()),
                        Err(e) => break End::Stream(e.to_string()),
                    }
                }
                Some(joined) = self.publishing.next(), if !self.publishing.is_empty() => {
                    match joined {
                        Ok(done) => {
                            if let Some(e) = done.broker_lost {
                                break End::Broker(e);
                            }
                            if let Some(lost) = done.fenced {
                                break End::Fenced(lost.to_string());
                            }
                            if !done.parked.is_empty() && !done.key.is_empty() {
                                self.parked.insert(done.key.clone());
                            }
                            self.settle(&done.parked);
                            self.next_batch(done.key, &marks);
                        }
                        Err(e) => break End::Broker(format!("a publish task failed: {e}")),
                    }
                }
                Some(id) = self.confirmed_rx.recv() => self.settle(&[id]),
                // Marks only free the marker's queue; the slot moved at the confirm.
                Some(_) = marked.recv() => {}
                () = stop.cancelled() => break End::Stopped,
            }
        };
        // Publishes in flight are abandoned: what they had confirmed is with the marker; the
        // rest the slot sends again to the next session.
        for task in self.publishing.iter() {
            task.abort();
        }
        drop(marks);
        marker.close().await;
        while let Ok(id) = self.confirmed_rx.try_recv() {
            self.settle(&[id]);
        }
        // The worker sends the last position within its status interval; give it that.
        tokio::time::sleep(super::conn::STATUS_INTERVAL).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.client.shutdown()).await;
        end
    }

    /// Rows `ids` are settled (confirmed, or parked): the slot may move past their commits.
    fn settle(&mut self, ids: &[i64]) {
        for id in ids {
            self.window.settle(*id);
            if let Some(b) = self.bytes.remove(id) {
                self.held_bytes = self.held_bytes.saturating_sub(b);
            }
        }
        self.report_progress();
    }

    fn report_progress(&mut self) {
        if let Some(lsn) = self.window.advance() {
            self.client.update_applied_lsn(Lsn::from_u64(lsn));
        }
    }

    async fn event(&mut self, event: ReplicationEvent, marks: &MarkSender) -> Result<(), End> {
        match event {
            ReplicationEvent::Begin { final_lsn, .. } => {
                self.window.begin();
                // `final_lsn` (where the commit record starts) is before the commit's end, so
                // this rechecks every commit that ends at or before `recheck_until`.
                self.recheck = final_lsn.as_u64() <= self.recheck_until;
            }
            ReplicationEvent::XLogData { data, .. } => {
                match pgoutput::decode(&data).map_err(|e| End::Stream(e.to_string()))? {
                    Message::Relation(relation) => self.relations.remember(relation),
                    Message::Insert { relation, values } => {
                        let relation = self
                            .relations
                            .get(relation)
                            .map_err(|e| End::Stream(e.to_string()))?;
                        if relation.name == "outbox" {
                            let row = pgoutput::outbox_row(relation, &values)
                                .map_err(|e| End::Stream(e.to_string()))?;
                            self.read(row, marks).await?;
                        }
                    }
                    Message::Other => {}
                }
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                self.flush_rechecks(marks).await?;
                self.window.commit(end_lsn.as_u64());
                self.report_progress();
            }
            // Nothing read and unsettled: everything the server sent up to here is done,
            // also WAL of other tables and of the relay's own marks.
            ReplicationEvent::KeepAlive { wal_end, .. } if self.window.commits() == 0 => {
                self.client.update_applied_lsn(wal_end);
            }
            _ => {}
        }
        Ok(())
    }

    /// A row read from the slot: it goes out now, or after a look at the table when its
    /// commit may have been published by a predecessor.
    async fn read(&mut self, row: OutboxRow, marks: &MarkSender) -> Result<(), End> {
        self.held_bytes += row_bytes(&row);
        if !self.recheck {
            self.take(row, marks);
            return Ok(());
        }
        self.to_check.push(row);
        if self.to_check.len() >= RECHECK_CHUNK || self.held_bytes >= self.relay.max_in_flight_bytes
        {
            self.flush_rechecks(marks).await?;
        }
        Ok(())
    }

    /// Publishes the rows waiting in `to_check` that are still unpublished in the table.
    async fn flush_rechecks(&mut self, marks: &MarkSender) -> Result<(), End> {
        if self.to_check.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(&mut self.to_check);
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let open = self
            .relay
            .store
            .outbox_unpublished_among(&ids)
            .await
            .map_err(|e| End::Store(e.to_string()))?;
        for row in rows {
            if open.binary_search(&row.id).is_ok() {
                self.take(row, marks);
            } else {
                self.held_bytes = self.held_bytes.saturating_sub(row_bytes(&row));
            }
        }
        Ok(())
    }

    /// A row of the open commit joins the window and its chain.
    fn take(&mut self, row: OutboxRow, marks: &MarkSender) {
        self.window.add(row.id);
        self.bytes.insert(row.id, row_bytes(&row));
        let key = row.event.ordering_key.clone();
        // Unordered rows never wait for one another: one bad row holds nothing back.
        if key.is_empty() {
            self.start(key, vec![row], marks);
            return;
        }
        if let Some(queue) = self.waiting.get_mut(&key) {
            queue.push_back(row);
            return;
        }
        self.waiting.insert(key.clone(), VecDeque::new());
        self.start(key, vec![row], marks);
    }

    /// `key`'s batch ended: the rows that waited meanwhile go next, or the chain ends.
    fn next_batch(&mut self, key: String, marks: &MarkSender) {
        let next: Vec<OutboxRow> = match self.waiting.get_mut(&key) {
            Some(queue) => queue.drain(..).collect(),
            None => Vec::new(),
        };
        if next.is_empty() {
            self.waiting.remove(&key);
        } else {
            self.start(key, next, marks);
        }
    }

    fn start(&mut self, key: String, rows: Vec<OutboxRow>, marks: &MarkSender) {
        let parked = !key.is_empty() && self.parked.contains(&key);
        let ctx = Publishing {
            publisher: self.publisher.clone(),
            store: self.relay.store.clone(),
            metrics: self.relay.metrics.clone(),
            telemetry: self.relay.telemetry.clone(),
            timeout: self.relay.publish_timeout,
            marks: marks.clone(),
            confirmed: self.confirmed_tx.clone(),
            fence: self.fence.clone(),
        };
        self.publishing
            .push(tokio::spawn(publish_key(ctx, key, rows.into(), parked)));
    }
}

/// Publishes `rows` of `key` in order, in runs, retrying a failed run's rest after a backoff.
async fn publish_key(
    mut ctx: Publishing,
    key: String,
    mut rows: VecDeque<OutboxRow>,
    parked: bool,
) -> KeyDone {
    let mut done = KeyDone::new(key);
    if parked {
        park_all(
            &ctx,
            rows,
            "held behind a parked row of its ordering key",
            &mut done,
        )
        .await;
        return done;
    }
    let mut attempts: u32 = 0;
    while !rows.is_empty() {
        let (run, messages, invalid) = next_run(&mut rows);
        if run.is_empty() {
            // The head row can never be published: park it and, for a keyed row, its key's
            // rows behind it (an unordered row's batch is itself alone).
            let why = invalid.unwrap_or_default();
            if let Some(head) = rows.front() {
                tracing::error!(event_id = %head.event.event_id, %why, "outbox row can never be published; parked with its error");
            }
            ctx.metrics.outbox.failed.inc();
            let error = format!("permanent: cannot be published: {why}");
            park_all(&ctx, rows, &error, &mut done).await;
            return done;
        }
        if let Err(lost) = ctx.fence.admit().await {
            done.fenced = Some(lost);
            return done;
        }
        let results = ctx
            .telemetry
            .publish_run(
                run.iter(),
                ctx.publisher.publish_in_order(messages, ctx.timeout),
            )
            .await;
        let (retry, failure) = settle_run(&ctx, run, results);
        let Some(error) = failure else {
            attempts = 0;
            continue;
        };
        if matches!(error, PublishError::ChannelClosed(_)) && !ctx.publisher.is_connected() {
            done.broker_lost = Some(error.to_string());
            return done;
        }
        for row in retry.into_iter().rev() {
            rows.push_front(row);
        }
        if let PublishError::Invalid(why) = &error {
            // The publisher refused it (a routing key over 255 bytes, headers over
            // frame_max): as permanent as a row `outgoing` refuses.
            tracing::error!(event_id = ?rows.front().map(|r| r.event.event_id), %why, "outbox row can never be published; parked with its error");
            ctx.metrics.outbox.failed.inc();
            let error = format!("permanent: cannot be published: {why}");
            park_all(&ctx, rows, &error, &mut done).await;
            return done;
        }
        // Retry the failed row (and what followed it) in order after a backoff.
        attempts += 1;
        ctx.metrics.outbox.failed.inc();
        if let Some(first) = rows.front() {
            tracing::warn!(event_id = %first.event.event_id, exchange = %first.event.exchange, routing_key = %first.event.routing_key, attempts, %error, "outbox publish failed; retrying (its key and the slot wait)");
            let _ = ctx
                .store
                .outbox_record_failure(first.id, &error.to_string(), false)
                .await;
        }
        tokio::time::sleep(retry::ROW_PUBLISH.delay_after(attempts)).await;
    }
    done
}

/// Takes a run off the head of `rows`: rows for one exchange, at most [`MAX_BATCH`], all AMQP
/// can carry. An empty run: the head row cannot be carried (the error says why).
fn next_run(rows: &mut VecDeque<OutboxRow>) -> (Vec<OutboxRow>, Vec<Outgoing>, Option<String>) {
    let mut run: Vec<OutboxRow> = Vec::new();
    let mut messages = Vec::new();
    while let Some(head) = rows.front() {
        let same = run
            .first()
            .is_none_or(|f| f.event.exchange == head.event.exchange);
        if run.len() == MAX_BATCH || !same {
            break;
        }
        match outgoing(head) {
            Ok(m) => {
                messages.push(m);
                run.extend(rows.pop_front());
            }
            Err(e) => return (run, messages, Some(e.to_string())),
        }
    }
    (run, messages, None)
}

/// Confirmed rows of a run go to the marker (also those behind a failed row: they reached
/// their queues); returns the rows to send again, in order, and the first failure.
fn settle_run(
    ctx: &Publishing,
    run: Vec<OutboxRow>,
    results: Vec<Result<(), PublishError>>,
) -> (Vec<OutboxRow>, Option<PublishError>) {
    let mut results = results.into_iter();
    let mut retry = Vec::new();
    let mut failure = None;
    for row in run {
        match results.next() {
            Some(Ok(())) => {
                ctx.metrics.outbox.published.inc();
                ctx.marks.confirmed(row.id);
                let _ = ctx.confirmed.send(row.id);
            }
            Some(Err(e)) if failure.is_none() => {
                failure = Some(e);
                retry.push(row);
            }
            _ => retry.push(row),
        }
    }
    (retry, failure)
}

/// Parks every row of `rows` with `error`; they are settled.
async fn park_all(ctx: &Publishing, rows: VecDeque<OutboxRow>, error: &str, done: &mut KeyDone) {
    for row in rows {
        let _ = ctx.store.outbox_record_failure(row.id, error, true).await;
        done.parked.push(row.id);
    }
}
