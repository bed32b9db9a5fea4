//! The outbox relay (G3): takes committed rows from its source, publishes each with
//! `mandatory` and a publisher confirm, and marks each row published once its own confirm
//! arrived. Rows sharing an ordering key go out one after another; different keys go out
//! concurrently up to `max_in_flight`. Polling is woken in-process on commit, by the store's
//! commit wake-ups across processes (PostgreSQL `LISTEN/NOTIFY`), and by a poll interval as
//! a backstop (docs/architecture.md, "The relay and its sources").
//!
//! # Layout
//! - this file: [`Relay`], its settings, the AMQP message of a row.
//! - `source`: what a relay reads ([`Source`](source::Source): rows, leases, marks, failures,
//!   wake-ups; `SlotSource`: the same table read from a replication slot).
//! - `outbox_table`: Carteiro's own outbox as a source.
//! - `poll`: the polling feed: the connect/reconnect loop, and one session over one broker
//!   connection and one lease owner: claims more rows while earlier ones are still in flight.
//! - `cdc`: `[relay] mode = "cdc"`: the feed from a PostgreSQL logical replication slot.
//! - shared by both feeds: `chains` (the per-ordering-key queues, the in-memory ordering rule,
//!   and the window's bytes), `publish` (a key's runs with confirms, failures, parking,
//!   backoff), `marker` (group commit of "published" marks as confirms arrive, one `BETWEEN` per run of consecutive ids).
//! - `config`: [`RelayConfig`] (`[relay]`) and its check.

mod app;
mod cdc;
mod chains;
mod config;
mod marker;
mod outbox_table;
mod poll;
mod publish;
mod source;

pub use app::{
    AppOutboxConfig, AppOutboxError, AppRelay, AppStatus, Opened as OpenedOutbox, trigger_sql,
};
pub use config::{RelayConfig, RelayMode};

use crate::broker::outgoing::Unpublishable;
pub use crate::broker::outgoing::event_properties;
use crate::broker::outgoing::typed_event_properties;
use crate::broker::{
    BrokerConfig, ConfirmedPublisher, ConnectOptions, Outgoing, PublisherOptions, connect_any,
};
use crate::common::FaultPoint;
use crate::metrics::Metrics;
use crate::store::{Handoff, OutboxRow, Store};
use crate::telemetry::Telemetry;
use outbox_table::OutboxTable;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// One relay instance: Carteiro's own outbox, polled or read from the slot.
pub struct Relay {
    settings: Settings,
    source: OutboxTable,
    /// `[relay] mode = "cdc"`: read the slot instead of claiming rows.
    cdc: Option<cdc::CdcSettings>,
}

/// How a relay publishes, whatever its source.
struct Settings {
    metrics: Arc<Metrics>,
    /// Notified by the in-process committer.
    wake: Arc<Notify>,
    /// Immediate dispatch: rows the in-process committer hands over (Carteiro's own outbox,
    /// `[relay] mode = "poll"`, inside `carteiro run`).
    handoff: Option<Handoff>,
    /// Broker nodes, tried in turn.
    urls: Vec<String>,
    connect: ConnectOptions,
    publish_timeout: Duration,
    max_in_flight: usize,
    /// Bytes (payload and headers) of the rows a session may hold; at least one row.
    max_in_flight_bytes: u64,
    poll_interval: Duration,
    reconnect_max: Duration,
    /// How long a claim leases its rows: `[relay] lease`, or more with a long publish timeout.
    lease: Duration,
    fault: Option<FaultPoint>,
    /// Publish spans, when `[telemetry]` exports them.
    telemetry: Telemetry,
}

impl Relay {
    /// A relay publishing to `broker` the outbox of the store at `store_url` (`store` opened
    /// on it; the URL serves the CDC relay's replication connection); `wake` is notified by
    /// the in-process committer.
    pub fn new(
        broker: &BrokerConfig,
        relay: &RelayConfig,
        store_url: &str,
        store: Store,
        metrics: Arc<Metrics>,
        wake: Option<Arc<Notify>>,
    ) -> Self {
        Self {
            settings: Settings {
                metrics,
                wake: wake.unwrap_or_default(),
                urls: broker.addresses(),
                connect: ConnectOptions {
                    heartbeat: broker.heartbeat,
                    connect_timeout: broker.connect_timeout,
                    connection_name: "carteiro relay".into(),
                    tls: broker.tls.clone(),
                },
                publish_timeout: broker.publish_timeout,
                max_in_flight: relay.max_in_flight.max(1),
                max_in_flight_bytes: relay.max_in_flight_bytes.max(1),
                poll_interval: relay.poll_interval,
                reconnect_max: broker.reconnect_max_backoff,
                lease: relay.lease.max(broker.publish_timeout * 3),
                fault: FaultPoint::from_env(),
                telemetry: Telemetry::off(),
                handoff: None,
            },
            source: OutboxTable::new(store, store_url),
            cdc: (relay.mode == RelayMode::Cdc).then(|| cdc::CdcSettings {
                slot: relay.slot.clone(),
                publication: relay.publication.clone(),
                max_slot_lag: relay.max_slot_lag,
            }),
        }
    }

