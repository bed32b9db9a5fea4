//! Handing a delivery on: to a retry tier or to the dead-letter exchange, each a confirmed
//! publish that must succeed before the original is acked (G1).

use super::context::RouteContext;
use super::headers as h;
use crate::broker::headers::{header_int, header_text, insert};
use crate::broker::{ConfirmedPublisher, Outgoing, PublishError};
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable, LongString};
use std::time::Duration;

/// Where the message came from before Carteiro's retry tiers re-routed it.
pub fn original_route(delivery: &Delivery) -> (String, String) {
    let headers = delivery.properties.headers().as_ref();
    (
        header_text(headers, h::ORIGINAL_EXCHANGE)
            .unwrap_or_else(|| delivery.exchange.as_str().to_owned()),
        header_text(headers, h::ORIGINAL_ROUTING_KEY)
            .unwrap_or_else(|| delivery.routing_key.as_str().to_owned()),
    )
}

fn set_text(table: &mut FieldTable, name: &str, value: &str) {
    // Names here are our own constants, always under 255 bytes.
    let _ = insert(table, name, AMQPValue::LongString(LongString::from(value)));
}

fn set_int(table: &mut FieldTable, name: &str, value: i64) {
    let _ = insert(table, name, AMQPValue::LongLongInt(value));
}

/// Headers common to retries and dead letters: original route and failure times.
fn failure_headers(delivery: &Delivery, reason: &str) -> FieldTable {
    let mut table = delivery.properties.headers().clone().unwrap_or_default();
    let (exchange, routing_key) = original_route(delivery);
    let now = h::now_ms();
    let first = header_int(Some(&table), h::FIRST_FAILURE_AT).unwrap_or(now);
    set_text(&mut table, h::ORIGINAL_EXCHANGE, &exchange);
    set_text(&mut table, h::ORIGINAL_ROUTING_KEY, &routing_key);
    set_int(&mut table, h::FIRST_FAILURE_AT, first);
    set_int(&mut table, h::LAST_FAILURE_AT, now);
    set_text(&mut table, h::LAST_REASON, reason);
    table
}

async fn publish(
    publisher: &ConfirmedPublisher,
    ctx: &RouteContext,
    delivery: &Delivery,
    exchange: String,
    routing_key: String,
    headers: FieldTable,
) -> Result<(), PublishError> {
    let properties = delivery
        .properties
        .clone()
        .with_headers(headers)
        .with_delivery_mode(2);
    publisher
        .publish(
            Outgoing {
                exchange,
                routing_key,
                properties,
                body: delivery.data.clone(),
                mandatory: true,
            },
            ctx.publish_timeout,
        )
        .await
}

/// Publishes a copy to the retry tier for `delay`, with the attempt counter incremented.
pub async fn to_retry(
    publisher: &ConfirmedPublisher,
    ctx: &RouteContext,
    delivery: &Delivery,
    attempt: u32,
    delay: Duration,
    reason: &str,
) -> Result<(), PublishError> {
    let mut headers = failure_headers(delivery, reason);
    set_int(&mut headers, h::ATTEMPT, i64::from(attempt) + 1);
    publish(
        publisher,
        ctx,
        delivery,
        String::new(),
        ctx.retry_queue(delay),
        headers,
    )
    .await
}

/// Publishes to the route's dead-letter exchange with the reason and the plugin's identity.
pub async fn to_dead_letter(
    publisher: &ConfirmedPublisher,
    ctx: &RouteContext,
    delivery: &Delivery,
    attempt: u32,
    reason: &str,
    kind: &str,
) -> Result<(), PublishError> {
    let mut headers = failure_headers(delivery, reason);
    set_text(&mut headers, h::REASON, reason);
    set_text(&mut headers, h::FAILURE_KIND, kind);
    set_text(&mut headers, h::PLUGIN, ctx.plugin.name());
    set_text(&mut headers, h::PLUGIN_SHA256, ctx.plugin.digest());
    set_int(&mut headers, h::ATTEMPTS, i64::from(attempt));
    set_text(&mut headers, h::ROUTE, &ctx.queue);
    set_int(&mut headers, h::DEAD_LETTERED_AT, h::now_ms());
    publish(
        publisher,
        ctx,
        delivery,
        ctx.dlx(),
        ctx.queue.clone(),
        headers,
    )
    .await
}
