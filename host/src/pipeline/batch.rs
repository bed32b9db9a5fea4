//! A route with `batch`: deliveries gathered by the worker run through the plugin's
//! `handle-batch` in one call, on one instance, and each is settled by its own verdict.
//!
//! Per delivery, as in `process`: guards, idempotency key, inbox check (a duplicate is acked
//! without running). Then one `handle-batch` call for the rest; each message's effects are
//! its own (`runtime::batch`). The acked messages' kv writes, outbox rows and inbox records
//! are committed in one transaction (`CommitterHandle::commit_all`; each request still
//! stands alone, so a conflicting or refused one sinks none of the others); a message that
//! retries or dead-letters keeps none of its effects, exactly as alone. A trap, timeout or
//! limit fails every message of the batch the way it fails one delivery (route policy).
//!
//! Handed to the one-delivery path (`process`, which calls `handle`) instead: a delivery
//! whose key repeats an earlier one of the batch (after the batch settled, so the inbox
//! decides: it still runs once), a delivery whose inbox check, kv read or commit met store
//! trouble (`process` holds it until the store answers), a kv conflict at commit (`process`
//! re-runs it), everything while a canary or a live shadow runs on the route's plugin or if
//! a reload swapped in a plugin without `handle-batch`, and whatever was unsettled when the
//! gateway panicked.

use super::acks::Acks;
use super::apply::{Apply, Settle};
use super::config::MissingKeyPolicy;
use super::context::RouteContext;
use super::key;
use super::plan::{self, FailureKind, Outcome, Plan};
use super::process::{StoreTrouble, process};
use super::received::Received;
use crate::broker::ConfirmedPublisher;
use crate::common::{FaultPoint, hang_if};
use crate::runtime::{Invocation, Message, Plugin};
use crate::store::CommitOutcome;
use crate::telemetry::{self, DeliveryFacts, DeliverySpan};
use futures::FutureExt;
use lapin::message::Delivery;
use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// One delivery of the batch.
struct Entry {
    delivery: Delivery,
    received: Received,
    started: Instant,
}

/// What became of each delivery of a batch, by index.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Not settled yet.
    Open,
    /// Settled (acked, requeued or rejected).
    Settled,
    /// For the one-delivery path, after the batch.
    Alone,
}

/// Processes a gathered batch and settles every delivery of it.
pub async fn process_batch(
    ctx: Arc<RouteContext>,
    publisher: ConfirmedPublisher,
    acks: Acks,
    deliveries: Vec<Delivery>,
) {
    let plugin = ctx.slot.plugin();
    let batchable =
        plugin.supports_batch() && ctx.slot.canary().is_none() && ctx.slot.shadow().is_none();
    if !batchable {
        alone(&ctx, &publisher, &acks, deliveries).await;
        return;
    }
    for delivery in &deliveries {
        ctx.deps.seal.learn_unknown_key(&delivery.properties).await;
    }
    let entries: Vec<Entry> = deliveries
        .into_iter()
        .map(|delivery| Entry {
            received: Received::new(&ctx, &delivery),
            delivery,
            started: Instant::now(),
        })
        .collect();
    // Each delivery's span, taken when it is settled.
    let mut spans: Vec<Option<DeliverySpan>> = Vec::with_capacity(entries.len());
    for entry in &entries {
        spans.push(Some(ctx.deps.telemetry.delivery(&DeliveryFacts {
            queue: &ctx.settings.queue,
            exchange: &entry.received.exchange,
            routing_key: &entry.received.routing_key,
            message_id: entry.received.message_id.as_deref(),
            attempt: entry.received.attempt,
            redelivered: entry.delivery.redelivered,
            plugin: plugin.name(),
            plugin_version: plugin.version(),
            headers: &entry.received.headers,
        })));
    }
    let mut fates = vec![Fate::Open; entries.len()];
    let batch = Batch {
        ctx: &ctx,
        plugin: &plugin,
        publisher: &publisher,
        acks: &acks,
        entries: &entries,
    };
    let run = AssertUnwindSafe(batch.run(&mut spans, &mut fates))
        .catch_unwind()
        .await;
    if run.is_err() {
        ctx.deps.metrics.panic(&ctx.settings.queue);
        tracing::error!(queue = %ctx.settings.queue, "the gateway panicked processing a batch; its unsettled deliveries go through the one-delivery path");
    }
    // Whatever still has its span was never settled (a settled delivery's span is taken
    // when its settling begins): handed on, deferred, or left open by a panic.
    let left: Vec<Delivery> = entries
        .into_iter()
        .zip(spans)
        .filter(|(_, span)| span.is_some())
        .map(|(entry, _)| entry.delivery)
        .collect();
    alone(&ctx, &publisher, &acks, left).await;
}

