//! A delivery's retry and dead-letter copies: published sealed with its journey and
//! confirmed, or, when AMQP cannot carry one, archived straight into the store.

use std::time::Duration;

use super::{Apply, LOG};
use crate::broker::field_table::header_text;
use crate::broker::outgoing::{CopyStory, HandOn, cap_reason, handed_on_properties};
use crate::broker::{Outgoing, PublishError};
use crate::common::header_names as h;
use crate::common::journey::{self, Attempt, Journey};
use crate::common::now_ms;
use crate::pipeline::archiver;
use crate::pipeline::plan::{FailureKind, Outcome, ReasonClass};
use crate::store::StoreError;

/// Why a retry or dead-letter copy was not handed on; the delivery is then requeued.
#[derive(Debug, thiserror::Error)]
pub(super) enum HandOnError {
    /// The copy's publish failed or its confirm did not come.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The copy could not be published at all, and archiving it directly failed too.
    #[error("archiving directly failed: {0}")]
    Archive(#[from] StoreError),
}

impl Apply<'_> {
    /// Publishes a copy to the retry tier for `delay`, with the attempt counter incremented.
    pub(super) async fn to_retry(
        &self,
        delay: Duration,
        reason: &str,
        journey: &str,
    ) -> Result<Outcome, HandOnError> {
        let attempt = i64::from(self.received.attempt) + 1;
        let story = self.story(reason, journey, HandOn::Retry { attempt });
        let queue = self.ctx.settings.retry_queue(delay);
        match self.publish_copy(String::new(), queue, &story).await {
            Ok(()) => Ok(Outcome::Retried),
            Err(PublishError::Invalid(why)) => {
                let reason = format!(
                    "a retry copy cannot be published ({why}); archived instead of retried; the \
                     handler's reason: {reason}"
                );
                self.archive_directly(&reason, FailureKind::Unpublishable, journey)
                    .await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Publishes to the route's dead-letter exchange with the reason and the plugin's
    /// identity.
    pub(super) async fn to_dead_letter(
        &self,
        reason: &str,
        kind: FailureKind,
        journey: &str,
    ) -> Result<Outcome, HandOnError> {
        let settings = &self.ctx.settings;
        let story = self.story(
            reason,
            journey,
            HandOn::DeadLetter {
                kind,
                plugin: self.plugin.name(),
                plugin_sha256: self.plugin.digest(),
                attempts: i64::from(self.received.attempt),
                route: &settings.queue,
            },
        );
        match self
            .publish_copy(settings.dlx(), settings.queue.clone(), &story)
            .await
        {
            Ok(()) => Ok(Outcome::DeadLettered),
            Err(PublishError::Invalid(why)) => {
                let reason = format!(
                    "{reason} (archived directly: the dead-letter copy cannot be published: {why})"
                );
                self.archive_directly(&reason, kind, journey).await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// What a copy of this delivery says about its failure, as of now.
    fn story<'s>(&'s self, reason: &'s str, journey: &'s str, to: HandOn<'s>) -> CopyStory<'s> {
        CopyStory {
            original_exchange: &self.received.exchange,
            original_routing_key: &self.received.routing_key,
            first_failure_at: self.received.first_failure_at,
            reason,
            now_ms: now_ms(),
            journey: Some(journey),
            to,
        }
    }

    /// The journey this delivery's copy carries (`x-carteiro-journey`): the attempts its own
    /// copy brought (believed only when sealed for the route), then this one, which ended in
    /// `kind` for `reason` and goes to retry tier `tier` (none: it is dead-lettered).
    pub(super) fn journey(&self, kind: FailureKind, reason: &str, tier: Option<String>) -> String {
        let before = header_text(Some(&self.received.table), h::JOURNEY);
        let trace = self
            .ctx
            .deps
            .telemetry
            .traceparent()
            .and_then(|t| journey::trace_id(&t));
        Journey::parse(before.as_deref())
            .with(Attempt {
                n: self.received.attempt,
                at: now_ms(),
                plugin: self.plugin.name().to_owned(),
                sha256: self.plugin.digest().to_owned(),
                outcome: kind.label().to_owned(),
                reason: reason.to_owned(),
                tier,
                trace,
            })
            .value()
    }

    /// Publishes a sealed copy of the delivery telling `story`, and waits for its confirm.
    async fn publish_copy(
        &self,
        exchange: String,
        routing_key: String,
        story: &CopyStory<'_>,
    ) -> Result<(), PublishError> {
        let (ctx, delivery) = (self.ctx, self.delivery);
        let kind = match story.to {
            HandOn::Retry { .. } => "retry",
            HandOn::DeadLetter { .. } => "dead-letter",
        };
        let mut span = ctx
            .deps
            .telemetry
            .republish_span(kind, &exchange, &routing_key);
        let properties = ctx.deps.seal.seal(
            &ctx.settings.queue,
            handed_on_properties(&delivery.properties, &self.received.table, story),
            &delivery.data,
        );
        let published = self
            .publisher
            .publish(
                Outgoing {
                    exchange,
                    routing_key,
                    properties,
                    body: delivery.data.clone(),
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

    /// Writes the dead letter into the archive without the broker's help, with its journey.
    async fn archive_directly(
        &self,
        reason: &str,
        kind: FailureKind,
        journey: &str,
    ) -> Result<Outcome, HandOnError> {
        let ctx = self.ctx;
        tracing::warn!(target: LOG, %reason, %kind, "archiving the dead letter directly into the store");
        let mut record = archiver::record(
            ctx,
            ctx.settings.queue.clone(),
            cap_reason(reason),
            Some(self.plugin.name().to_owned()),
            i64::from(self.received.attempt),
            &self.received.table,
            &self.delivery.properties,
            self.delivery.data.clone(),
            self.received.first_failure_at,
            now_ms(),
        );
        record.headers.retain(|(name, _)| name != h::JOURNEY);
        record
            .headers
            .push((h::JOURNEY.to_owned(), journey.to_owned()));
        match ctx.deps.store.dead_letter_insert(&record).await {
            Ok(id) => {
                ctx.deps.metrics.dead_letter_archived(&ctx.settings.queue);
                tracing::info!(target: LOG, id, route = %ctx.settings.queue, "dead letter archived directly");
                Ok(Outcome::Archived)
            }
            // The store keeps any text: only store trouble is left.
            Err(e) => {
                ctx.deps.gate.report_failure(&e.to_string());
                Err(HandOnError::Archive(e))
            }
        }
    }

    /// Counts a confirmed retry or dead-letter copy (or a dead letter archived directly) by
    /// its reason class.
    pub(super) fn count_handed_on(&self, outcome: Outcome, class: ReasonClass) {
        let (queue, metrics) = (&self.ctx.settings.queue, &self.ctx.deps.metrics);
        match outcome {
            Outcome::Retried => metrics.retry(queue, class),
            Outcome::DeadLettered | Outcome::Archived => metrics.dead_letter(queue, class),
            _ => {}
        }
    }
}
