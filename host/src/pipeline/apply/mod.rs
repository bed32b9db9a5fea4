//! Carrying a delivery's [`Plan`] out: the one place that acts on a delivery. It alone
//! publishes its copies (to a retry tier or the dead-letter exchange: sealed, and confirmed
//! before the original is acked, G1), commits the handler's effects, settles it with the
//! broker and records how it ended (metrics, span). A copy AMQP cannot carry (its headers
//! would not fit the broker's frame) is archived straight into the store instead, with a
//! reason saying so: never a loop of failing publishes.
//!
//! Each copy also carries the message's journey (`common::journey`): the attempts its own
//! copy brought, then this one (plugin version, verdict or failure, reason, the retry tier it
//! goes to, the trace id). It costs no store write: the archive keeps it with the dead letter.

mod copies;

use super::acks::Acks;
use super::context::RouteContext;
use super::plan::{FailureKind, Outcome, Plan, ReasonClass};
use super::received::Received;
use crate::broker::ConfirmedPublisher;
use crate::broker::outgoing::cap_reason;
use crate::common::{FaultPoint, hang_if};
use crate::runtime::{Invocation, Message, Plugin};
use crate::store::{CommitOutcome, CommitRequest, KvRead, KvWrite, NewOutboxRow, StoreError};
use crate::telemetry::DeliverySpan;
use futures::FutureExt;
use lapin::message::Delivery;
use lapin::options::{BasicNackOptions, BasicRejectOptions};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

/// The target of a delivery's log lines, whichever file writes them: docs/live-changes.md documents
/// `CARTEIRO_LOG=...,carteiro::pipeline::process=debug` for the `delivery settled` lines.
const LOG: &str = "carteiro::pipeline::process";
/// Wait before requeueing a delivery we could not settle (broker trouble).
const REQUEUE_DELAY: Duration = Duration::from_millis(500);

/// How a delivery is settled with the broker.
pub enum Settle {
    /// Effects committed, handed to a retry tier or the DLX, archived, or a duplicate: ack.
    Ack(Outcome),
    /// Nothing durable happened: give it back to the broker.
    Requeue(String),
    /// Give it to the route's dead-letter exchange through the broker (reject, no requeue).
    Reject(String),
}

/// One delivery and what acting on it takes.
pub struct Apply<'a> {
    pub ctx: &'a RouteContext,
    /// The plugin version this delivery runs on (its dead-letter copies name it).
    pub plugin: &'a Plugin,
    /// The route session's publisher, for the copies.
    pub publisher: &'a ConfirmedPublisher,
    pub delivery: &'a Delivery,
    pub received: &'a Received,
}

