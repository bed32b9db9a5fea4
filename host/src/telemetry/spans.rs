//! The spans Carteiro exports (docs/telemetry.md lists them with every attribute).
//!
//! - `<queue> process` (CONSUMER): one per delivery, child of the message's `traceparent`.
//!   Its context is made current (thread-locally, while the delivery's future is polled:
//!   [`within`]), so the pipeline's hooks find it without it being passed around.
//! - `carteiro.handler`, `carteiro.commit`, `<exchange> publish` (retry tier or dead-letter
//!   copy): children of the delivery span in progress.
//! - `<exchange> publish` (PRODUCER) by the relay, one per outbox row, in a trace of its
//!   own with a link to the delivery span whose `traceparent` the row carries.
//!
//! Every constructor returns at once when telemetry is off, with an empty wrapper whose
//! methods do nothing; nothing is allocated.

use super::{Exporting, Telemetry, extract, traceparent_of};
use crate::broker::PublishError;
use crate::common::labels::{FailureKind, Outcome};
use crate::store::OutboxRow;
use futures::future::Either;
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{
    Link, Span as _, SpanBuilder, SpanKind, Status, TraceContextExt, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::Span;
use std::future::Future;
use std::sync::{Mutex, PoisonError};

// Messaging semantic conventions.
const SYSTEM: &str = "messaging.system";
const DESTINATION: &str = "messaging.destination.name";
const SUBSCRIPTION: &str = "messaging.destination.subscription.name";
const OPERATION_TYPE: &str = "messaging.operation.type";
const OPERATION_NAME: &str = "messaging.operation.name";
const MESSAGE_ID: &str = "messaging.message.id";
const ROUTING_KEY: &str = "messaging.rabbitmq.destination.routing_key";
const ERROR_TYPE: &str = "error.type";
// Carteiro's own.
const ROUTE: &str = "carteiro.route";
const OUTCOME: &str = "carteiro.outcome";
const ATTEMPT: &str = "carteiro.attempt";
const PLUGIN: &str = "carteiro.plugin";
const PLUGIN_VERSION: &str = "carteiro.plugin.version";
const REDELIVERED: &str = "carteiro.redelivered";
const REPUBLISH: &str = "carteiro.republish";
const OUTBOX_ID: &str = "carteiro.outbox.id";
const EVENT_ATTEMPT: &str = "carteiro.outbox.attempt";

/// What the delivery span says about a delivery (all borrowed: free to build when off).
pub struct DeliveryFacts<'a> {
    /// The route's work queue.
    pub queue: &'a str,
    /// The exchange the message was first published to (`""`: the default exchange).
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub message_id: Option<&'a str>,
    pub attempt: u32,
    pub redelivered: bool,
    pub plugin: &'a str,
    pub plugin_version: &'a str,
    /// The delivery's headers, where its `traceparent` is.
    pub headers: &'a [(String, String)],
}

/// What the pipeline learns while a delivery runs, written on its span once, at the end
/// (a span keeps every attribute set, so it is not set as it goes).
#[derive(Default)]
struct Findings {
    error_type: Mutex<Option<String>>,
}

/// The span of one delivery, built once from its [`DeliveryFacts`] for both span systems:
/// the `tracing` span its log lines carry, and the exported OpenTelemetry span with its
/// context (`None` when telemetry is off).
pub struct DeliverySpan {
    log: tracing::Span,
    otel: Option<Context>,
}

/// A child span of the delivery in progress, ended when dropped (empty when off).
pub struct ChildSpan(Option<Span>);