/// Each delivery through the one-delivery path, concurrently.
async fn alone(
    ctx: &Arc<RouteContext>,
    publisher: &ConfirmedPublisher,
    acks: &Acks,
    deliveries: Vec<Delivery>,
) {
    futures::future::join_all(
        deliveries
            .into_iter()
            .map(|d| process(ctx.clone(), publisher.clone(), acks.clone(), d)),
    )
    .await;
}

/// A gathered batch and what acting on it takes.
struct Batch<'a> {
    ctx: &'a RouteContext,
    plugin: &'a Plugin,
    publisher: &'a ConfirmedPublisher,
    acks: &'a Acks,
    entries: &'a [Entry],
}

impl Batch<'_> {
    /// How delivery `i` is acted on (see `apply`).
    fn apply(&self, i: usize) -> Apply<'_> {
        Apply {
            ctx: self.ctx,
            plugin: self.plugin,
            publisher: self.publisher,
            delivery: &self.entries[i].delivery,
            received: &self.entries[i].received,
        }
    }

    /// Settles delivery `i` inside its own span: a retry or dead-letter `plan` carried out,
    /// or `settled` as it is.
    async fn settle(
        &self,
        i: usize,
        spans: &mut [Option<DeliverySpan>],
        plan: Option<Plan>,
        settled: Option<Settle>,
    ) {
        let Some(otel) = spans[i].take() else {
            return;
        };
        let apply = self.apply(i);
        let span = otel.log().clone();
        let settle = match (plan, settled) {
            (Some(plan), _) => {
                telemetry::within(&otel, apply.hand_on(plan))
                    .instrument(span)
                    .await
            }
            (None, Some(settled)) => settled,
            (None, None) => Settle::Requeue("internal: nothing to settle".to_owned()),
        };
        apply
            .finish(settle, otel, self.acks, self.entries[i].started)
            .await;
    }

    /// The batch: checks, one `handle-batch` call, one commit, each delivery settled.
    async fn run(&self, spans: &mut [Option<DeliverySpan>], fates: &mut [Fate]) {
        let (ctx, plugin, entries) = (self.ctx, self.plugin, self.entries);
        if ctx.deps.fault == Some(FaultPoint::PanicOnBody)
            && entries
                .iter()
                .any(|e| e.delivery.data.starts_with(b"panic"))
        {
            panic!("fault injection: panic while processing a batch");
        }
        // 1. Guards, key, duplicates within the batch and in the inbox.
        let mut keys_seen = HashSet::new();
        let mut keyed: Vec<(usize, String)> = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            if let Some(reason) = &entry.received.refused {
                let plan = plan::dead_letter(reason.clone(), FailureKind::Rejected);
                self.settle(i, spans, Some(plan), None).await;
                fates[i] = Fate::Settled;
                continue;
            }
            let inbox_key = match key::extract(
                &ctx.settings.key_source,
                entry.received.message_id.as_deref(),
                &entry.received.headers,
                &entry.delivery.data,
            ) {
                Ok(key) => key,
                Err(why) => match ctx.settings.on_missing_key {
                    MissingKeyPolicy::DeadLetter => {
                        let plan = plan::dead_letter(why.to_string(), FailureKind::MissingKey);
                        self.settle(i, spans, Some(plan), None).await;
                        fates[i] = Fate::Settled;
                        continue;
                    }
                    MissingKeyPolicy::Process => format!("unkeyed:{}", uuid::Uuid::now_v7()),
                },
            };
            // The same key twice in one batch: the second waits for the first to settle.
            if !keys_seen.insert(inbox_key.clone()) {
                fates[i] = Fate::Alone;
                continue;
            }
            keyed.push((i, inbox_key));
        }
        // All at once, so the store's batched reader answers them in one query.
        let found = futures::future::join_all(
            keyed
                .iter()
                .map(|(_, key)| ctx.deps.reads.inbox_contains(&ctx.settings.queue, key)),
        )
        .await;
        let mut candidates: Vec<(usize, String)> = Vec::new();
        for ((i, inbox_key), found) in keyed.into_iter().zip(found) {
            match found {
                Ok(true) => {
                    tracing::info!(key = %inbox_key, "duplicate: already processed, acking without running the handler");
                    self.settle(i, spans, None, Some(Settle::Ack(Outcome::Duplicate)))
                        .await;
                    fates[i] = Fate::Settled;
                }
                Ok(false) => candidates.push((i, inbox_key)),
                Err(e) => {
                    ctx.deps
                        .gate
                        .report_failure(&format!("inbox check failed: {e}"));
                    fates[i] = Fate::Alone;
                }
            }
        }
        if candidates.is_empty() {
            return;
        }

        // 2. One handle-batch call.
        let messages: Vec<Message> = candidates
            .iter()
            .map(|(i, _)| entries[*i].received.message(&entries[*i].delivery))
            .collect();
        ctx.deps
            .metrics
            .batch_size(&ctx.settings.queue, messages.len());
        let started = Instant::now();
        let mut handler_span = ctx
            .deps
            .telemetry
            .handler_span(plugin.name(), plugin.version());
        let result = plugin.handle_batch(&messages, ctx.deps.kv.clone()).await;
        ctx.deps
            .metrics
            .handler_duration(&ctx.settings.queue, started.elapsed());
        let invocations = match result {
            Ok(invocations) => invocations,
            Err(failure) => {
                handler_span.fail(failure.kind().label());
                drop(handler_span);
                tracing::warn!(queue = %ctx.settings.queue, batch = candidates.len(), reason = %failure, "the batch handler failed; every message of the batch fails with it");
                for (i, _) in &candidates {
                    ctx.deps
                        .metrics
                        .plugin_failure(&ctx.settings.queue, failure.kind());
                    let entry = &entries[*i];
                    let plan = plan::after_handler(
                        entry.received.attempt,
                        &ctx.settings.retry,
                        ctx.settings.on_plugin_failure,
                        &Err(failure.clone()),
                    );
                    self.settle(*i, spans, Some(plan), None).await;
                    fates[*i] = Fate::Settled;
                }
                return;
            }
        };
        drop(handler_span);

        // 3. Each verdict decides its message; the acked ones are committed together.
        let mut to_commit: Vec<(usize, Invocation, String)> = Vec::new();
        for ((i, inbox_key), invocation) in candidates.into_iter().zip(invocations) {
            let entry = &entries[i];
            let facts = Ok((invocation.verdict.clone(), invocation.store_error.clone()));
            let plan = plan::after_handler(
                entry.received.attempt,
                &ctx.settings.retry,
                ctx.settings.on_plugin_failure,
                &facts,
            );
            match plan {
                Plan::Commit => to_commit.push((i, invocation, inbox_key)),
                Plan::StoreTrouble(why) => {
                    let trouble = StoreTrouble::Handler(why);
                    ctx.deps.gate.report_failure(&trouble.to_string());
                    fates[i] = Fate::Alone;
                }
                plan => {
                    self.settle(i, spans, Some(plan), None).await;
                    fates[i] = Fate::Settled;
                }
            }
        }
        if to_commit.is_empty() {
            return;
        }
        let mut order = Vec::with_capacity(to_commit.len());
        let mut requests = Vec::with_capacity(to_commit.len());
        for (i, invocation, inbox_key) in to_commit {
            let entry = &entries[i];
            let apply = self.apply(i);
            let message = entry.received.message(&entry.delivery);
            let trace = match &spans[i] {
                Some(otel) => telemetry::within(otel, async { apply.trace(&message) }).await,
                None => apply.trace(&message),
            };
            requests.push(apply.commit_request(&inbox_key, trace, invocation));
            order.push(i);
        }
        hang_if(ctx.deps.fault, FaultPoint::HangBeforeCommit).await;
        let committed = ctx.deps.committer.commit_all(requests).await;
        hang_if(ctx.deps.fault, FaultPoint::HangAfterCommit).await;
        let outcomes = match committed {
            Ok(outcomes) => outcomes,
            Err(e) => {
                ctx.deps.gate.report_failure(&format!("commit failed: {e}"));
                for i in order {
                    fates[i] = Fate::Alone;
                }
                return;
            }
        };
        for (i, outcome) in order.into_iter().zip(outcomes) {
            match outcome {
                CommitOutcome::Committed => {
                    self.settle(i, spans, None, Some(Settle::Ack(Outcome::Acked)))
                        .await;
                }
                CommitOutcome::Duplicate => {
                    self.settle(i, spans, None, Some(Settle::Ack(Outcome::Duplicate)))
                        .await;
                }
                CommitOutcome::Conflict => {
                    ctx.deps.metrics.conflict(&ctx.settings.queue);
                    fates[i] = Fate::Alone;
                    continue;
                }
                CommitOutcome::Rejected(why) => {
                    let plan = plan::dead_letter(
                        format!("the store refused the handler's effects: {why}"),
                        FailureKind::Rejected,
                    );
                    self.settle(i, spans, Some(plan), None).await;
                }
            }
            fates[i] = Fate::Settled;
        }
    }
}
