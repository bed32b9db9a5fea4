//! One delivery from receipt to ack (DESIGN.md "One delivery"): guards, attempt, key,
//! inbox check, handler, verdict, commit or hand-off, and only then `basic.ack`.

use super::acks::Acks;
use super::context::{FaultPoint, RouteContext};
use super::disposition::{original_route, to_dead_letter, to_retry};
use super::headers as h;
use super::key;
use crate::broker::ConfirmedPublisher;
use crate::broker::headers::{header_int, to_text_pairs};
use crate::config::{FailurePolicy, MissingKeyPolicy};
use crate::runtime::{Header, Invocation, Message, Verdict};
use crate::store::{CommitOutcome, CommitRequest, KvRead, KvWrite, NewOutboxRow};
use lapin::message::Delivery;
use lapin::options::BasicNackOptions;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Handler re-runs allowed when its kv reads conflict with a concurrent commit.
const MAX_CONFLICT_RERUNS: u32 = 100;
/// Wait before requeueing a delivery we could not settle (store or broker trouble).
const REQUEUE_DELAY: Duration = Duration::from_millis(500);

/// How a delivery is settled with the broker.
enum Settle {
    /// Effects committed, handed to a retry tier or the DLX, or a duplicate: ack.
    Ack(&'static str),
    /// Nothing durable happened: give it back to the broker.
    Requeue(String),
}

/// Processes one delivery and settles it. Never panics; every path acks or requeues.
pub async fn process(
    ctx: Arc<RouteContext>,
    publisher: ConfirmedPublisher,
    acks: Acks,
    delivery: Delivery,
) {
    let (exchange, routing_key) = original_route(&delivery);
    let span = tracing::info_span!(
        "delivery",
        messaging.system = "rabbitmq",
        messaging.destination.name = %ctx.queue,
        messaging.rabbitmq.destination.routing_key = %routing_key,
        messaging.message.id = delivery.properties.message_id().as_ref().map(|s| s.as_str()).unwrap_or(""),
        plugin = ctx.plugin.name(),
    );
    let started = Instant::now();
    let settle = decide(&ctx, &publisher, &delivery, exchange, routing_key)
        .instrument(span.clone())
        .await;
    let _entered = span.enter();
    match settle {
        Settle::Ack(outcome) => {
            ctx.metrics.delivery(&ctx.queue, outcome, started.elapsed());
            acks.ack(delivery.delivery_tag);
        }
        Settle::Requeue(why) => {
            ctx.metrics
                .delivery(&ctx.queue, "requeued", started.elapsed());
            tracing::warn!(reason = %why, "requeueing delivery; nothing was committed");
            tokio::time::sleep(REQUEUE_DELAY).await;
            let requeue = BasicNackOptions {
                requeue: true,
                ..Default::default()
            };
            if let Err(e) = delivery.acker.nack(requeue).await {
                tracing::warn!(error = %e, "nack failed; the broker requeues it when the channel closes");
            }
            acks.settled_elsewhere(delivery.delivery_tag);
        }
    }
}

async fn decide(
    ctx: &RouteContext,
    publisher: &ConfirmedPublisher,
    delivery: &Delivery,
    exchange: String,
    routing_key: String,
) -> Settle {
    let props = &delivery.properties;
    let attempt = header_int(props.headers().as_ref(), h::ATTEMPT)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(1)
        .max(1);
    let dead_letter = |reason: String, kind: &'static str| async move {
        tracing::warn!(%reason, kind, "dead-lettering");
        match to_dead_letter(publisher, ctx, delivery, attempt, &reason, kind).await {
            Ok(()) => Settle::Ack("dead_lettered"),
            Err(e) => Settle::Requeue(format!("dead-letter publish failed: {e}")),
        }
    };

