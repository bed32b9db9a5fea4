//! One delivery from receipt to ack (DESIGN.md "One delivery"): what the delivery says
//! ([`Received`]), guards, key, inbox check, handler, then the [`Plan`] (decided by
//! `plan`, a pure function) carried out here — the one place that talks to the publisher,
//! the committer, the acks and the metrics — and only then `basic.ack`.
//!
//! Store trouble never sends a delivery back to the broker: the delivery waits here for the
//! store (the gate pauses the routes meanwhile, and reopens only when a write succeeds) and
//! is processed again, however long the outage, so it never counts against a quorum queue's
//! delivery limit. Past the broker's `consumer_timeout` the broker itself takes the
//! deliveries back (docs/limits.md). A panic while processing
//! is caught: the delivery is requeued once, and rejected to the dead-letter exchange if it
//! panics again on redelivery.

use super::acks::Acks;
use super::canary::Canary;
use super::config::MissingKeyPolicy;
use super::context::RouteContext;
use super::disposition::{Copy, to_dead_letter, to_retry};
use super::key;
use super::live_shadow::{Decision, RecordingKv};
use super::plan::{self, FailureKind, Outcome, Plan, ReasonClass};
use super::received::Received;
use crate::broker::outgoing::cap_reason;
use crate::broker::{ConfirmedPublisher, JitteredBackoff};
use crate::common::{FaultPoint, hang_if};
use crate::runtime::{Invocation, KvSource, Message, Plugin};
use crate::store::{CommitOutcome, CommitRequest, KvRead, KvWrite, NewOutboxRow, StoreError};
use crate::telemetry::{self, DeliveryFacts};
use futures::FutureExt;
use lapin::message::Delivery;
use lapin::options::{BasicNackOptions, BasicRejectOptions};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Handler re-runs allowed when its kv reads conflict with a concurrent commit.
const MAX_CONFLICT_RERUNS: u32 = 100;
/// Wait before requeueing a delivery we could not settle (broker trouble).
const REQUEUE_DELAY: Duration = Duration::from_millis(500);
/// Rounds of "store failed, wait for it, process again" after which a delivery that keeps
/// failing while the gate's write probe passes is reported (it is still held, never
/// requeued: a requeue would spend a quorum queue's delivery limit).
const STUBBORN_STORE_ROUNDS: u32 = 10;

/// How a delivery is settled with the broker.
enum Settle {
    /// Effects committed, handed to a retry tier or the DLX, archived, or a duplicate: ack.
    Ack(Outcome),
    /// Nothing durable happened: give it back to the broker.
    Requeue(String),
    /// Give it to the route's dead-letter exchange through the broker (reject, no requeue).
    Reject(String),
}

/// One step of processing: settled, or the store failed and the delivery should wait.
enum Step {
    Done(Settle),
    StoreTrouble(String),
}

