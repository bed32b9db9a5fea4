//! OpenTelemetry export (`[telemetry]`, docs/telemetry.md): one CONSUMER span per delivery
//! with children for the handler, the commit and any republish, and one PRODUCER span per
//! outbox row the relay publishes, linked to the delivery that emitted it. Spans go out in
//! batches over OTLP/HTTP (protobuf) from a task on the tokio runtime.
//!
//! Off by default. A [`Telemetry`] that is off is `None` inside: every hook returns at its
//! first line, before a span, an attribute or a context is built.
//!
//! # Layout
//! - this file: [`Telemetry`] (the exporter's handle: start, flush and shut down), the W3C
//!   trace-context propagation to and from AMQP headers.
//! - `spans`: the spans themselves — names, kinds, messaging attributes, links.
//! - `config`: [`TelemetryConfig`] (`[telemetry]`) and its checks.

mod config;
mod spans;

pub use config::TelemetryConfig;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracer, SdkTracerProvider};
pub use spans::{ChildSpan, DeliveryFacts, DeliverySpan, within};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The instrumentation scope every span is reported under.
const SCOPE: &str = "carteiro";

/// Where spans go, or nothing. Cheap to clone; clones share one exporter.
#[derive(Clone, Default)]
pub struct Telemetry(Option<Arc<Exporting>>);

struct Exporting {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    export_timeout: Duration,
    /// [`Telemetry::shutdown`] ran.
    shut_down: AtomicBool,
}

impl Drop for Exporting {
    /// Dropped without [`Telemetry::shutdown`] (a start-up error after the exporter
    /// started): the SDK would shut down in the last drop, blocking that thread until its
    /// exporter task answers — never, on a single-threaded runtime. Do it on a thread of
    /// its own instead; that thread's clone makes it the last one.
    fn drop(&mut self) {
        if self.shut_down.load(Ordering::Relaxed) {
            return;
        }
        let provider = self.provider.clone();
        let spawned = std::thread::Builder::new()
            .name("carteiro-otel-shutdown".into())
            .spawn(move || {
                let _ = provider.shutdown();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot flush OpenTelemetry spans");
        }
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_on() {
            "Telemetry(on)"
        } else {
            "Telemetry(off)"
        })
    }
}

/// The exporter could not be built from the config.
#[derive(Debug, thiserror::Error)]
#[error("cannot start OpenTelemetry export to {endpoint}: {reason}")]
pub struct TelemetryError {
    endpoint: String,
    reason: String,
}

impl Telemetry {
    /// Telemetry off: no exporter, and no span is ever built.
    pub fn off() -> Self {
        Self(None)
    }

    /// Starts exporting as `config` says, or returns [`Telemetry::off`] when it sets no
    /// endpoint. Must run inside the tokio runtime (the batch exporter is a task on it).
    pub fn start(config: &TelemetryConfig) -> Result<Self, TelemetryError> {
        let Some(base) = config.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) else {
            return Ok(Self::off());
        };
        let endpoint = traces_url(base);
        let fail = |reason: String| TelemetryError {
            endpoint: crate::redact::redact_url(&endpoint),
            reason,
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint.clone())
            .with_timeout(config.export_timeout)
            .build()
            .map_err(|e| fail(e.to_string()))?;
        let batch = BatchConfigBuilder::default()
            .with_scheduled_delay(config.export_interval)
            .with_max_export_timeout(config.export_timeout)
            .build();
        let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio)
            .with_batch_config(batch)
            .build();
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer(SCOPE);
        tracing::info!(endpoint = %crate::redact::redact_url(&endpoint), service = %config.service_name, "exporting OpenTelemetry spans");
        Ok(Self(Some(Arc::new(Exporting {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
            export_timeout: config.export_timeout,
            shut_down: AtomicBool::new(false),
        }))))
    }

    /// Whether spans are exported.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Sends every finished span and stops the exporter (for every clone). Bounded by the
    /// export timeout; a collector that does not answer loses the last batch, with a warning.
    pub async fn shutdown(&self) {
        let Some(on) = &self.0 else { return };
        if on.shut_down.swap(true, Ordering::Relaxed) {
            return;
        }
        let provider = on.provider.clone();
        // The SDK blocks the calling thread until its exporter task answers: not a worker's.
        let flushed = tokio::time::timeout(
            on.export_timeout + Duration::from_secs(1),
            tokio::task::spawn_blocking(move || provider.shutdown()),
        )
        .await;
        match flushed {
            Ok(Ok(Ok(()))) => tracing::debug!("OpenTelemetry spans flushed"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "flushing OpenTelemetry spans failed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "flushing OpenTelemetry spans failed"),
            Err(_) => {
                tracing::warn!("flushing OpenTelemetry spans timed out; the last ones are lost")
            }
        }
    }

    fn on(&self) -> Option<&Exporting> {
        self.0.as_deref()
    }
}

/// `BASE/v1/traces`, unless `base` already names the traces path.
fn traces_url(base: &str) -> String {
    let base = base.trim().trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

/// The parent a message's `traceparent` (and `tracestate`) header names; an empty context
/// when it has none or it is malformed (publishers are not trusted: the propagator parses
/// strictly and ignores anything else).
fn extract(on: &Exporting, headers: &[(String, String)]) -> Context {
    on.propagator.extract(&Headers(headers))
}

/// The `traceparent` header value of `cx`'s span (`None` for an invalid span context).
fn traceparent_of(on: &Exporting, cx: &Context) -> Option<String> {
    let mut out = Traceparent(None);
    on.propagator.inject_context(cx, &mut out);
    out.0
}

/// AMQP headers as text pairs, names compared case-insensitively.
struct Headers<'a>(&'a [(String, String)]);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_str()).collect()
    }
}

/// Keeps only the `traceparent` an injection writes (Carteiro carries that one header).
struct Traceparent(Option<String>);

impl Injector for Traceparent {
    fn set(&mut self, key: &str, value: String) {
        if key.eq_ignore_ascii_case("traceparent") {
            self.0 = Some(value);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }

    #[test]
    fn no_endpoint_means_no_exporter() {
        let off = Telemetry::start(&TelemetryConfig::default()).expect("off");
        assert!(!off.is_on());
        assert!(off.on().is_none());
        let empty = TelemetryConfig {
            otlp_endpoint: Some(String::new()),
            ..TelemetryConfig::default()
        };
        assert!(!Telemetry::start(&empty).expect("off").is_on());
    }
}
