//! One delivery from receipt to ack (docs/architecture.md, "One delivery"), top to bottom:
//! 1. what the delivery says, its Carteiro headers checked: [`Received`];
//! 2. the plugin version it runs on: the stable one, or the canary by its key's hash;
//! 3. guards, idempotency key, inbox check, the handler: each ends in a [`Plan`], decided by
//!    `plan` (a pure function);
//! 4. the plan carried out by `apply` ([`Apply`]), the one place that publishes copies,
//!    commits, acks and records the outcome.
//!
//! Store trouble never sends a delivery back to the broker: the delivery waits here for the
//! store (the gate pauses the routes meanwhile, and reopens only when a write succeeds) and
//! is processed again, however long the outage, so it never counts against a quorum queue's
//! delivery limit. Past the broker's `consumer_timeout` the broker itself takes the
//! deliveries back (docs/limits.md). A panic while processing
//! is caught: the delivery is requeued once, and rejected to the dead-letter exchange if it
//! panics again on redelivery.

use super::acks::Acks;
use super::apply::{Apply, Settle};
use super::canary::Canary;
use super::config::MissingKeyPolicy;
use super::context::RouteContext;
use super::key;
use super::live_shadow::{Decision, RecordingKv};
use super::plan::{self, FailureKind, Outcome, Plan};
use super::received::Received;
use crate::broker::ConfirmedPublisher;
use crate::common::{FaultPoint, retry};
use crate::runtime::KvSource;
use crate::store::{CommitOutcome, StoreError};
use crate::telemetry::{self, DeliveryFacts};
use futures::FutureExt;
use lapin::message::Delivery;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// Handler re-runs allowed when its kv reads conflict with a concurrent commit.
const MAX_CONFLICT_RERUNS: u32 = 100;
/// Rounds of "store failed, wait for it, process again" after which a delivery that keeps
/// failing while the gate's write probe passes is reported (it is still held, never
/// requeued: a requeue would spend a quorum queue's delivery limit).
const STUBBORN_STORE_ROUNDS: u32 = 10;

/// One step of processing: settled, or the store failed and the delivery should wait.
enum Step {
    Done(Settle),
    StoreTrouble(StoreTrouble),
}

/// Where the store failed while a delivery was processed: it waits for the store, then is
/// processed again.
#[derive(Debug, thiserror::Error)]
pub(super) enum StoreTrouble {
    #[error("inbox check failed: {0}")]
    InboxCheck(StoreError),
    /// A kv read of the handler found the store unavailable.
    #[error("store unavailable during the handler: {0}")]
    Handler(StoreError),
    #[error("commit failed: {0}")]
    Commit(StoreError),
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
    ctx.deps.seal.learn_unknown_key(&delivery.properties).await;
    let received = Received::new(&ctx, &delivery);
    // The version this delivery runs on, whatever a reload swaps in meanwhile: the stable
    // one, or the canary when its key's hash falls in the canary's share.
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
    let apply = Apply {
        ctx: &ctx,
        plugin: &plugin,
        publisher: &publisher,
        delivery: &delivery,
        received: &received,
    };
    let run = AssertUnwindSafe(settle(&apply, tally.as_ref())).catch_unwind();
    let run = telemetry::within(&otel, run).instrument(span.clone()).await;
    let settle = match run {
        Ok(settle) => settle,
        Err(panic) => {
            let what = panic_text(panic.as_ref());
            ctx.deps.metrics.panic(&ctx.settings.queue);
            if delivery.redelivered {
                tracing::error!(parent: &span, panic = %what, "the gateway panicked processing this delivery again; dead-lettering it");
                let copied = apply.after_second_panic(&what);
                telemetry::within(&otel, copied)
                    .instrument(span.clone())
                    .await
            } else {
                tracing::error!(parent: &span, panic = %what, "the gateway panicked processing this delivery; requeueing it once");
                Settle::Requeue(format!("panic: {what}"))
            }
        }
    };
    apply.finish(settle, otel, &acks, started).await;
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Processes until settled; waits for the store (in place) when it fails.
async fn settle(apply: &Apply<'_>, tally: Option<&(Arc<Canary>, bool)>) -> Settle {
    let ctx = apply.ctx;
    if ctx.deps.fault == Some(FaultPoint::PanicOnBody) && apply.delivery.data.starts_with(b"panic")
    {
        panic!("fault injection: panic while processing a delivery");
    }
    let mut round = 0;
    // Between rounds once the gate is open again, so a delivery whose writes fail while the
    // probe's succeed (a grant revoked on one table) does not spin.
    let mut pause = retry::STORE_OUTAGE.backoff();
    loop {
        round += 1;
        match step(apply, tally).await {
            Step::Done(settle) => return settle,
            Step::StoreTrouble(why) => {
                ctx.deps.gate.report_failure(&why.to_string());
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

/// One round: guards, key, inbox check and handler runs, each ending in a plan that
/// `apply` carries out.
async fn step(apply: &Apply<'_>, tally: Option<&(Arc<Canary>, bool)>) -> Step {
    let (ctx, plugin, received) = (apply.ctx, apply.plugin, apply.received);
    // 1. Guards (checked at receipt), before any plugin code runs.
    if let Some(reason) = &received.refused {
        let plan = plan::dead_letter(reason.clone(), FailureKind::Rejected);
        return Step::Done(apply.hand_on(plan).await);
    }

    // 2-3. Attempt (in `received`) and idempotency key.
    let inbox_key = match key::extract(
        &ctx.settings.key_source,
        received.message_id.as_deref(),
        &received.headers,
        &apply.delivery.data,
    ) {
        Ok(key) => key,
        Err(why) => match ctx.settings.on_missing_key {
            MissingKeyPolicy::DeadLetter => {
                let plan = plan::dead_letter(why.to_string(), FailureKind::MissingKey);
                return Step::Done(apply.hand_on(plan).await);
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
        Err(e) => return Step::StoreTrouble(StoreTrouble::InboxCheck(e)),
    }

    // 5-6. Run the handler; re-run it if its reads conflict at commit.
    let message = received.message(apply.delivery);
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
                let verdict = invocation.verdict_for(ctx.settings.standard_errors);
                let facts = Ok((verdict, invocation.store_error.clone()));
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
                return Step::StoreTrouble(StoreTrouble::Handler(error));
            }
            (plan, _) => {
                if let Some(live) = live {
                    compare(live);
                }
                if let Some((canary, on_canary)) = tally {
                    canary.record(*on_canary, true);
                }
                return Step::Done(apply.hand_on(plan).await);
            }
        };
        match apply.commit(&inbox_key, &message, invocation).await {
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
                return Step::Done(apply.hand_on(plan).await);
            }
            Err(e) => return Step::StoreTrouble(StoreTrouble::Commit(e)),
        }
    }
    Step::Done(Settle::Requeue(format!(
        "kv conflicts persisted over {MAX_CONFLICT_RERUNS} handler runs"
    )))
}
