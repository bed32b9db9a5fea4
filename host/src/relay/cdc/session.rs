//! One replication session: reads commits from the slot (while the window has room), hands
//! each outbox row to its ordering key's chain (one publishing task per key at a time, rows
//! in commit order), sends confirmed ids to the marker, and reports to the slot the end of
//! the newest commit settled in full along with every earlier one.
//!
//! A failed publish (nack, unroutable, timeout) is recorded in the table (attempts, error)
//! and retried with backoff in memory: it holds only its own key's later rows, and the slot
//! position, which is what makes WAL pile up while the broker is down. A row AMQP can never
//! carry is parked (as the polling relay parks it) and so are its key's later rows.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use tokio_util::sync::CancellationToken;

use super::pgoutput::{self, Message, Relations};
use super::window::CommitWindow;
use crate::broker::{ConfirmedPublisher, MAX_BATCH, PublishError};
use crate::relay::chains::row_bytes;
use crate::relay::marker::{MarkSender, Marker};
use crate::relay::{Relay, outgoing};
use crate::store::OutboxRow;

/// Why a session ended.
pub(super) enum End {
    Stopped,
    Broker(String),
    Stream(String),
    Store(String),
}

/// How one key's batch ended.
struct KeyDone {
    key: String,
    /// Rows parked (never publishable, or behind such a row): settled.
    parked: Vec<i64>,
    /// The broker connection is gone.
    broker_lost: Option<String>,
}

