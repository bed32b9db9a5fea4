//! The outbox relay (G3): leases unpublished rows in id order, publishes each with
//! `mandatory` and a publisher confirm, and marks each row published as its own confirm
//! arrives. Rows sharing an ordering key go out one after another; different keys go out
//! concurrently up to `max_in_flight`. Woken in-process on commit, by PostgreSQL
//! `LISTEN/NOTIFY` across processes, and by a poll interval as a backstop.

use crate::broker::headers::table_from_text;
use crate::broker::{
    ConfirmedPublisher, ConnectOptions, JitteredBackoff, Outgoing, PublishError, PublisherOptions,
    connect,
};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pipeline::headers::now_ms;
use crate::pipeline::{FaultPoint, hang_if};
use crate::store::{Backend, OUTBOX_NOTIFY_CHANNEL, OutboxRow, Store};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::BasicProperties;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A lease outlives any batch by far; a crashed relay's rows come back after it.
const LEASE_MS: i64 = 30_000;

/// One relay instance.
pub struct Relay {
    store: Store,
    metrics: Arc<Metrics>,
    wake: Arc<Notify>,
    url: String,
    /// The store's URL, for PostgreSQL `LISTEN` (never logged).
    store_url: String,
    connect: ConnectOptions,
    publish_timeout: Duration,
    max_in_flight: usize,
    poll_interval: Duration,
    reconnect_max: Duration,
    owner: String,
    fault: Option<FaultPoint>,
}

/// Why a batch stopped early.
enum BatchError {
    /// The broker connection is gone: reconnect, nothing is marked.
    Broker(String),
    /// The store failed: wait and try again.
    Store(String),
}

impl Relay {
    /// A relay for `config`; `wake` is notified by the in-process committer.
    pub fn new(
        config: &Config,
        store: Store,
        metrics: Arc<Metrics>,
        wake: Option<Arc<Notify>>,
    ) -> Self {
        Self {
            store,
            metrics,
            wake: wake.unwrap_or_default(),
            url: config.broker.url.clone(),
            store_url: config.store.url.clone(),
            connect: ConnectOptions {
                heartbeat: config.broker.heartbeat,
                connect_timeout: config.broker.connect_timeout,
                connection_name: "carteiro relay".into(),
            },
            publish_timeout: config.broker.publish_timeout,
            max_in_flight: config.relay.max_in_flight.max(1),
            poll_interval: config.relay.poll_interval,
            reconnect_max: config.broker.reconnect_max_backoff,
            fault: FaultPoint::from_env(),
            owner: format!(
                "relay-{}-{}",
                std::process::id(),
                uuid::Uuid::now_v7().simple()
            ),
        }
    }