impl Telemetry {
    /// Starts the span of a delivery: its log span, and when exporting, its OpenTelemetry
    /// span parented on its `traceparent` header if it has one.
    pub fn delivery(&self, facts: &DeliveryFacts<'_>) -> DeliverySpan {
        let log = tracing::info_span!(
            "delivery",
            messaging.system = "rabbitmq",
            messaging.destination.name = %facts.queue,
            messaging.rabbitmq.destination.routing_key = %facts.routing_key,
            messaging.message.id = facts.message_id.unwrap_or(""),
            plugin = facts.plugin,
            plugin.version = facts.plugin_version,
        );
        let Some(on) = self.on() else {
            return DeliverySpan { log, otel: None };
        };
        let parent = extract(on, facts.headers);
        let mut attributes = vec![
            KeyValue::new(SYSTEM, "rabbitmq"),
            KeyValue::new(DESTINATION, facts.exchange.to_owned()),
            KeyValue::new(SUBSCRIPTION, facts.queue.to_owned()),
            KeyValue::new(OPERATION_TYPE, "process"),
            KeyValue::new(OPERATION_NAME, "process"),
            KeyValue::new(ROUTE, facts.queue.to_owned()),
            KeyValue::new(ATTEMPT, i64::from(facts.attempt)),
            KeyValue::new(REDELIVERED, facts.redelivered),
            KeyValue::new(PLUGIN, facts.plugin.to_owned()),
            KeyValue::new(PLUGIN_VERSION, facts.plugin_version.to_owned()),
        ];
        if !facts.routing_key.is_empty() {
            attributes.push(KeyValue::new(ROUTING_KEY, facts.routing_key.to_owned()));
        }
        if let Some(id) = facts.message_id {
            attributes.push(KeyValue::new(MESSAGE_ID, id.to_owned()));
        }
        let span = on.tracer.build_with_context(
            SpanBuilder::from_name(format!("{} process", facts.queue))
                .with_kind(SpanKind::Consumer)
                .with_attributes(attributes),
            &parent,
        );
        DeliverySpan {
            log,
            otel: Some(parent.with_span(span).with_value(Findings::default())),
        }
    }

    /// Records the failure class (`error.type`) of the delivery in progress: `retry`, a
    /// dead-letter kind (`dead-letter`, `missing-key`, a plugin failure kind, ...). The
    /// last one recorded is the one exported.
    pub fn delivery_failed(&self, kind: FailureKind) {
        if self.on().is_none() {
            return;
        }
        if let Some(findings) = Context::current().get::<Findings>() {
            *findings
                .error_type
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(kind.label().to_owned());
        }
    }

    /// The `traceparent` of the delivery span in progress: what its outbox rows carry, so
    /// the relay's publish span links to it. `None` when off or outside a delivery.
    pub fn traceparent(&self) -> Option<String> {
        let on = self.on()?;
        let cx = Context::current();
        cx.has_active_span()
            .then(|| traceparent_of(on, &cx))
            .flatten()
    }

    /// The handler call of the delivery in progress.
    pub fn handler_span(&self, plugin: &str, version: &str) -> ChildSpan {
        self.child(|| {
            SpanBuilder::from_name("carteiro.handler")
                .with_kind(SpanKind::Internal)
                .with_attributes([
                    KeyValue::new(PLUGIN, plugin.to_owned()),
                    KeyValue::new(PLUGIN_VERSION, version.to_owned()),
                ])
        })
    }

    /// The commit (inbox record, kv writes, outbox rows) of the delivery in progress.
    pub fn commit_span(&self) -> ChildSpan {
        self.child(|| SpanBuilder::from_name("carteiro.commit").with_kind(SpanKind::Internal))
    }

    /// A copy of the delivery in progress published to a retry tier (`kind = "retry"`) or
    /// to the dead-letter exchange (`"dead-letter"`).
    pub fn republish_span(
        &self,
        kind: &'static str,
        exchange: &str,
        routing_key: &str,
    ) -> ChildSpan {
        self.child(|| {
            let mut attributes = publishing(exchange, routing_key);
            attributes.push(KeyValue::new(REPUBLISH, kind));
            SpanBuilder::from_name(format!("{} publish", exchange_name(exchange)))
                .with_kind(SpanKind::Producer)
                .with_attributes(attributes)
        })
    }

