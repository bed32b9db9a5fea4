//! Moves dead letters from `Q.dlq` into the `dead_letters` table (queryable, replayable),
//! acking each only after its row is committed. Carteiro's own story (reason, plugin,
//! attempts) is believed only from a copy sealed for this route; messages the broker
//! dead-lettered itself (TTL, max-length, reject, delivery limit) get a reason from
//! `x-first-death-reason`, and anything else published straight to `Q.dlx` is archived as
//! such.
//!
//! The store keeps any text a dead letter carries (NUL bytes and all, see
//! `Store::dead_letter_insert`), so only store trouble makes the archiver wait: it holds the
//! dead letter (never requeues it, which would spend a quorum DLQ's delivery limit) and
//! stops waiting on shutdown. Should a dead letter still exceed that limit (gateway crashes,
//! a broker `consumer_timeout`), the broker parks it in `Q.dlq.parked` ([`watch_parked`]).

use super::context::RouteContext;
use crate::broker::field_table::{header_int, header_text, to_text_pairs};
use crate::common::{header_names as h, now_ms, retry};
use crate::store::NewDeadLetter;
use crate::topology::{QueueType, dlq_name, parked_name, queue_state};
use futures::StreamExt;
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Consumes the route's DLQ until `stop` or until the connection dies.
pub async fn run(ctx: Arc<RouteContext>, conn: Arc<lapin::Connection>, stop: CancellationToken) {
    let queue = dlq_name(&ctx.settings.queue);
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
                Some(Ok(delivery)) => archive(&ctx, delivery, &stop).await,
                _ => return,
            },
        }
    }
}

fn broker_reason(table: &FieldTable, dlx: &str) -> String {
    let Some(why) = header_text(Some(table), "x-first-death-reason") else {
        return format!(
            "published straight to the dead-letter exchange `{dlx}` (no Carteiro or broker \
             dead-letter record)"
        );
    };
    let queue = header_text(Some(table), "x-first-death-queue").unwrap_or_default();
    let text = match why.as_str() {
        "expired" => "message TTL expired",
        "maxlen" => "queue length limit exceeded",
        "rejected" => "rejected without requeue",
        "delivery_limit" => "delivery limit exceeded (the message may be crashing the gateway)",
        other => other,
    };
    format!("dead-lettered by the broker: {text} (queue `{queue}`)")
}

/// The archive record of a message: its headers as text, plus its AMQP properties as
/// pseudo-headers so a replay restores them.
#[allow(clippy::too_many_arguments)]
pub fn record(
    ctx: &RouteContext,
    queue: String,
    reason: String,
    plugin: Option<String>,
    attempts: i64,
    table: &FieldTable,
    props: &BasicProperties,
    body: Vec<u8>,
    first_failed_at: Option<i64>,
    dead_lettered_at: i64,
) -> NewDeadLetter {
    let mut pairs = to_text_pairs(table);
    let properties = [
        (h::PROP_MESSAGE_ID, props.message_id().as_ref()),
        (h::PROP_CONTENT_TYPE, props.content_type().as_ref()),
        (h::PROP_CORRELATION_ID, props.correlation_id().as_ref()),
    ];
    for (name, value) in properties {
        if let Some(value) = value {
            pairs.push((name.to_owned(), value.as_str().to_owned()));
        }
    }
    NewDeadLetter {
        route: ctx.settings.queue.clone(),
        queue,
        reason,
        plugin,
        attempts,
        headers: pairs,
        body,
        first_failed_at,
        dead_lettered_at,
    }
}

