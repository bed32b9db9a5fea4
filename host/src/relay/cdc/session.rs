//! One replication session: reads commits from the slot (while the window has room), hands
//! each row to its ordering key's chain as it is read (one publishing task per key at a
//! time, rows in commit order; each unordered row on its own), and reports to the slot the
//! end of the newest commit settled in full along with every earlier one. The chains, the
//! publishing, the marks, the parking and the backoff are the polling relay's (`chains`,
//! `publish`, `marker`), with failures retried in memory.
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

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use tokio_util::sync::CancellationToken;

use super::fence::Fence;
use super::pgoutput::{self, Message, Relations};
use super::window::CommitWindow;
use crate::broker::ConfirmedPublisher;
use crate::relay::Settings;
use crate::relay::chains::{Chains, HeldBytes, Leased};
use crate::relay::marker::{MarkSender, Marker};
use crate::relay::publish::{Confirms, KeyDone, KeyPublisher, OnFailure, SlotLost, Stopped};
use crate::relay::source::SlotSource;
use crate::store::{OutboxRow, StoreError};

/// Rows of a re-sent commit whose state in the table is read with one query.
const RECHECK_CHUNK: usize = 64;

/// Why a session ended.
pub(super) enum End {
    Stopped,
    Broker(String),
    Stream(String),
    Store(StoreError),
    /// Another relay reads the slot now.
    Fenced(SlotLost),
}

pub(super) struct Session<'a, S> {
    relay: &'a Settings,
    source: &'a S,
    publisher: ConfirmedPublisher,
    client: ReplicationClient,
    fence: Fence,
    /// Commits ending at or before this were maybe published already by a predecessor.
    recheck_until: u64,
    /// The open transaction is one of those: its rows wait in `to_check` for a look at the
    /// table before they go out.
    recheck: bool,
    to_check: Vec<Leased>,
    relations: Relations,
    window: CommitWindow,
    /// Bytes of the rows read and not settled (or dropped as published already).
    held: HeldBytes,
    /// Per key: rows waiting while a batch of that key publishes.
    chains: Chains,
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

impl<'a, S: SlotSource> Session<'a, S> {
    pub fn new(
        relay: &'a Settings,
        source: &'a S,
        publisher: ConfirmedPublisher,
        client: ReplicationClient,
        fence: Fence,
        recheck_until: u64,
    ) -> Self {
        let (confirmed_tx, confirmed_rx) = tokio::sync::mpsc::unbounded_channel();
        Self {
            relay,
            source,
            publisher,
            client,
            fence,
            recheck_until,
            recheck: false,
            to_check: Vec::new(),
            relations: Relations::default(),
            window: CommitWindow::default(),
            held: HeldBytes::default(),
            chains: Chains::default(),
            publishing: FuturesUnordered::new(),
            confirmed_tx,
            confirmed_rx,
            parked: HashSet::new(),
        }
    }