    /// Runs until `stop`.
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        if self.store.backend() == Backend::Postgres {
            tokio::spawn(listen_for_commits(
                self.store_url.clone(),
                self.wake.clone(),
                stop.clone(),
            ));
        }
        let mut backoff = JitteredBackoff::new(Duration::from_millis(100), self.reconnect_max);
        while !stop.is_cancelled() {
            let publisher = match self.open_publisher().await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "relay cannot reach the broker; rows wait");
                    sleep_or_stop(backoff.next_delay(), &stop).await;
                    continue;
                }
            };
            tracing::info!(owner = %self.owner, "outbox relay running");
            backoff.reset();
            loop {
                if stop.is_cancelled() {
                    break;
                }
                match self.drain_once(&publisher).await {
                    Ok(0) => {
                        tokio::select! {
                            _ = self.wake.notified() => {}
                            _ = tokio::time::sleep(self.poll_interval) => {}
                            _ = stop.cancelled() => {}
                        }
                    }
                    Ok(_) => {}
                    Err(BatchError::Broker(e)) => {
                        tracing::warn!(error = %e, "relay lost the broker; reconnecting");
                        break;
                    }
                    Err(BatchError::Store(e)) => {
                        tracing::warn!(error = %e, "relay cannot reach the store; retrying");
                        sleep_or_stop(backoff.next_delay(), &stop).await;
                    }
                }
            }
            if let Err(e) = self.store.outbox_release(&self.owner).await {
                tracing::debug!(error = %e, "could not release leases; they expire on their own");
            }
            sleep_or_stop(backoff.next_delay(), &stop).await;
        }
        Ok(())
    }

    async fn open_publisher(&self) -> anyhow::Result<ConfirmedPublisher> {
        let conn = Arc::new(connect(&self.url, &self.connect).await?);
        let lanes = self.max_in_flight.min(64);
        Ok(ConfirmedPublisher::open(conn, PublisherOptions { lanes }).await?)
    }

    /// Leases one batch and publishes it; returns how many rows it took.
    async fn drain_once(&self, publisher: &ConfirmedPublisher) -> Result<usize, BatchError> {
        let limit = i64::try_from(self.max_in_flight).unwrap_or(256);
        let rows = self
            .store
            .outbox_pending(limit, &self.owner, LEASE_MS)
            .await
            .map_err(|e| BatchError::Store(e.to_string()))?;
        let taken = rows.len();
        if taken == 0 {
            return Ok(0);
        }
        let mut by_key: BTreeMap<String, Vec<OutboxRow>> = BTreeMap::new();
        for row in rows {
            by_key
                .entry(row.ordering_key.clone())
                .or_default()
                .push(row);
        }
        let mut chains: FuturesUnordered<_> = by_key
            .into_values()
            .map(|chain| self.publish_chain(publisher, chain))
            .collect();
        let mut first_error = None;
        while let Some(result) = chains.next().await {
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        // Rows of a chain that stopped early are still leased: hand them back now.
        self.store
            .outbox_release(&self.owner)
            .await
            .map_err(|e| BatchError::Store(e.to_string()))?;
        match first_error {
            Some(e) => Err(e),
            None => Ok(taken),
        }
    }

    /// Publishes rows of one ordering key in order, stopping at the first failure.
    async fn publish_chain(
        &self,
        publisher: &ConfirmedPublisher,
        chain: Vec<OutboxRow>,
    ) -> Result<(), BatchError> {
        for row in chain {
            match publisher
                .publish(outgoing(&row), self.publish_timeout)
                .await
            {
                Ok(()) => {
                    hang_if(self.fault, FaultPoint::RelayHangAfterConfirm).await;
                    self.metrics.outbox_published.inc();
                    self.store
                        .outbox_mark_published(row.id)
                        .await
                        .map_err(|e| BatchError::Store(e.to_string()))?;
                }
                Err(PublishError::ChannelClosed(e)) => return Err(BatchError::Broker(e)),
                Err(error) => {
                    self.metrics.outbox_failed.inc();
                    let attempts = row.attempts + 1;
                    let delay_ms = (500_i64 << attempts.clamp(0, 7)).min(60_000);
                    tracing::warn!(event_id = %row.event_id, exchange = %row.exchange, routing_key = %row.routing_key, attempts, %error, "outbox publish failed; the row stays pending");
                    self.store
                        .outbox_mark_failed(row.id, &error.to_string(), now_ms() + delay_ms)
                        .await
                        .map_err(|e| BatchError::Store(e.to_string()))?;
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// The AMQP message for a row: `event_id` is the `message_id`.
fn outgoing(row: &OutboxRow) -> Outgoing {
    let mut properties = BasicProperties::default()
        .with_message_id(row.event_id.to_string().as_str().into())
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(row.created_at / 1000).unwrap_or(0));
    if let Ok(headers) = table_from_text(row.headers.iter().cloned()) {
        properties = properties.with_headers(headers);
    }
    if let Some(ct) = &row.content_type {
        properties = properties.with_content_type(ct.as_str().into());
    }
    Outgoing {
        exchange: row.exchange.clone(),
        routing_key: row.routing_key.clone(),
        properties,
        body: row.payload.clone(),
        mandatory: true,
    }
}

async fn sleep_or_stop(delay: Duration, stop: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = stop.cancelled() => {}
    }
}

/// Wakes the relay when another process commits outbox rows (PostgreSQL only).
async fn listen_for_commits(url: String, wake: Arc<Notify>, stop: CancellationToken) {
    loop {
        let listened = async {
            let mut listener = sqlx::postgres::PgListener::connect(&url).await?;
            listener.listen(OUTBOX_NOTIFY_CHANNEL).await?;
            loop {
                listener.recv().await?;
                wake.notify_one();
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            result = listened => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "outbox LISTEN connection lost; the poll interval covers the gap");
                }
            }
        }
        sleep_or_stop(Duration::from_secs(1), &stop).await;
    }
}