pub(super) struct Session<'a> {
    relay: &'a Relay,
    publisher: ConfirmedPublisher,
    client: ReplicationClient,
    /// Commits ending at or before this were maybe published already by a predecessor.
    recheck_until: u64,
    relations: Relations,
    /// Rows of the transaction being read.
    txn: Vec<OutboxRow>,
    window: CommitWindow,
    bytes: HashMap<i64, u64>,
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
        recheck_until: u64,
    ) -> Self {
        let (confirmed_tx, confirmed_rx) = tokio::sync::mpsc::unbounded_channel();
        Self {
            relay,
            publisher,
            client,
            recheck_until,
            relations: Relations::default(),
            txn: Vec::new(),
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
            let room = self.window.rows_in_flight() < self.relay.max_in_flight
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
                            if !done.parked.is_empty() {
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
        if let Some(lsn) = self.window.advance() {
            self.client.update_applied_lsn(Lsn::from_u64(lsn));
        }
    }

    async fn event(&mut self, event: ReplicationEvent, marks: &MarkSender) -> Result<(), End> {
        match event {
            ReplicationEvent::Begin { .. } => self.txn.clear(),
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
                            self.txn.push(row);
                        }
                    }
                    Message::Other => {}
                }
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                let mut rows = std::mem::take(&mut self.txn);
                if end_lsn.as_u64() <= self.recheck_until && !rows.is_empty() {
                    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                    let open = self
                        .relay
                        .store
                        .outbox_unpublished_among(&ids)
                        .await
                        .map_err(|e| End::Store(e.to_string()))?;
                    rows.retain(|r| open.binary_search(&r.id).is_ok());
                }
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                self.window.push(end_lsn.as_u64(), &ids);
                for row in rows {
                    let b = row_bytes(&row);
                    self.held_bytes += b;
                    self.bytes.insert(row.id, b);
                    self.admit(row, marks);
                }
                if let Some(lsn) = self.window.advance() {
                    self.client.update_applied_lsn(Lsn::from_u64(lsn));
                }
            }
            // Nothing read and unsettled: everything the server sent up to here is done,
            // also WAL of other tables and of the relay's own marks.
            ReplicationEvent::KeepAlive { wal_end, .. }
                if self.window.commits() == 0 && self.txn.is_empty() =>
            {
                self.client.update_applied_lsn(wal_end);
            }
            _ => {}
        }
        Ok(())
    }

    /// A row of a commit: starts now, or waits behind its key's batch.
    fn admit(&mut self, row: OutboxRow, marks: &MarkSender) {
        let key = row.event.ordering_key.clone();
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
        let publisher = self.publisher.clone();
        let relay_store = self.relay.store.clone();
        let metrics = self.relay.metrics.clone();
        let telemetry = self.relay.telemetry.clone();
        let timeout = self.relay.publish_timeout;
        let marks = marks.clone();
        let confirmed = self.confirmed_tx.clone();
        self.publishing.push(tokio::spawn(async move {
            let mut rows: VecDeque<OutboxRow> = rows.into();
            let mut done = KeyDone {
                key,
                parked: Vec::new(),
                broker_lost: None,
            };
            if parked {
                for row in rows {
                    let why = "held behind a parked row of its ordering key";
                    let _ = relay_store.outbox_record_failure(row.id, why, true).await;
                    done.parked.push(row.id);
                }
                return done;
            }
            let mut attempts: u32 = 0;
            while !rows.is_empty() {
                // A run: rows of one exchange, at most MAX_BATCH, all AMQP can carry.
                let mut run = Vec::new();
                let mut messages = Vec::new();
                while let Some(head) = rows.front() {
                    let same = run
                        .first()
                        .is_none_or(|f: &OutboxRow| f.event.exchange == head.event.exchange);
                    if run.len() == MAX_BATCH || !same {
                        break;
                    }
                    match outgoing(head) {
                        Ok(m) => {
                            messages.push(m);
                            run.extend(rows.pop_front());
                        }
                        Err(e) if run.is_empty() => {
                            // Park it and everything of its key behind it, as the polling relay
                            // parks such a row (which then holds its key).
                            tracing::error!(event_id = %head.event.event_id, why = %e, "outbox row can never be published; parked with its error");
                            metrics.outbox.failed.inc();
                            let error = format!("permanent: cannot be published: {e}");
                            for row in rows.drain(..) {
                                let _ = relay_store.outbox_record_failure(row.id, &error, true).await;
                                done.parked.push(row.id);
                            }
                            return done;
                        }
                        Err(_) => break,
                    }
                }
                let results = telemetry
                    .publish_run(run.iter(), publisher.publish_in_order(messages, timeout))
                    .await;
                let mut results = results.into_iter();
                let mut retry: Vec<OutboxRow> = Vec::new();
                let mut failure: Option<PublishError> = None;
                for row in run {
                    match results.next() {
                        // Confirmed, also behind a failed row of its run: it reached its
                        // queues, so it is marked (as the polling relay does).
                        Some(Ok(())) => {
                            metrics.outbox.published.inc();
                            marks.confirmed(row.id);
                            let _ = confirmed.send(row.id);
                        }
                        Some(Err(e)) if failure.is_none() => {
                            failure = Some(e);
                            retry.push(row);
                        }
                        _ => retry.push(row),
                    }
                }
                let Some(error) = failure else {
                    attempts = 0;
                    continue;
                };
                if matches!(error, PublishError::ChannelClosed(_)) && !publisher.is_connected() {
                    done.broker_lost = Some(error.to_string());
                    return done;
                }
                // Retry the failed row (and what followed it) in order after a backoff.
                attempts += 1;
                metrics.outbox.failed.inc();
                if let Some(first) = retry.first() {
                    tracing::warn!(event_id = %first.event.event_id, exchange = %first.event.exchange, routing_key = %first.event.routing_key, attempts, %error, "outbox publish failed; retrying (its key and the slot wait)");
                    let _ = relay_store.outbox_record_failure(first.id, &error.to_string(), false).await;
                }
                for row in retry.into_iter().rev() {
                    rows.push_front(row);
                }
                let delay = Duration::from_millis((500_u64 << attempts.min(7)).min(60_000));
                tokio::time::sleep(delay).await;
            }
            done
        }));
    }
}