    fn child(&self, builder: impl FnOnce() -> SpanBuilder) -> ChildSpan {
        let Some(on) = self.on() else {
            return ChildSpan(None);
        };
        let cx = Context::current();
        if !cx.has_active_span() {
            return ChildSpan(None);
        }
        ChildSpan(Some(on.tracer.build_with_context(builder(), &cx)))
    }

    /// Publishes a run of one key's outbox rows (`publish`, one result per row in order,
    /// possibly fewer) with a relay span per row: PRODUCER, linked to the delivery span
    /// named by the row's `traceparent`. A row the run stopped before is `not_sent`. When
    /// off, just `publish`.
    pub async fn publish_run<'r, F>(
        &self,
        rows: impl Iterator<Item = &'r OutboxRow>,
        publish: F,
    ) -> Vec<Result<(), PublishError>>
    where
        F: Future<Output = Vec<Result<(), PublishError>>>,
    {
        let Some(on) = self.on() else {
            return publish.await;
        };
        let mut spans: Vec<Span> = rows.map(|row| relay_span(on, row)).collect();
        let results = publish.await;
        for (i, span) in spans.iter_mut().enumerate() {
            match results.get(i) {
                Some(Ok(())) => {}
                Some(Err(e)) => fail(span, publish_error_type(e)),
                None => fail(span, "not_sent"),
            }
            span.end();
        }
        results
    }
}

fn relay_span(on: &Exporting, row: &OutboxRow) -> Span {
    let event = &row.event;
    let emitted_by = extract(on, &event.headers);
    let emitted_by = emitted_by.span().span_context().clone();
    let links = if emitted_by.is_valid() {
        vec![Link::with_context(emitted_by)]
    } else {
        Vec::new()
    };
    let mut attributes = publishing(&event.exchange, &event.routing_key);
    attributes.extend([
        KeyValue::new(MESSAGE_ID, event.event_id.to_string()),
        KeyValue::new(ROUTE, event.route.clone()),
        KeyValue::new(PLUGIN, event.plugin.clone()),
        KeyValue::new(OUTBOX_ID, row.id),
        KeyValue::new(EVENT_ATTEMPT, row.attempts + 1),
    ]);
    // A trace of its own (the delivery ended long ago, maybe in another process): the link
    // says which delivery emitted the row.
    on.tracer.build_with_context(
        SpanBuilder::from_name(format!("{} publish", exchange_name(&event.exchange)))
            .with_kind(SpanKind::Producer)
            .with_attributes(attributes)
            .with_links(links),
        &Context::new(),
    )
}

/// The messaging attributes of a span that publishes to `exchange` with `routing_key` (a
/// retry or dead-letter copy, an outbox row).
fn publishing(exchange: &str, routing_key: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new(SYSTEM, "rabbitmq"),
        KeyValue::new(DESTINATION, exchange.to_owned()),
        KeyValue::new(ROUTING_KEY, routing_key.to_owned()),
        KeyValue::new(OPERATION_TYPE, "send"),
        KeyValue::new(OPERATION_NAME, "publish"),
    ]
}

/// How span names call the default exchange (its name is empty).
fn exchange_name(exchange: &str) -> &str {
    if exchange.is_empty() {
        "amq.default"
    } else {
        exchange
    }
}

fn publish_error_type(e: &PublishError) -> &'static str {
    match e {
        PublishError::Returned { .. } => "returned",
        PublishError::Nacked => "nacked",
        PublishError::Timeout => "timeout",
        PublishError::ChannelClosed(_) => "channel_closed",
        PublishError::Invalid(_) => "invalid",
    }
}

fn fail(span: &mut Span, error_type: &str) {
    span.set_attribute(KeyValue::new(ERROR_TYPE, error_type.to_owned()));
    span.set_status(Status::error(error_type.to_owned()));
}