fn record_of(ctx: &RouteContext, delivery: &Delivery) -> NewDeadLetter {
    let props = &delivery.properties;
    let table = ctx
        .deps
        .seal
        .check(&ctx.settings.queue, props, &delivery.data)
        .table;
    // After `sanitize`, Carteiro headers are left only on a sealed copy.
    let ours = header_text(Some(&table), h::REASON);
    // Our own dead letters failed on the route's queue; the broker's name the queue they
    // died in (retry tiers add `x-death` records too, so only trust them for the broker's).
    let queue = match ours {
        Some(_) => ctx.settings.queue.clone(),
        None => header_text(Some(&table), "x-first-death-queue")
            .unwrap_or_else(|| ctx.settings.queue.clone()),
    };
    let reason = ours.unwrap_or_else(|| broker_reason(&table, &ctx.settings.dlx()));
    let attempts = header_int(Some(&table), h::ATTEMPTS)
        .or_else(|| header_int(Some(&table), h::ATTEMPT))
        .unwrap_or(0);
    record(
        ctx,
        queue,
        crate::broker::outgoing::cap_reason(&reason),
        header_text(Some(&table), h::PLUGIN),
        attempts,
        &table,
        props,
        delivery.data.clone(),
        header_int(Some(&table), h::FIRST_FAILURE_AT),
        header_int(Some(&table), h::DEAD_LETTERED_AT).unwrap_or_else(now_ms),
    )
}

async fn archive(ctx: &RouteContext, delivery: Delivery, stop: &CancellationToken) {
    // A dead letter sealed by a gateway that read a rotation first keeps its reason.
    ctx.deps.seal.learn_unknown_key(&delivery.properties).await;
    let record = record_of(ctx, &delivery);
    let mut backoff = retry::STORE_OUTAGE.backoff();
    // Held, never requeued: on a quorum DLQ each requeue spends its delivery limit, and a
    // requeue loop during an outage only burns CPU. Unacked on shutdown, it stays in Q.dlq.
    loop {
        tokio::select! {
            () = ctx.deps.gate.wait_healthy() => {}
            () = stop.cancelled() => return,
        }
        match ctx.deps.store.dead_letter_insert(&record).await {
            Ok(id) => {
                ctx.deps.metrics.dead_letter_archived(&ctx.settings.queue);
                tracing::info!(id, route = %ctx.settings.queue, reason = %record.reason, "dead letter archived");
                if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
                    tracing::warn!(error = %e, "dead letter archived but not acked; it may be archived twice");
                }
                return;
            }
            // Only store trouble is left: hold it and wait for the store.
            Err(e) => {
                ctx.deps.gate.report_failure(&e.to_string());
                tracing::warn!(route = %ctx.settings.queue, error = %e, "dead letter not archived yet: holding it in Q.dlq until the store takes writes");
                tokio::select! {
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

/// How often a quorum route's `Q.dlq.parked` depth is read.
const PARKED_CHECK: Duration = Duration::from_secs(10);

/// Keeps `carteiro_dead_letters_parked{route}` true and says so, once per change, when
/// dead letters were parked: only an operator moves them back (docs/dead-letters.md).
pub async fn watch_parked(
    ctx: Arc<RouteContext>,
    conn: Arc<lapin::Connection>,
    stop: CancellationToken,
) {
    if ctx.settings.topology.queue_type != QueueType::Quorum {
        return;
    }
    let parked = parked_name(&ctx.settings.queue);
    let mut last = 0;
    let mut tick = tokio::time::interval(PARKED_CHECK);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        // A failed passive declare closes its channel, so each look gets a fresh one.
        let Ok(channel) = conn.create_channel().await else {
            return;
        };
        let declared = queue_state(&channel, &parked).await;
        let _ = channel.close(200, "looked".into()).await;
        let Ok(queue) = declared else { continue };
        let count = queue.message_count();
        ctx.deps.metrics.set_parked(&ctx.settings.queue, count);
        if count > last {
            tracing::error!(route = %ctx.settings.queue, queue = %parked, parked = count, "dead letters parked: the archiver could not take them within Q.dlq's delivery limit; move them back with `carteiro dlq unpark --route {}`", ctx.settings.queue);
        }
        last = count;
    }
}