    /// The same relay, also publishing the rows the in-process committer hands over
    /// straight from their commit (immediate dispatch), unless `[relay] immediate = false`
    /// or the relay reads the replication slot (which sees every row anyway).
    pub fn with_handoff(mut self, handoff: Handoff, relay: &RelayConfig) -> Self {
        if relay.immediate && self.cdc.is_none() {
            self.settings.handoff = Some(handoff);
        }
        self
    }

    /// The same relay, exporting a publish span per row through `telemetry`.
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.settings.telemetry = telemetry;
        self
    }

    /// Runs until `stop`.
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        match &self.cdc {
            Some(cdc) => cdc::run(&self.settings, &self.source, cdc, &stop).await,
            None => {
                poll::run(&self.settings, &self.source, &stop).await;
                Ok(())
            }
        }
    }
}

impl Settings {
    async fn open_publisher(&self) -> anyhow::Result<ConfirmedPublisher> {
        let conn = Arc::new(connect_any(&self.urls, &self.connect).await?);
        let lanes = PublisherOptions::for_in_flight(self.max_in_flight);
        Ok(ConfirmedPublisher::open(conn, lanes).await?)
    }
}

/// The AMQP message for a row: `event_id` is the `message_id`. `Err`: AMQP cannot carry
/// it (a row written before the host checked events, or by hand); it never will.
fn outgoing(row: &OutboxRow) -> Result<Outgoing, Unpublishable> {
    if let Some(why) = &row.refused {
        return Err(Unpublishable::Row(why.clone()));
    }
    let event = &row.event;
    Ok(Outgoing {
        exchange: event.exchange.clone(),
        routing_key: event.routing_key.clone(),
        properties: typed_event_properties(
            &event.event_id,
            row.message_type.as_deref(),
            row.created_at,
            &event.headers,
            event.content_type.as_deref(),
        )?,
        body: event.payload.clone(),
        mandatory: true,
    })
}

async fn sleep_or_stop(delay: Duration, stop: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = stop.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::broker::field_table::to_text_pairs;
    use crate::store::NewOutboxRow;

    #[test]
    fn a_row_goes_out_with_its_event_id_headers_content_type_and_commit_time() {
        let row = OutboxRow {
            id: 7,
            event: NewOutboxRow {
                event_id: uuid::Uuid::now_v7().to_string(),
                route: "r".into(),
                plugin: "p".into(),
                exchange: "events".into(),
                routing_key: "acesso.liberado".into(),
                headers: vec![
                    ("x-causation-id".into(), "m-1".into()),
                    ("traceparent".into(), "00-abc-def-01".into()),
                ],
                content_type: Some("application/json".into()),
                payload: b"{}".to_vec(),
                ordering_key: "k".into(),
            },
            created_at: 1_700_000_123_456,
            attempts: 0,
            last_error: None,
            message_type: None,
            refused: None,
        };
        let out = outgoing(&row).expect("a publishable row");
        let p = &out.properties;
        assert_eq!(
            p.message_id().as_ref().map(|s| s.to_string()),
            Some(row.event.event_id.to_string())
        );
        assert_eq!(*p.delivery_mode(), Some(2), "persistent");
        assert_eq!(
            *p.timestamp(),
            Some(1_700_000_123),
            "commit time in seconds"
        );
        // An AMQP field table keeps its names sorted (lapin's `FieldTable` is a map).
        let mut sent_headers = row.event.headers.clone();
        sent_headers.sort();
        assert_eq!(to_text_pairs(p.headers().as_ref().unwrap()), sent_headers);
        assert_eq!(
            p.content_type().as_ref().map(|s| s.to_string()),
            Some("application/json".to_owned())
        );
        assert!(
            out.mandatory,
            "an unroutable row must come back as a failure"
        );
        assert_eq!(
            (
                out.exchange.as_str(),
                out.routing_key.as_str(),
                out.body.as_slice()
            ),
            ("events", "acesso.liberado", b"{}".as_slice())
        );
    }
}