/// Runs `delivery` with `span`'s context current while it is polled, so the hooks inside
/// find it. When off, `delivery` itself.
pub fn within<F: Future>(span: &DeliverySpan, delivery: F) -> impl Future<Output = F::Output> {
    match &span.otel {
        Some(cx) => Either::Left(delivery.with_context(cx.clone())),
        None => Either::Right(delivery),
    }
}

impl DeliverySpan {
    /// The `tracing` span of the delivery, which its log lines are recorded in.
    pub fn log(&self) -> &tracing::Span {
        &self.log
    }

    /// Ends the delivery span with how the delivery was settled (`carteiro.outcome`) and its
    /// failure class: `error_type`, or else the last one the pipeline recorded.
    pub fn end(self, outcome: Outcome, error_type: Option<&str>) {
        let Some(cx) = self.otel else { return };
        let span = cx.span();
        span.set_attribute(KeyValue::new(OUTCOME, outcome.label()));
        let recorded = cx.get::<Findings>().and_then(|f| {
            f.error_type
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        });
        if let Some(error_type) = error_type.map(str::to_owned).or(recorded) {
            span.set_attribute(KeyValue::new(ERROR_TYPE, error_type.clone()));
            span.set_status(Status::error(error_type));
        }
        span.end();
    }
}

impl ChildSpan {
    /// Marks the step failed with a class (`error.type`).
    pub fn fail(&mut self, error_type: &str) {
        if let Some(span) = &mut self.0 {
            fail(span, error_type);
        }
    }

    /// Adds one attribute.
    pub fn set(&mut self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new(key, value));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn facts<'a>(headers: &'a [(String, String)]) -> DeliveryFacts<'a> {
        DeliveryFacts {
            queue: "q",
            exchange: "x",
            routing_key: "k",
            message_id: Some("m-1"),
            attempt: 1,
            redelivered: false,
            plugin: "p",
            plugin_version: "p@1",
            headers,
        }
    }

    #[tokio::test]
    async fn telemetry_off_builds_no_span_and_no_context() {
        let off = Telemetry::off();
        let headers = vec![(
            "traceparent".to_owned(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
        )];
        let delivery = off.delivery(&facts(&headers));
        assert!(
            delivery.otel.is_none(),
            "no OpenTelemetry delivery span when off"
        );
        let inside = within(&delivery, async {
            // Nothing made current: the hooks find no span and build none.
            assert!(!Context::current().has_active_span());
            off.delivery_failed(FailureKind::Retry);
            (
                off.handler_span("p", "p@1").0.is_none(),
                off.commit_span().0.is_none(),
                off.republish_span("retry", "", "q.retry.1s").0.is_none(),
                off.traceparent(),
            )
        })
        .await;
        assert_eq!(inside, (true, true, true, None));
        delivery.end(Outcome::Acked, None);
    }

    #[tokio::test]
    async fn children_need_a_delivery_in_progress() {
        // On, but with nothing current (e.g. a hook reached outside a delivery): no orphan
        // root spans, and no traceparent to store.
        let on = Telemetry::start(&crate::telemetry::TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        })
        .expect("start");
        assert!(on.is_on());
        assert!(on.commit_span().0.is_none());
        assert_eq!(on.traceparent(), None);
        let headers = vec![(
            "traceparent".to_owned(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
        )];
        let delivery = on.delivery(&facts(&headers));
        let (traceparent, child) = within(&delivery, async {
            (on.traceparent(), on.commit_span().0.is_some())
        })
        .await;
        let traceparent = traceparent.expect("a delivery in progress has one");
        assert!(
            traceparent.starts_with("00-0af7651916cd43dd8448eb211c80319c-"),
            "same trace as the incoming message: {traceparent}"
        );
        assert!(
            !traceparent.contains("b7ad6b7169203331"),
            "the delivery span's own id, not the publisher's: {traceparent}"
        );
        assert!(child);
        delivery.end(Outcome::Acked, None);
    }
}