    // 1. Guards, before any plugin code runs.
    let size = delivery.data.len() as u64;
    if size > ctx.max_body_size {
        let reason = format!(
            "body of {size} bytes exceeds the route's max_body_size of {}",
            ctx.max_body_size
        );
        return dead_letter(reason, "rejected").await;
    }
    let content_type = props.content_type().as_ref().map(|c| c.as_str().to_owned());
    if let Some(required) = &ctx.content_type
        && content_type.as_deref() != Some(required.as_str())
    {
        let reason =
            format!("content type {content_type:?} is not the route's required `{required}`");
        return dead_letter(reason, "rejected").await;
    }

    // 2-3. Attempt and idempotency key.
    let headers = props
        .headers()
        .as_ref()
        .map(to_text_pairs)
        .unwrap_or_default();
    let message_id = props.message_id().as_ref().map(|s| s.as_str().to_owned());
    let inbox_key = match key::extract(
        &ctx.key_source,
        message_id.as_deref(),
        &headers,
        &delivery.data,
    ) {
        Ok(key) => key,
        Err(why) => match ctx.on_missing_key {
            MissingKeyPolicy::DeadLetter => return dead_letter(why, "missing-key").await,
            MissingKeyPolicy::Process => format!("unkeyed:{}", uuid::Uuid::now_v7()),
        },
    };

    // 4. Duplicate check (the commit re-checks it atomically).
    ctx.gate.wait_healthy().await;
    match ctx.reads.inbox_contains(&ctx.queue, &inbox_key).await {
        Ok(true) => {
            tracing::info!(key = %inbox_key, "duplicate: already processed, acking without running the handler");
            return Settle::Ack("duplicate");
        }
        Ok(false) => {}
        Err(e) => {
            ctx.gate.report_failure(&e.to_string());
            return Settle::Requeue(format!("store unavailable: {e}"));
        }
    }

    // 5-6. Run the handler; re-run it if its reads conflict at commit.
    let message = Message {
        id: message_id,
        exchange,
        routing_key,
        headers: headers
            .into_iter()
            .map(|(name, value)| Header { name, value })
            .collect(),
        content_type,
        body: delivery.data.clone(),
        attempt,
        redelivered: delivery.redelivered,
    };
    // Held from the first conflict on: re-runs of contended deliveries take turns, so a hot
    // key makes progress one commit at a time instead of livelocking in optimistic retries.
    let mut serialized = None;
    for _ in 0..MAX_CONFLICT_RERUNS {
        let started = Instant::now();
        let result = ctx.plugin.handle(&message, ctx.kv.clone()).await;
        ctx.metrics.handler_duration(&ctx.queue, started.elapsed());
        let invocation = match result {
            Ok(invocation) => invocation,
            Err(failure) => {
                ctx.metrics.plugin_failure(&ctx.queue, failure.kind());
                let reason = failure.to_string();
                return match ctx.on_plugin_failure {
                    FailurePolicy::Retry => {
                        retry_or_exhaust(
                            ctx,
                            publisher,
                            delivery,
                            attempt,
                            None,
                            &reason,
                            failure.kind(),
                        )
                        .await
                    }
                    FailurePolicy::DeadLetter => dead_letter(reason, failure.kind()).await,
                };
            }
        };
        if let Some(error) = &invocation.store_error {
            ctx.gate.report_failure(error);
            return Settle::Requeue(format!("store unavailable during the handler: {error}"));
        }
        match &invocation.verdict {
            Verdict::Ack => {
                match commit(ctx, &inbox_key, trace_context(&message), invocation).await {
                    Ok(CommitOutcome::Committed) => return Settle::Ack("acked"),
                    Ok(CommitOutcome::Duplicate) => return Settle::Ack("duplicate"),
                    Ok(CommitOutcome::Conflict) => {
                        ctx.metrics.conflict(&ctx.queue);
                        if serialized.is_none() {
                            serialized = Some(ctx.rerun_turn.lock().await);
                        }
                        continue;
                    }
                    Ok(CommitOutcome::Rejected(why)) => {
                        return dead_letter(
                            format!("the store refused the handler's effects: {why}"),
                            "rejected",
                        )
                        .await;
                    }
                    Err(e) => {
                        ctx.gate.report_failure(&e);
                        return Settle::Requeue(format!("commit failed: {e}"));
                    }
                }
            }
            Verdict::Retry(request) => {
                let delay = request.delay_ms.map(Duration::from_millis);
                return retry_or_exhaust(
                    ctx,
                    publisher,
                    delivery,
                    attempt,
                    delay,
                    &request.reason,
                    "retry",
                )
                .await;
            }
            Verdict::DeadLetter(reason) => return dead_letter(reason.clone(), "dead-letter").await,
        }
    }
    Settle::Requeue(format!(
        "kv conflicts persisted over {MAX_CONFLICT_RERUNS} handler runs"
    ))
}

