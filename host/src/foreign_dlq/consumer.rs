//! The consumer of one foreign DLQ: each delivery archived once (`Store::dead_letter_insert_once`
//! with its dedupe key), then acked (G1). Store trouble holds the delivery unacked, as the
//! routes' archiver does; a lost connection reconnects and resubscribes. Nothing is declared:
//! the queue is looked up passively, and a queue missing at start stops the gateway with its
//! name.

use super::config::DeadLetterQueueConfig;
use super::record::record;
use crate::broker::connect_any;
use crate::common::{now_ms, retry};
use crate::metrics::Metrics;
use crate::pipeline::{BrokerSettings, StoreGate};
use crate::store::Store;
use crate::topology::queue_state;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Deliveries held unacked at once.
const PREFETCH: u16 = 32;

/// What a foreign DLQ's consumer needs.
#[derive(Clone)]
pub struct Deps {
    pub broker: BrokerSettings,
    pub store: Store,
    pub gate: StoreGate,
    pub metrics: Arc<Metrics>,
}

/// Why a session ended.
enum Ended {
    Stopped,
    Missing(String),
    Lost(String),
}

/// Archives `dlq`'s queue until `stop`. Fails only when the queue is missing at start.
pub async fn run(
    dlq: DeadLetterQueueConfig,
    deps: Deps,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut backoff = retry::reconnect(deps.broker.reconnect_max_backoff).backoff();
    let mut first = true;
    loop {
        match session(&dlq, &deps, &stop).await {
            Ended::Stopped => return Ok(()),
            Ended::Missing(e) if first => anyhow::bail!(
                "dead-letter queue `{}` ([[dead_letter_queues]]) does not exist; Carteiro \
                 declares nothing for it: declare it where its dead letters come from ({e})",
                dlq.queue
            ),
            Ended::Missing(e) | Ended::Lost(e) => {
                tracing::warn!(queue = %dlq.queue, error = %e, "dead-letter queue consumer lost; reconnecting");
            }
        }
        first = false;
        tokio::select! {
            () = tokio::time::sleep(backoff.next_delay()) => {}
            () = stop.cancelled() => return Ok(()),
        }
    }
}

async fn session(dlq: &DeadLetterQueueConfig, deps: &Deps, stop: &CancellationToken) -> Ended {
    let conn = match connect_any(&deps.broker.urls, &deps.broker.connect).await {
        Ok(conn) => conn,
        Err(e) => return Ended::Lost(e.to_string()),
    };
    let lost = |e: lapin::Error| Ended::Lost(e.to_string());
    let channel = match conn.create_channel().await {
        Ok(channel) => channel,
        Err(e) => return lost(e),
    };
    if let Err(e) = queue_state(&channel, &dlq.queue).await {
        let _ = conn.close(200, "bye".into()).await;
        return Ended::Missing(e.to_string());
    }
    let subscribed = async {
        channel
            .basic_qos(PREFETCH, BasicQosOptions::default())
            .await?;
        channel
            .basic_consume(
                dlq.queue.as_str().into(),
                format!("carteiro-dlq-archiver-{}", uuid::Uuid::now_v7().simple())
                    .as_str()
                    .into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
    };
    let mut consumer = match subscribed.await {
        Ok(consumer) => consumer,
        Err(e) => return lost(e),
    };
    tracing::info!(queue = %dlq.queue, route = dlq.route_name(), "archiving dead-letter queue");
    let ended = loop {
        tokio::select! {
            () = stop.cancelled() => break Ended::Stopped,
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    if !archive(dlq, deps, delivery, stop).await {
                        break Ended::Stopped;
                    }
                }
                Some(Err(e)) => break lost(e),
                None => break Ended::Lost("the broker cancelled the consumer".into()),
            },
        }
    };
    let _ = conn.close(200, "bye".into()).await;
    ended
}

/// Archives one delivery and acks it; `false` when `stop` came first (it stays unacked, so
/// the broker delivers it again).
async fn archive(
    dlq: &DeadLetterQueueConfig,
    deps: &Deps,
    delivery: Delivery,
    stop: &CancellationToken,
) -> bool {
    let foreign = record(dlq, &delivery.properties, &delivery.data, now_ms());
    let route = dlq.route_name();
    let mut backoff = retry::STORE_OUTAGE.backoff();
    loop {
        tokio::select! {
            () = deps.gate.wait_healthy() => {}
            () = stop.cancelled() => return false,
        }
        let stored = deps
            .store
            .dead_letter_insert_once(&foreign.letter, Some(&foreign.dedupe_key))
            .await;
        match stored {
            Ok((id, new)) => {
                let fault = crate::common::FaultPoint::from_env();
                crate::common::hang_if(fault, crate::common::FaultPoint::DlqHangAfterCommit).await;
                if new {
                    deps.metrics.dead_letter_archived(route);
                    tracing::info!(id, route, reason = %foreign.letter.reason, "dead letter archived");
                } else {
                    tracing::info!(
                        id,
                        route,
                        "dead letter redelivered, archived already as #{id}; acking it"
                    );
                }
                if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
                    tracing::warn!(error = %e, "dead letter archived but not acked; its redelivery is recognised");
                }
                return true;
            }
            Err(e) => {
                deps.gate.report_failure(&e.to_string());
                tracing::warn!(queue = %dlq.queue, error = %e, "dead letter not archived yet: holding it unacked until the store takes writes");
                tokio::select! {
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                    () = stop.cancelled() => return false,
                }
            }
        }
    }
}