    pub async fn run(mut self, stop: &CancellationToken) -> End {
        match self.source.parked_keys().await {
            Ok(keys) => self.parked = keys.into_iter().collect(),
            Err(e) => return End::Store(e),
        }
        let (marker, mut marked) = Marker::spawn(self.source.clone());
        let publisher = self.key_publisher(marker.sender());
        let end = loop {
            let room = self.window.rows_in_flight() + self.to_check.len()
                < self.relay.max_in_flight
                && self.held.get() < self.relay.max_in_flight_bytes;
            tokio::select! {
                event = self.client.recv(), if room => {
                    match event {
                        Ok(Some(event)) => {
                            if let Err(end) = self.event(event, &publisher).await {
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
                            match done.stopped {
                                Some(Stopped::Broker(e)) => break End::Broker(e),
                                Some(Stopped::Fenced(e)) => break End::Fenced(e),
                                None => {}
                            }
                            if !done.parked.is_empty() && !done.key.is_empty() {
                                self.parked.insert(done.key.clone());
                            }
                            self.settle(&done.parked);
                            self.next_batch(&done.key, &publisher);
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
        drop(publisher);
        marker.close().await;
        while let Ok(id) = self.confirmed_rx.try_recv() {
            self.settle(&[id]);
        }
        // The worker sends the last position within its status interval; give it that.
        tokio::time::sleep(super::conn::STATUS_INTERVAL).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.client.shutdown()).await;
        end
    }

    /// What each key's publishing task gets: this session's publisher and fence, retrying
    /// failures in memory.
    fn key_publisher(&self, marks: MarkSender) -> KeyPublisher<S, Fence> {
        let confirms = Confirms {
            marks,
            settled: Some(self.confirmed_tx.clone()),
        };
        let fence = self.fence.clone();
        KeyPublisher::new(
            self.relay,
            self.source,
            &self.publisher,
            confirms,
            fence,
            OnFailure::RetryHere,
        )
    }

    /// Rows `ids` are settled (confirmed, or parked): the slot may move past their commits.
    fn settle(&mut self, ids: &[i64]) {
        for id in ids {
            self.window.settle(*id);
        }
        self.report_progress();
    }

    fn report_progress(&mut self) {
        if let Some(lsn) = self.window.advance() {
            self.client.update_applied_lsn(Lsn::from_u64(lsn));
        }
    }

    async fn event(
        &mut self,
        event: ReplicationEvent,
        publisher: &KeyPublisher<S, Fence>,
    ) -> Result<(), End> {
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
                        if let Some(row) = self.source.row_of_insert(relation, &values) {
                            let row = row.map_err(|e| End::Stream(e.to_string()))?;
                            self.read(row, publisher).await?;
                        }
                    }
                    Message::Other => {}
                }
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                self.flush_rechecks(publisher).await?;
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
    async fn read(
        &mut self,
        row: OutboxRow,
        publisher: &KeyPublisher<S, Fence>,
    ) -> Result<(), End> {
        let leased = Leased {
            _held: self.held.hold(&row),
            row,
            start_by: None,
        };
        if !self.recheck {
            self.take(leased, publisher);
            return Ok(());
        }
        self.to_check.push(leased);
        if self.to_check.len() >= RECHECK_CHUNK || self.held.get() >= self.relay.max_in_flight_bytes
        {
            self.flush_rechecks(publisher).await?;
        }
        Ok(())
    }

    /// Publishes the rows waiting in `to_check` that are still unpublished in the table (the
    /// others are dropped, and their bytes with them).
    async fn flush_rechecks(&mut self, publisher: &KeyPublisher<S, Fence>) -> Result<(), End> {
        if self.to_check.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(&mut self.to_check);
        let ids: Vec<i64> = rows.iter().map(|l| l.row.id).collect();
        let open = self
            .source
            .unpublished_among(&ids)
            .await
            .map_err(End::Store)?;
        for leased in rows {
            if open.binary_search(&leased.row.id).is_ok() {
                self.take(leased, publisher);
            }
        }
        Ok(())
    }

    /// A row of the open commit joins the window and its chain; unordered rows never wait for
    /// one another, so one bad row holds nothing back.
    fn take(&mut self, leased: Leased, publisher: &KeyPublisher<S, Fence>) {
        self.window.add(leased.row.id);
        if let Some(now) = self.chains.admit(leased) {
            self.start(vec![now], publisher);
        }
    }

    /// `key`'s batch ended: the rows that waited meanwhile go next, or the chain ends.
    fn next_batch(&mut self, key: &str, publisher: &KeyPublisher<S, Fence>) {
        let next = self.chains.next_batch(key);
        if !next.is_empty() {
            self.start(next, publisher);
        }
    }

    fn start(&mut self, rows: Vec<Leased>, publisher: &KeyPublisher<S, Fence>) {
        let held = rows
            .first()
            .map(|l| &l.row.event.ordering_key)
            .is_some_and(|key| !key.is_empty() && self.parked.contains(key));
        self.publishing.push(publisher.spawn(rows, held));
    }
}