async fn retry_or_exhaust(
    ctx: &RouteContext,
    publisher: &ConfirmedPublisher,
    delivery: &Delivery,
    attempt: u32,
    requested: Option<Duration>,
    reason: &str,
    kind: &'static str,
) -> Settle {
    if attempt >= ctx.retry.max_attempts {
        let reason = format!("retries exhausted after {attempt} attempts: {reason}");
        tracing::warn!(%reason, "dead-lettering");
        return match to_dead_letter(publisher, ctx, delivery, attempt, &reason, kind).await {
            Ok(()) => Settle::Ack("dead_lettered"),
            Err(e) => Settle::Requeue(format!("dead-letter publish failed: {e}")),
        };
    }
    let delay = requested.unwrap_or_else(|| ctx.retry.delay_after(attempt));
    tracing::info!(attempt, ?delay, reason, "scheduling retry");
    match to_retry(publisher, ctx, delivery, attempt, delay, reason).await {
        Ok(()) => Settle::Ack("retried"),
        Err(e) => Settle::Requeue(format!("retry publish failed: {e}")),
    }
}

/// The W3C trace context of the incoming message, carried onto the events it causes.
fn trace_context(message: &Message) -> Option<(String, String)> {
    message
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("traceparent"))
        .map(|h| ("traceparent".to_owned(), h.value.clone()))
}

/// Commits inbox + kv + outbox through the group committer. `Err` is a store failure.
async fn commit(
    ctx: &RouteContext,
    inbox_key: &str,
    trace: Option<(String, String)>,
    invocation: Invocation,
) -> Result<CommitOutcome, String> {
    let effects = invocation.effects;
    let plugin = ctx.plugin.name().to_owned();
    let request = CommitRequest {
        route: ctx.queue.clone(),
        inbox_key: inbox_key.to_owned(),
        namespace: plugin.clone(),
        reads: effects
            .reads
            .into_iter()
            .map(|(key, observed_version)| KvRead {
                key,
                observed_version,
            })
            .collect(),
        writes: effects
            .writes
            .into_iter()
            .map(|(key, value)| KvWrite { key, value })
            .collect(),
        outbox: effects
            .events
            .into_iter()
            .map(|mut e| {
                if let Some(trace) = &trace
                    && !e
                        .headers
                        .iter()
                        .any(|(k, _)| k.eq_ignore_ascii_case(&trace.0))
                {
                    e.headers.push(trace.clone());
                }
                e
            })
            .map(|e| NewOutboxRow {
                event_id: e.event_id,
                route: ctx.queue.clone(),
                plugin: plugin.clone(),
                exchange: e.exchange,
                routing_key: e.routing_key,
                headers: e.headers,
                content_type: e.content_type,
                payload: e.payload,
                ordering_key: format!("{}/{inbox_key}", ctx.queue),
            })
            .collect(),
    };
    hang_if(ctx.fault, FaultPoint::HangBeforeCommit).await;
    let outcome = ctx
        .committer
        .commit(request)
        .await
        .map_err(|e| e.to_string())?;
    hang_if(ctx.fault, FaultPoint::HangAfterCommit).await;
    Ok(outcome)
}

/// Test-only: stop here forever so the test can SIGKILL the process at this exact point.
pub(crate) async fn hang_if(fault: Option<FaultPoint>, point: FaultPoint) {
    if fault == Some(point) {
        tracing::warn!(?point, "fault injection: hanging until killed");
        std::future::pending::<()>().await;
    }
}
