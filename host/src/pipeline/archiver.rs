//! Moves dead letters from `Q.dlq` into the `dead_letters` table (queryable, replayable),
//! acking each only after its row is committed. Messages the broker dead-lettered itself
//! (TTL, max-length, reject, delivery limit) get a reason from `x-first-death-reason`.

use super::context::RouteContext;
use super::headers as h;
use crate::broker::headers::{header_int, header_text, to_text_pairs};
use crate::store::NewDeadLetter;
use crate::topology::dlq_name;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Pseudo-headers under which AMQP properties are kept, so a replay restores them.
pub const PROP_MESSAGE_ID: &str = ":message-id";
pub const PROP_CONTENT_TYPE: &str = ":content-type";
pub const PROP_CORRELATION_ID: &str = ":correlation-id";

/// Consumes the route's DLQ until `stop` or until the connection dies.
pub async fn run(ctx: Arc<RouteContext>, conn: Arc<lapin::Connection>, stop: CancellationToken) {
    let queue = dlq_name(&ctx.queue);
    let consume = async {
        let channel = conn.create_channel().await?;
        channel.basic_qos(64, BasicQosOptions::default()).await?;
        channel
            .basic_consume(
                queue.as_str().into(),
                format!("carteiro-archiver-{}", uuid::Uuid::now_v7().simple())
                    .as_str()
                    .into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
    };
    let mut consumer = match consume.await {
        Ok(consumer) => consumer,
        Err(e) => {
            tracing::warn!(queue = %queue, error = %e, "dead-letter archiver could not subscribe; retrying with the next session");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            next = consumer.next() => match next {
                Some(Ok(delivery)) => archive(&ctx, delivery).await,
                _ => return,
            },
        }
    }
}

fn broker_reason(delivery: &Delivery) -> String {
    let headers = delivery.properties.headers().as_ref();
    let why = header_text(headers, "x-first-death-reason").unwrap_or_else(|| "unknown".into());
    let queue = header_text(headers, "x-first-death-queue").unwrap_or_default();
    let text = match why.as_str() {
        "expired" => "message TTL expired",
        "maxlen" => "queue length limit exceeded",
        "rejected" => "rejected without requeue",
        "delivery_limit" => "delivery limit exceeded (the message may be crashing the gateway)",
        other => other,
    };
    format!("dead-lettered by the broker: {text} (queue `{queue}`)")
}

async fn archive(ctx: &RouteContext, delivery: Delivery) {
    let props = &delivery.properties;
    let headers = props.headers().as_ref();
    let ours = header_text(headers, h::REASON);
    // Our own dead letters failed on the route's queue; the broker's name the queue they
    // died in (retry tiers add `x-death` records too, so only trust them for the broker's).
    let queue = match ours {
        Some(_) => ctx.queue.clone(),
        None => header_text(headers, "x-first-death-queue").unwrap_or_else(|| ctx.queue.clone()),
    };
    let reason = ours.unwrap_or_else(|| broker_reason(&delivery));
    let mut pairs = headers.map(to_text_pairs).unwrap_or_default();
    let properties = [
        (
            PROP_MESSAGE_ID,
            props.message_id().as_ref().map(|s| s.as_str().to_owned()),
        ),
        (
            PROP_CONTENT_TYPE,
            props.content_type().as_ref().map(|s| s.as_str().to_owned()),
        ),
        (
            PROP_CORRELATION_ID,
            props
                .correlation_id()
                .as_ref()
                .map(|s| s.as_str().to_owned()),
        ),
    ];
    for (name, value) in properties {
        if let Some(value) = value {
            pairs.push((name.to_owned(), value));
        }
    }
    let record = NewDeadLetter {
        route: ctx.queue.clone(),
        queue,
        reason,
        plugin: header_text(headers, h::PLUGIN),
        attempts: header_int(headers, h::ATTEMPTS).unwrap_or(0),
        headers: pairs,
        body: delivery.data.clone(),
        first_failed_at: header_int(headers, h::FIRST_FAILURE_AT),
        dead_lettered_at: header_int(headers, h::DEAD_LETTERED_AT).unwrap_or_else(h::now_ms),
    };
    ctx.gate.wait_healthy().await;
    match ctx.store.dead_letter_insert(&record).await {
        Ok(id) => {
            ctx.metrics.dead_letter_archived(&ctx.queue);
            tracing::info!(id, route = %ctx.queue, reason = %record.reason, "dead letter archived");
            if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
                tracing::warn!(error = %e, "dead letter archived but not acked; it may be archived twice");
            }
        }
        Err(e) => {
            ctx.gate.report_failure(&e.to_string());
            tokio::time::sleep(Duration::from_millis(500)).await;
            let _ = delivery
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                })
                .await;
        }
    }
}
