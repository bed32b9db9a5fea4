//! Handing a delivery on: to a retry tier or to the dead-letter exchange, each a sealed,
//! confirmed copy that must succeed before the original is acked (G1). A copy AMQP cannot
//! carry (its headers would not fit the broker's frame) is archived straight into the
//! store instead, with a reason saying so: never a loop of failing publishes.

use super::archiver;
use super::context::RouteContext;
use super::plan::{FailureKind, Outcome};
use super::received::Received;
use crate::broker::field_table::header_int;
use crate::broker::outgoing::{copy_properties, set_int, set_text, without_broker_records};
use crate::broker::{ConfirmedPublisher, Outgoing, PublishError};
use crate::common::{header_names as h, now_ms};
use crate::runtime::Plugin;
use crate::store::StoreError;
use lapin::message::Delivery;
use lapin::types::FieldTable;
use std::time::Duration;

/// Why a retry or dead-letter copy was not handed on; the delivery is then requeued.
#[derive(Debug, thiserror::Error)]
pub enum HandOnError {
    /// The copy's publish failed or its confirm did not come.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The copy could not be published at all, and archiving it directly failed too.
    #[error("archiving directly failed: {0}")]
    Archive(#[from] StoreError),
}

/// What a copy is made from.
pub struct Copy<'a> {
    pub publisher: &'a ConfirmedPublisher,
    pub ctx: &'a RouteContext,
    /// The plugin version this delivery runs on (its dead-letter headers name it).
    pub plugin: &'a Plugin,
    pub delivery: &'a Delivery,
    pub received: &'a Received,
}

/// Headers common to retries and dead letters: original route and failure times. The
/// broker's bookkeeping headers are dropped from retry copies (the tier hop writes its own)
/// and kept renamed on dead-letter copies (see `outgoing::without_broker_records`).
fn failure_headers(received: &Received, reason: &str, keep_broker_records: bool) -> FieldTable {
    let mut table = without_broker_records(&received.table, keep_broker_records);
    let now = now_ms();
    // Only a sealed copy still has a Carteiro first-failure time (others were renamed).
    let first = header_int(Some(&table), h::FIRST_FAILURE_AT).unwrap_or(now);
    set_text(&mut table, h::ORIGINAL_EXCHANGE, &received.exchange);
    set_text(&mut table, h::ORIGINAL_ROUTING_KEY, &received.routing_key);
    set_int(&mut table, h::FIRST_FAILURE_AT, first);
    set_int(&mut table, h::LAST_FAILURE_AT, now);
    set_text(&mut table, h::LAST_REASON, reason);
    table
}

async fn publish(
    copy: &Copy<'_>,
    exchange: String,
    routing_key: String,
    headers: FieldTable,
) -> Result<(), PublishError> {
    let ctx = copy.ctx;
    let kind = if exchange.is_empty() {
        "retry"
    } else {
        "dead-letter"
    };
    let mut span = ctx
        .deps
        .telemetry
        .republish_span(kind, &exchange, &routing_key);
    let properties = ctx.deps.seal.seal(
        &ctx.settings.queue,
        copy_properties(&copy.delivery.properties, headers),
        &copy.delivery.data,
    );
    let published = copy
        .publisher
        .publish(
            Outgoing {
                exchange,
                routing_key,
                properties,
                body: copy.delivery.data.clone(),
                mandatory: true,
            },
            ctx.settings.publish_timeout,
        )
        .await;
    if published.is_err() {
        span.fail("publish");
    }
    published
}

/// Publishes a copy to the retry tier for `delay`, with the attempt counter incremented.
pub async fn to_retry(
    copy: &Copy<'_>,
    delay: Duration,
    reason: &str,
) -> Result<Outcome, HandOnError> {
    let mut headers = failure_headers(copy.received, reason, false);
    set_int(
        &mut headers,
        h::ATTEMPT,
        i64::from(copy.received.attempt) + 1,
    );
    let queue = copy.ctx.settings.retry_queue(delay);
    match publish(copy, String::new(), queue, headers).await {
        Ok(()) => Ok(Outcome::Retried),
        Err(PublishError::Invalid(why)) => {
            let reason = format!(
                "a retry copy cannot be published ({why}); archived instead of retried; the \
                 handler's reason: {reason}"
            );
            archive_directly(copy, &reason, FailureKind::Unpublishable).await
        }
        Err(e) => Err(e.into()),
    }
}

/// Publishes to the route's dead-letter exchange with the reason and the plugin's identity.
pub async fn to_dead_letter(
    copy: &Copy<'_>,
    reason: &str,
    kind: FailureKind,
) -> Result<Outcome, HandOnError> {
    let ctx = copy.ctx;
    let mut headers = failure_headers(copy.received, reason, true);
    set_text(&mut headers, h::REASON, reason);
    set_text(&mut headers, h::FAILURE_KIND, kind.label());
    set_text(&mut headers, h::PLUGIN, copy.plugin.name());
    set_text(&mut headers, h::PLUGIN_SHA256, copy.plugin.digest());
    set_int(&mut headers, h::ATTEMPTS, i64::from(copy.received.attempt));
    set_text(&mut headers, h::ROUTE, &ctx.settings.queue);
    set_int(&mut headers, h::DEAD_LETTERED_AT, now_ms());
    match publish(
        copy,
        ctx.settings.dlx(),
        ctx.settings.queue.clone(),
        headers,
    )
    .await
    {
        Ok(()) => Ok(Outcome::DeadLettered),
        Err(PublishError::Invalid(why)) => {
            let reason = format!(
                "{reason} (archived directly: the dead-letter copy cannot be published: {why})"
            );
            archive_directly(copy, &reason, kind).await
        }
        Err(e) => Err(e.into()),
    }
}

/// Writes the dead letter into the archive without the broker's help.
async fn archive_directly(
    copy: &Copy<'_>,
    reason: &str,
    kind: FailureKind,
) -> Result<Outcome, HandOnError> {
    let ctx = copy.ctx;
    tracing::warn!(%reason, %kind, "archiving the dead letter directly into the store");
    let record = archiver::record(
        ctx,
        ctx.settings.queue.clone(),
        crate::broker::outgoing::cap_reason(reason),
        Some(copy.plugin.name().to_owned()),
        i64::from(copy.received.attempt),
        &copy.received.table,
        &copy.delivery.properties,
        copy.delivery.data.clone(),
        header_int(Some(&copy.received.table), h::FIRST_FAILURE_AT),
        now_ms(),
    );
    match ctx.deps.store.dead_letter_insert(&record).await {
        Ok(id) => {
            ctx.deps.metrics.dead_letter_archived(&ctx.settings.queue);
            tracing::info!(id, route = %ctx.settings.queue, "dead letter archived directly");
            Ok(Outcome::Archived)
        }
        // The store keeps any text: only store trouble is left.
        Err(e) => {
            ctx.deps.gate.report_failure(&e.to_string());
            Err(HandOnError::Archive(e))
        }
    }
}