impl Apply<'_> {
    /// Carries out a retry or dead-letter plan: a confirmed copy, then ack.
    pub async fn hand_on(&self, plan: Plan) -> Settle {
        let telemetry = &self.ctx.deps.telemetry;
        match plan {
            Plan::Retry {
                delay,
                reason,
                class,
            } => {
                telemetry.delivery_failed(FailureKind::Retry);
                tracing::info!(target: LOG, attempt = self.received.attempt, ?delay, %reason, "scheduling retry");
                let kind = match class {
                    ReasonClass::Kind(kind) => kind,
                    ReasonClass::Handler | ReasonClass::RetriesExhausted => FailureKind::Retry,
                };
                let tier = self.ctx.settings.retry_queue(delay);
                let journey = self.journey(kind, &reason, Some(tier));
                match self.to_retry(delay, &reason, &journey).await {
                    Ok(outcome) => {
                        // A retry copy too big to publish was archived as a dead letter instead.
                        let class = if outcome == Outcome::Retried {
                            class
                        } else {
                            FailureKind::Unpublishable.class()
                        };
                        self.count_handed_on(outcome, class);
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
                telemetry.delivery_failed(kind);
                tracing::warn!(target: LOG, %reason, %kind, "dead-lettering");
                let journey = self.journey(kind, &reason, None);
                match self.to_dead_letter(&reason, kind, &journey).await {
                    Ok(outcome) => {
                        self.count_handed_on(outcome, class);
                        Settle::Ack(outcome)
                    }
                    Err(e) => Settle::Requeue(format!("dead-letter failed: {e}")),
                }
            }
            // `process` handles these itself; never reached.
            Plan::Commit | Plan::StoreTrouble(_) => {
                Settle::Requeue("internal: nothing to carry out".to_owned())
            }
        }
    }

    /// A delivery that panicked twice goes to the dead-letter exchange: as a Carteiro copy
    /// with the panic as its reason, or, if even that fails or panics, rejected for the
    /// broker to dead-letter.
    pub async fn after_second_panic(&self, what: &str) -> Settle {
        let ctx = self.ctx;
        let reason = cap_reason(&format!(
            "the gateway panicked twice processing this message: {what}"
        ));
        ctx.deps.telemetry.delivery_failed(FailureKind::Panic);
        let journey = self.journey(FailureKind::Panic, &reason, None);
        let copied = AssertUnwindSafe(self.to_dead_letter(&reason, FailureKind::Panic, &journey))
            .catch_unwind()
            .await;
        match copied {
            Ok(Ok(outcome)) => {
                self.count_handed_on(outcome, FailureKind::Panic.class());
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

    /// Commits the handler's effects (kv writes, outbox rows) with the inbox record, in the
    /// delivery's commit span. `Err` is a store failure.
    pub async fn commit(
        &self,
        inbox_key: &str,
        message: &Message,
        invocation: Invocation,
    ) -> Result<CommitOutcome, StoreError> {
        let telemetry = &self.ctx.deps.telemetry;
        let trace = self.trace(message);
        let mut commit_span = telemetry.commit_span();
        let committed = self.commit_effects(inbox_key, trace, invocation).await;
        match &committed {
            Ok(outcome) => commit_span.set("carteiro.commit.outcome", commit_label(outcome)),
            Err(_) => commit_span.fail("store"),
        }
        drop(commit_span);
        committed
    }

    /// The trace context the delivery's events carry: the delivery span's own when telemetry
    /// is on (the relay's publish span links to it; call inside the delivery's span), else
    /// the incoming one, carried on.
    pub fn trace(&self, message: &Message) -> Option<(String, String)> {
        self.ctx
            .deps
            .telemetry
            .traceparent()
            .map(|t| ("traceparent".to_owned(), t))
            .or_else(|| trace_context(message))
    }

    /// Settles the delivery with the broker (an ack, sent in a run by `acks`; a requeue; a
    /// reject) and records how it ended: its span, `carteiro_deliveries_total` and the
    /// version's count.
    pub async fn finish(&self, settle: Settle, otel: DeliverySpan, acks: &Acks, started: Instant) {
        let span = otel.log().clone();
        let _entered = span.enter();
        let tag = self.delivery.delivery_tag;
        match &settle {
            Settle::Ack(outcome) => otel.end(*outcome, None),
            Settle::Requeue(_) => otel.end(Outcome::Requeued, Some("requeued")),
            Settle::Reject(_) => otel.end(Outcome::DeadLettered, Some("rejected")),
        }
        let (queue, metrics) = (&self.ctx.settings.queue, &self.ctx.deps.metrics);
        let version = self.plugin.version();
        match settle {
            Settle::Ack(outcome) => {
                metrics.delivery(queue, outcome, started.elapsed());
                metrics.version_delivery(queue, version, outcome);
                tracing::debug!(
                    target: LOG,
                    outcome = outcome.label(),
                    sha256 = self.plugin.digest(),
                    "delivery settled"
                );
                acks.ack(tag);
            }
            Settle::Requeue(why) => {
                metrics.delivery(queue, Outcome::Requeued, started.elapsed());
                metrics.version_delivery(queue, version, Outcome::Requeued);
                tracing::warn!(target: LOG, reason = %why, "requeueing delivery; nothing was committed");
                tokio::time::sleep(REQUEUE_DELAY).await;
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                };
                if let Err(e) = self.delivery.acker.nack(requeue).await {
                    tracing::warn!(target: LOG, error = %e, "nack failed; the broker requeues it when the channel closes");
                }
                acks.settled_elsewhere(tag);
            }
            Settle::Reject(why) => {
                metrics.delivery(queue, Outcome::DeadLettered, started.elapsed());
                metrics.version_delivery(queue, version, Outcome::DeadLettered);
                tracing::warn!(target: LOG, reason = %why, "rejecting delivery to the dead-letter exchange");
                if let Err(e) = self
                    .delivery
                    .acker
                    .reject(BasicRejectOptions { requeue: false })
                    .await
                {
                    tracing::warn!(target: LOG, error = %e, "reject failed; the broker requeues it when the channel closes");
                }
                acks.settled_elsewhere(tag);
            }
        }
    }

    /// Commits inbox + kv + outbox through the group committer. `Err` is a store failure.
    async fn commit_effects(
        &self,
        inbox_key: &str,
        trace: Option<(String, String)>,
        invocation: Invocation,
    ) -> Result<CommitOutcome, StoreError> {
        let ctx = self.ctx;
        let request = self.commit_request(inbox_key, trace, invocation);
        hang_if(ctx.deps.fault, FaultPoint::HangBeforeCommit).await;
        let outcome = ctx.deps.committer.commit(request).await?;
        hang_if(ctx.deps.fault, FaultPoint::HangAfterCommit).await;
        Ok(outcome)
    }

    /// What committing the handler's effects writes: inbox record, kv reads checked, kv
    /// writes and outbox rows (carrying `trace`).
    pub fn commit_request(
        &self,
        inbox_key: &str,
        trace: Option<(String, String)>,
        invocation: Invocation,
    ) -> CommitRequest {
        let ctx = self.ctx;
        let effects = invocation.effects;
        let plugin = self.plugin.name().to_owned();
        CommitRequest {
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
                    event_id: e.event_id.to_string(),
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
        }
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
