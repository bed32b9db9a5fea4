//! Moves dead letters from `Q.dlq` into the `dead_letters` table (queryable, replayable),
//! acking each only after its row is committed. Carteiro's own story (reason, plugin,
//! attempts) is believed only from a copy sealed for this route; messages the broker
//! dead-lettered itself (TTL, max-length, reject, delivery limit) get a reason from
//! `x-first-death-reason`, and anything else published straight to `Q.dlx` is archived as
//! such.
//!
//! Only store trouble makes the archiver wait and retry. Data the store refuses is archived
//! in a plain fallback form; if even that is refused, the message is *parked*: left unacked
//! in `Q.dlq` (visible there), counted in `carteiro_dead_letters_parked_total` and logged,
//! never retried in a loop and never a reason to pause the routes.

use super::context::RouteContext;
use crate::broker::headers::{header_int, header_text, to_text_pairs};
use crate::broker::seal;
use crate::common::{headers as h, now_ms};
use crate::store::NewDeadLetter;
use crate::topology::dlq_name;
use futures::StreamExt;
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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
        route: ctx.queue.clone(),
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
    let trusted = seal::has_ours(props) && ctx.seal.verify(&ctx.queue, props, &delivery.data);
    let table = seal::sanitize(&props.headers().clone().unwrap_or_default(), trusted);
    // After `sanitize`, Carteiro headers are left only on a sealed copy.
    let ours = header_text(Some(&table), h::REASON);
    // Our own dead letters failed on the route's queue; the broker's name the queue they
    // died in (retry tiers add `x-death` records too, so only trust them for the broker's).
    let queue = match ours {
        Some(_) => ctx.queue.clone(),
        None => {
            header_text(Some(&table), "x-first-death-queue").unwrap_or_else(|| ctx.queue.clone())
        }
    };
    let reason = ours.unwrap_or_else(|| broker_reason(&table, &ctx.dlx()));
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

/// The same dead letter in plain ASCII text: every header packed as hex-encoded JSON into
/// one, the reason saying why. Only the body stays as it came.
fn fallback(record: &NewDeadLetter, refused: &str) -> NewDeadLetter {
    let packed = hex::encode(crate::store::headers_to_json(&record.headers));
    NewDeadLetter {
        reason: crate::broker::outgoing::cap_reason(&format!(
            "archived in fallback form (the store refused it as received: {refused}); \
             reason as received (escaped): {}",
            record.reason.escape_default()
        )),
        plugin: None,
        queue: record.route.clone(),
        headers: vec![("x-carteiro-archived-headers-hex-json".to_owned(), packed)],
        ..record.clone()
    }
}

/// What became of a dead letter handed to the store.
pub enum Stored {
    /// Archived (as it came, or in fallback form) under this id.
    Archived(i64),
    /// The store itself failed: try again once it answers.
    StoreTrouble(String),
    /// The store refused it even in fallback form (logged; counted as parked).
    Refused(String),
}

/// Inserts `record`; if the store refuses its data, inserts its fallback form instead.
pub async fn store_dead_letter(ctx: &RouteContext, record: &NewDeadLetter) -> Stored {
    let refused = match ctx.store.dead_letter_insert(record).await {
        Ok(id) => return Stored::Archived(id),
        Err(e) if e.is_transient() => return Stored::StoreTrouble(e.to_string()),
        Err(e) => e.to_string(),
    };
    tracing::warn!(route = %ctx.queue, error = %refused, "the store refused a dead letter as received; archiving it in fallback form");
    match ctx
        .store
        .dead_letter_insert(&fallback(record, &refused))
        .await
    {
        Ok(id) => Stored::Archived(id),
        Err(e) if e.is_transient() => Stored::StoreTrouble(e.to_string()),
        Err(e) => {
            ctx.metrics.dead_letter_parked(&ctx.queue);
            tracing::error!(route = %ctx.queue, error = %e, "the store refused a dead letter even in fallback form");
            Stored::Refused(e.to_string())
        }
    }
}

async fn archive(ctx: &RouteContext, delivery: Delivery, stop: &CancellationToken) {
    let record = record_of(ctx, &delivery);
    tokio::select! {
        () = ctx.gate.wait_healthy() => {}
        // Unacked: the broker keeps it in Q.dlq for the next start.
        () = stop.cancelled() => return,
    }
    match store_dead_letter(ctx, &record).await {
        Stored::Archived(id) => {
            ctx.metrics.dead_letter_archived(&ctx.queue);
            tracing::info!(id, route = %ctx.queue, reason = %record.reason, "dead letter archived");
            if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
                tracing::warn!(error = %e, "dead letter archived but not acked; it may be archived twice");
            }
        }
        Stored::StoreTrouble(e) => {
            ctx.gate.report_failure(&e);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                () = stop.cancelled() => {}
            }
            let requeue = BasicNackOptions {
                requeue: true,
                ..Default::default()
            };
            let _ = delivery.acker.nack(requeue).await;
        }
        Stored::Refused(_) => {
            tracing::error!(route = %ctx.queue, "the dead letter stays parked (unacked) in the dead-letter queue until the gateway restarts");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_fallback_form_is_plain_text_and_keeps_everything() {
        let record = NewDeadLetter {
            route: "orders".into(),
            queue: "q\0ueue".into(),
            reason: "bad\0reason".into(),
            plugin: Some("plug\0in".into()),
            attempts: 3,
            headers: vec![("x-na\0me".into(), "v\0alue".into())],
            body: b"b\0dy".to_vec(),
            first_failed_at: Some(1),
            dead_lettered_at: 2,
        };
        let plain = fallback(&record, "NUL in text");
        assert!(plain.reason.contains("NUL in text"), "{}", plain.reason);
        assert!(plain.reason.contains("bad\\u{0}reason"), "{}", plain.reason);
        assert!(!plain.reason.contains('\0') && !plain.queue.contains('\0'));
        assert_eq!(plain.plugin, None);
        let (name, packed) = &plain.headers[0];
        assert_eq!(plain.headers.len(), 1);
        assert!(packed.is_ascii() && !name.contains('\0'));
        let json = String::from_utf8(hex::decode(packed).unwrap()).unwrap();
        let back: Vec<(String, String)> = serde_json::from_str(&json).unwrap();
        assert_eq!(
            back, record.headers,
            "headers recoverable from the fallback"
        );
        assert_eq!((plain.body, plain.attempts), (record.body, 3));
    }
}