/// Processes one delivery and settles it. Every path acks, requeues or rejects, panics
/// included.
pub async fn process(
    ctx: Arc<RouteContext>,
    publisher: ConfirmedPublisher,
    acks: Acks,
    delivery: Delivery,
) {
    let started = Instant::now();
    // The version this delivery runs on, whatever a reload swaps in meanwhile: the stable
    // one, or the canary when its key's hash falls in the canary's share.
    let received = Received::new(&ctx, &delivery);
    let canary = ctx.slot.canary().and_then(|c| {
        let key = key::extract(
            &ctx.settings.key_source,
            received.message_id.as_deref(),
            &received.headers,
            &delivery.data,
        )
        .ok()?;
        c.assign(&key).then_some(c)
    });
    let plugin = match &canary {
        Some(c) => c.plugin.clone(),
        None => ctx.slot.plugin(),
    };
    // Every handler outcome of a plugin with a canary counts towards its rollback rule.
    let tally = ctx.slot.canary().map(|c| (c, canary.is_some()));
    let otel = ctx.deps.telemetry.delivery(&DeliveryFacts {
        queue: &ctx.settings.queue,
        exchange: &received.exchange,
        routing_key: &received.routing_key,
        message_id: received.message_id.as_deref(),
        attempt: received.attempt,
        redelivered: delivery.redelivered,
        plugin: plugin.name(),
        plugin_version: plugin.version(),
        headers: &received.headers,
    });
    let span = otel.log().clone();
    let run = AssertUnwindSafe(settle(
        &ctx,
        &plugin,
        tally.as_ref(),
        &publisher,
        &delivery,
        received,
    ))
    .catch_unwind();
    let run = telemetry::within(&otel, run).instrument(span.clone()).await;
    let settle = match run {
        Ok(settle) => settle,
        Err(panic) => {
            let what = panic_text(panic.as_ref());
            ctx.deps.metrics.panic(&ctx.settings.queue);
            if delivery.redelivered {
                tracing::error!(parent: &span, panic = %what, "the gateway panicked processing this delivery again; dead-lettering it");
                let copied = dead_letter_after_panic(&ctx, &plugin, &publisher, &delivery, &what);
                telemetry::within(&otel, copied)
                    .instrument(span.clone())
                    .await
            } else {
                tracing::error!(parent: &span, panic = %what, "the gateway panicked processing this delivery; requeueing it once");
                Settle::Requeue(format!("panic: {what}"))
            }
        }
    };
    let _entered = span.enter();
    let tag = delivery.delivery_tag;
    match &settle {
        Settle::Ack(outcome) => otel.end(*outcome, None),
        Settle::Requeue(_) => otel.end(Outcome::Requeued, Some("requeued")),
        Settle::Reject(_) => otel.end(Outcome::DeadLettered, Some("rejected")),
    }
    let (queue, metrics) = (&ctx.settings.queue, &ctx.deps.metrics);
    match settle {
        Settle::Ack(outcome) => {
            metrics.delivery(queue, outcome, started.elapsed());
            metrics.version_delivery(queue, plugin.version(), outcome);
            tracing::debug!(
                outcome = outcome.label(),
                sha256 = plugin.digest(),
                "delivery settled"
            );
            acks.ack(tag);
        }
        Settle::Requeue(why) => {
            metrics.delivery(queue, Outcome::Requeued, started.elapsed());
            metrics.version_delivery(queue, plugin.version(), Outcome::Requeued);
            tracing::warn!(reason = %why, "requeueing delivery; nothing was committed");
            tokio::time::sleep(REQUEUE_DELAY).await;
            let requeue = BasicNackOptions {
                requeue: true,
                ..Default::default()
            };
            if let Err(e) = delivery.acker.nack(requeue).await {
                tracing::warn!(error = %e, "nack failed; the broker requeues it when the channel closes");
            }
            acks.settled_elsewhere(tag);
        }
        Settle::Reject(why) => {
            metrics.delivery(queue, Outcome::DeadLettered, started.elapsed());
            metrics.version_delivery(queue, plugin.version(), Outcome::DeadLettered);
            tracing::warn!(reason = %why, "rejecting delivery to the dead-letter exchange");
            if let Err(e) = delivery
                .acker
                .reject(BasicRejectOptions { requeue: false })
                .await
            {
                tracing::warn!(error = %e, "reject failed; the broker requeues it when the channel closes");
            }
            acks.settled_elsewhere(tag);
        }
    }
}

/// A delivery that panicked twice goes to the dead-letter exchange: as a Carteiro copy with
/// the panic as its reason, or, if even that fails or panics, rejected for the broker to
/// dead-letter.
async fn dead_letter_after_panic(
    ctx: &RouteContext,
    plugin: &Plugin,
    publisher: &ConfirmedPublisher,
    delivery: &Delivery,
    what: &str,
) -> Settle {
    let reason = cap_reason(&format!(
        "the gateway panicked twice processing this message: {what}"
    ));
    ctx.deps.telemetry.delivery_failed(FailureKind::Panic);
    let copied = AssertUnwindSafe(async {
        let received = Received::new(ctx, delivery);
        let copy = Copy {
            publisher,
            ctx,
            plugin,
            delivery,
            received: &received,
        };
        to_dead_letter(&copy, &reason, FailureKind::Panic).await
    })
    .catch_unwind()
    .await;
    match copied {
        Ok(Ok(outcome)) => {
            count_handed_on(ctx, outcome, FailureKind::Panic.class());
            Settle::Ack(outcome)
        }
        // Rejected to the broker's dead-letter exchange: still a dead letter of ours.
        _ => {
            ctx.deps
                .metrics
                .dead_letter(&ctx.settings.queue, FailureKind::Panic.class());
            Settle::Reject(reason)
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Processes until settled; waits for the store (in place) when it fails.
async fn settle(
    ctx: &RouteContext,
    plugin: &Plugin,
    tally: Option<&(Arc<Canary>, bool)>,
    publisher: &ConfirmedPublisher,
    delivery: &Delivery,
    received: Received,
) -> Settle {
    if ctx.deps.fault == Some(FaultPoint::PanicOnBody) && delivery.data.starts_with(b"panic") {
        panic!("fault injection: panic while processing a delivery");
    }
    let mut round = 0;
    // Between rounds once the gate is open again, so a delivery whose writes fail while the
    // probe's succeed (a grant revoked on one table) does not spin.
    let mut pause = JitteredBackoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        round += 1;
        match step(ctx, plugin, tally, publisher, delivery, &received).await {
            Step::Done(settle) => return settle,
            Step::StoreTrouble(why) => {
                ctx.deps.gate.report_failure(&why);
                if round == STUBBORN_STORE_ROUNDS {
                    tracing::error!(reason = %why, round, "the store keeps refusing this delivery's writes although its write probe succeeds; still holding it (check the database's grants and locks on the carteiro tables)");
                } else {
                    tracing::warn!(reason = %why, round, "store trouble: holding the delivery until the store takes writes");
                }
                ctx.deps.gate.wait_healthy().await;
                if round > 1 {
                    tokio::time::sleep(pause.next_delay()).await;
                }
            }
        }
    }
}

async fn step(
    ctx: &RouteContext,
    plugin: &Plugin,
    tally: Option<&(Arc<Canary>, bool)>,
    publisher: &ConfirmedPublisher,
    delivery: &Delivery,
    received: &Received,
) -> Step {
    let copy = Copy {
        publisher,
        ctx,
        plugin,
        delivery,
        received,
    };
    // 1. Guards, before any plugin code runs.
    if let Some(reason) = received.guard(ctx) {
        return Step::Done(
            carry_out(&copy, plan::dead_letter(reason, FailureKind::Rejected)).await,
        );
    }

    // 2-3. Attempt (in `received`) and idempotency key.
    let inbox_key = match key::extract(
        &ctx.settings.key_source,
        received.message_id.as_deref(),
        &received.headers,
        &delivery.data,
    ) {
        Ok(key) => key,
        Err(why) => match ctx.settings.on_missing_key {
            MissingKeyPolicy::DeadLetter => {
                return Step::Done(
                    carry_out(
                        &copy,
                        plan::dead_letter(why.to_string(), FailureKind::MissingKey),
                    )
                    .await,
                );
            }
            MissingKeyPolicy::Process => format!("unkeyed:{}", uuid::Uuid::now_v7()),
        },
    };

    // 4. Duplicate check (the commit re-checks it atomically).
    ctx.deps.gate.wait_healthy().await;
    match ctx
        .deps
        .reads
        .inbox_contains(&ctx.settings.queue, &inbox_key)
        .await
    {
        Ok(true) => {
            tracing::info!(key = %inbox_key, "duplicate: already processed, acking without running the handler");
            return Step::Done(Settle::Ack(Outcome::Duplicate));
        }
        Ok(false) => {}
        Err(e) => return Step::StoreTrouble(format!("inbox check failed: {e}")),
    }

    // 5-6. Run the handler; re-run it if its reads conflict at commit.
    let message = received.message(delivery);
    // A live shadow compares its decision with the one that settles this delivery.
    let shadow = ctx.slot.shadow().filter(|s| s.sampled());
    // Held from the first conflict on: re-runs of contended deliveries take turns, so a hot
    // key makes progress one commit at a time instead of livelocking in optimistic retries.
    let mut serialized = None;
    for _ in 0..MAX_CONFLICT_RERUNS {
        let started = Instant::now();
        let recording = shadow
            .as_ref()
            .map(|_| Arc::new(RecordingKv::new(ctx.deps.kv.clone())));
        let kv: Arc<dyn KvSource> = match &recording {
            Some(r) => r.clone(),
            None => ctx.deps.kv.clone(),
        };
        let mut handler_span = ctx
            .deps
            .telemetry
            .handler_span(plugin.name(), plugin.version());
        let result = plugin.handle(&message, kv).await;
        let compare = |live: Decision| {
            if let (Some(shadow), Some(recording)) = (&shadow, &recording) {
                shadow.compare_later(
                    &ctx.settings.queue,
                    &message,
                    recording.take(),
                    ctx.deps.kv.clone(),
                    live,
                );
            }
        };
        let live = shadow.as_ref().map(|_| Decision::of(&result));
        ctx.deps
            .metrics
            .handler_duration(&ctx.settings.queue, started.elapsed());
        if let Err(failure) = &result {
            ctx.deps
                .metrics
                .plugin_failure(&ctx.settings.queue, failure.kind());
            handler_span.fail(failure.kind().label());
        }
        drop(handler_span);
        let (plan, invocation) = match result {
            Ok(invocation) => {
                let facts = Ok((invocation.verdict.clone(), invocation.store_error.clone()));
                let plan = plan::after_handler(
                    received.attempt,
                    &ctx.settings.retry,
                    ctx.settings.on_plugin_failure,
                    &facts,
                );
                (plan, Some(invocation))
            }
            Err(failure) => (
                plan::after_handler(
                    received.attempt,
                    &ctx.settings.retry,
                    ctx.settings.on_plugin_failure,
                    &Err(failure),
                ),
                None,
            ),
        };
        let invocation = match (plan, invocation) {
            (Plan::Commit, Some(invocation)) => invocation,
            (Plan::StoreTrouble(error), _) => {
                return Step::StoreTrouble(format!(
                    "store unavailable during the handler: {error}"
                ));
            }
            (plan, _) => {
                if let Some(live) = live {
                    compare(live);
                }
                if let Some((canary, on_canary)) = tally {
                    canary.record(*on_canary, true);
                }
                return Step::Done(carry_out(&copy, plan).await);
            }
        };
        // The delivery span's own context when telemetry is on (the relay's publish span
        // links to it), else the incoming one, carried on.
        let trace = ctx
            .deps
            .telemetry
            .traceparent()
            .map(|t| ("traceparent".to_owned(), t))
            .or_else(|| trace_context(&message));
        let mut commit_span = ctx.deps.telemetry.commit_span();
        let committed = commit(ctx, plugin, &inbox_key, trace, invocation).await;
        match &committed {
            Ok(outcome) => commit_span.set("carteiro.commit.outcome", commit_label(outcome)),
            Err(_) => commit_span.fail("store"),
        }
        drop(commit_span);
        match committed {
            Ok(CommitOutcome::Committed) => {
                if let Some(live) = live {
                    compare(live);
                }
                if let Some((canary, on_canary)) = tally {
                    canary.record(*on_canary, false);
                }
                return Step::Done(Settle::Ack(Outcome::Acked));
            }
            Ok(CommitOutcome::Duplicate) => return Step::Done(Settle::Ack(Outcome::Duplicate)),
            Ok(CommitOutcome::Conflict) => {
                ctx.deps.metrics.conflict(&ctx.settings.queue);
                if serialized.is_none() {
                    serialized = Some(ctx.rerun_turn.lock().await);
                }
            }
            Ok(CommitOutcome::Rejected(why)) => {
                let plan = plan::dead_letter(
                    format!("the store refused the handler's effects: {why}"),
                    FailureKind::Rejected,
                );
                return Step::Done(carry_out(&copy, plan).await);
            }
            Err(e) => return Step::StoreTrouble(format!("commit failed: {e}")),
        }
    }
    Step::Done(Settle::Requeue(format!(
        "kv conflicts persisted over {MAX_CONFLICT_RERUNS} handler runs"
    )))
}

/// Carries out a retry or dead-letter plan: a confirmed copy, then ack.
async fn carry_out(copy: &Copy<'_>, plan: Plan) -> Settle {
    match plan {
        Plan::Retry {
            delay,
            reason,
            class,
        } => {
            copy.ctx.deps.telemetry.delivery_failed(FailureKind::Retry);
            tracing::info!(attempt = copy.received.attempt, ?delay, %reason, "scheduling retry");
            match to_retry(copy, delay, &reason).await {
                Ok(outcome) => {
                    // A retry copy too big to publish was archived as a dead letter instead.
                    let class = if outcome == Outcome::Retried {
                        class
                    } else {
                        FailureKind::Unpublishable.class()
                    };
                    count_handed_on(copy.ctx, outcome, class);
                    Settle::Ack(outcome)
                }
                Err(e) => Settle::Requeue(format!("retry publish failed: {e}")),
            }
        }
        Plan::DeadLetter {
            reason,
            kind,
            class,
        } => {
            copy.ctx.deps.telemetry.delivery_failed(kind);
            tracing::warn!(%reason, %kind, "dead-lettering");
            match to_dead_letter(copy, &reason, kind).await {
                Ok(outcome) => {
                    count_handed_on(copy.ctx, outcome, class);
                    Settle::Ack(outcome)
                }
                Err(e) => Settle::Requeue(format!("dead-letter failed: {e}")),
            }
        }
        // `step` handles these itself; never reached.
        Plan::Commit | Plan::StoreTrouble(_) => {
            Settle::Requeue("internal: nothing to carry out".to_owned())
        }
    }
}

/// Counts a confirmed retry or dead-letter copy (or a dead letter archived directly) by
/// its reason class.
fn count_handed_on(ctx: &RouteContext, outcome: Outcome, class: ReasonClass) {
    match outcome {
        Outcome::Retried => ctx.deps.metrics.retry(&ctx.settings.queue, class),
        Outcome::DeadLettered | Outcome::Archived => {
            ctx.deps.metrics.dead_letter(&ctx.settings.queue, class)
        }
        _ => {}
    }
}

/// `carteiro.commit.outcome` of a commit span.
fn commit_label(outcome: &CommitOutcome) -> &'static str {
    match outcome {
        CommitOutcome::Committed => "committed",
        CommitOutcome::Duplicate => "duplicate",
        CommitOutcome::Conflict => "conflict",
        CommitOutcome::Rejected(_) => "rejected",
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
    plugin: &Plugin,
    inbox_key: &str,
    trace: Option<(String, String)>,
    invocation: Invocation,
) -> Result<CommitOutcome, StoreError> {
    let effects = invocation.effects;
    let plugin = plugin.name().to_owned();
    let request = CommitRequest {
        route: ctx.settings.queue.clone(),
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
                route: ctx.settings.queue.clone(),
                plugin: plugin.clone(),
                exchange: e.exchange,
                routing_key: e.routing_key,
                headers: e.headers,
                content_type: e.content_type,
                payload: e.payload,
                ordering_key: format!("{}/{inbox_key}", ctx.settings.queue),
            })
            .collect(),
    };
    hang_if(ctx.deps.fault, FaultPoint::HangBeforeCommit).await;
    let outcome = ctx.deps.committer.commit(request).await?;
    hang_if(ctx.deps.fault, FaultPoint::HangAfterCommit).await;
    Ok(outcome)
}
