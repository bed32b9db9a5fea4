//! `[telemetry]` end to end: a gateway exporting to an OTLP/HTTP collector running in this
//! test (axum on 127.0.0.1:0, decoding `ExportTraceServiceRequest` protobufs) sends the
//! delivery span of a message, parented on its `traceparent`, with the messaging
//! attributes, its handler and commit children, and the relay's publish span of each event
//! it emitted, linked to the delivery span. A dead-lettered message's span says why.

use crate::support::{
    Client, Gateway, amqp_url, json_props, load_config, migrated_store, route_config, run_relay,
    seed_request, sqlite_url, stop_relay, unique, wait_for,
};
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use carteiro::broker::field_table::to_text_pairs;
use carteiro::metrics::Metrics;
use carteiro::relay::Relay;
use carteiro::telemetry::Telemetry;
use lapin::types::{AMQPValue, FieldTable, LongString};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

/// Spans received, with the `service.name` of their resource.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

/// A minimal OTLP/HTTP collector; returns its base URL and what it received.
async fn collector() -> (String, Received) {
    let received: Received = Arc::default();
    let app = axum::Router::new()
        .route("/v1/traces", post(export))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind collector");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, received)
}

async fn export(
    State(received): State<Received>,
    body: Bytes,
) -> ([(&'static str, &'static str); 1], Vec<u8>) {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
    let mut all = received.lock().expect("lock");
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                all.push((service.clone(), span));
            }
        }
    }
    (
        [("content-type", "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(n) => Some(n.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A span's attribute as text (`None`: not set; set twice fails the test).
fn attr(span: &Span, key: &str) -> Option<String> {
    let found: Vec<String> = span
        .attributes
        .iter()
        .filter(|kv| kv.key == key)
        .filter_map(|kv| text(kv.value.as_ref()?.value.as_ref()?))
        .collect();
    assert!(
        found.len() <= 1,
        "{key} set {} times on {}",
        found.len(),
        span.name
    );
    found.into_iter().next()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn spans(received: &Received) -> Vec<(String, Span)> {
    received.lock().expect("lock").clone()
}

/// The first of `all` that is `wanted`, whatever service sent it.
fn find_span(all: &[(String, Span)], wanted: impl Fn(&Span) -> bool) -> Option<Span> {
    all.iter().map(|(_, s)| s).find(|&s| wanted(s)).cloned()
}

/// The delivery span `name` whose attribute `key` is `value`, and the copy it published (the
/// producer span it is the parent of): what a retried or dead-lettered delivery leaves.
fn delivery_and_copy(
    all: &[(String, Span)],
    name: &str,
    key: &str,
    value: &str,
) -> Option<(Span, Span)> {
    let delivery = find_span(all, |s| {
        s.name == name && attr(s, key).as_deref() == Some(value)
    })?;
    let copy = find_span(all, |s| {
        s.parent_span_id == delivery.span_id && s.kind == SpanKind::Producer as i32
    })?;
    Some((delivery, copy))
}

#[tokio::test]
async fn delivery_and_relay_spans_reach_an_otlp_collector_linked_through_the_outbox() {
    let (endpoint, received) = collector().await;
    let queue = unique("otel");
    let exchange = unique("otel-in");
    let events = unique("otel-events");
    let client = Client::connect().await;
    let sink = client.sink(&events).await;
    client.sink(&exchange).await; // the input exchange exists before publishing
    let vars = format!("events_exchange = \"{events}\"");
    let toml = format!(
        "{}\n[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"carteiro-e2e\"\nexport_interval = \"200ms\"\n",
        route_config(&queue, "enrollment", &exchange, &vars, "")
    );
    let gw = Gateway::start(&toml).await;
    client.wait_for_consumer(&queue).await;

    // A message from a traced publisher.
    let trace_id = uuid::Uuid::now_v7().simple().to_string();
    let publisher_span = uuid::Uuid::now_v7().simple().to_string()[16..].to_owned();
    let mut headers = FieldTable::default();
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(LongString::from(format!(
            "00-{trace_id}-{publisher_span}-01"
        ))),
    );
    let body = br#"{"matricula_id":"T1","usuario_id":"U1","curso_id":"C1"}"#;
    client
        .publish(
            &exchange,
            "matricula.confirmada",
            json_props("otel-1").with_headers(headers),
            body,
        )
        .await;
    // And one the handler dead-letters (a field is missing), without a traceparent.
    client
        .publish(
            &exchange,
            "matricula.confirmada",
            json_props("otel-bad"),
            br#"{"matricula_id":"T9"}"#,
        )
        .await;

    let process = format!("{queue} process");
    let publish = format!("{events} publish");
    let (delivery, children, published) = wait_for(
        "the delivery span, its handler and commit children, and 3 relay publish spans",
        WAIT,
        || async {
            let all = spans(&received);
            let delivery = find_span(&all, |s| s.name == process && hex(&s.trace_id) == trace_id)?;
            let children: Vec<Span> = all
                .iter()
                .map(|(_, s)| s)
                .filter(|s| s.parent_span_id == delivery.span_id)
                .cloned()
                .collect();
            let published: Vec<Span> = all
                .iter()
                .map(|(_, s)| s)
                .filter(|s| s.name == publish)
                .cloned()
                .collect();
            let both_children = ["carteiro.handler", "carteiro.commit"]
                .iter()
                .all(|n| children.iter().any(|c| c.name == *n));
            (both_children && published.len() >= 3).then_some((delivery, children, published))
        },
    )
    .await;

    // The delivery span continues the publisher's trace, with the conventions.
    assert_eq!(
        hex(&delivery.parent_span_id),
        publisher_span,
        "parent from traceparent"
    );
    assert_eq!(delivery.kind, SpanKind::Consumer as i32);
    for (key, want) in [
        ("messaging.system", "rabbitmq"),
        ("messaging.operation.type", "process"),
        ("messaging.destination.name", exchange.as_str()),
        ("messaging.destination.subscription.name", queue.as_str()),
        ("messaging.message.id", "otel-1"),
        (
            "messaging.rabbitmq.destination.routing_key",
            "matricula.confirmada",
        ),
        ("carteiro.route", queue.as_str()),
        ("carteiro.outcome", "acked"),
        ("carteiro.attempt", "1"),
        ("carteiro.plugin", "enrollment"),
    ] {
        assert_eq!(attr(&delivery, key).as_deref(), Some(want), "{key}");
    }
    assert_eq!(
        attr(&delivery, "error.type"),
        None,
        "an acked delivery has no error"
    );
    let within = |child: &Span| {
        child.start_time_unix_nano >= delivery.start_time_unix_nano
            && child.end_time_unix_nano <= delivery.end_time_unix_nano
    };
    for name in ["carteiro.handler", "carteiro.commit"] {
        let child = children.iter().find(|c| c.name == name).expect("child");
        assert_eq!(
            child.trace_id, delivery.trace_id,
            "{name} in the same trace"
        );
        assert!(within(child), "{name} runs inside the delivery span");
    }
    let commit = children
        .iter()
        .find(|c| c.name == "carteiro.commit")
        .expect("commit");
    assert_eq!(
        attr(commit, "carteiro.commit.outcome").as_deref(),
        Some("committed")
    );

    // Each emitted event's publish span links to the delivery span.
    assert_eq!(published.len(), 3, "one publish span per outbox row");
    let mut keys = Vec::new();
    for span in &published {
        assert_eq!(span.kind, SpanKind::Producer as i32);
        assert_eq!(
            span.links.len(),
            1,
            "linked to the delivery that emitted it"
        );
        assert_eq!(span.links[0].trace_id, delivery.trace_id);
        assert_eq!(span.links[0].span_id, delivery.span_id);
        assert_ne!(span.trace_id, delivery.trace_id, "a trace of its own");
        assert_eq!(attr(span, "messaging.system").as_deref(), Some("rabbitmq"));
        assert_eq!(
            attr(span, "messaging.destination.name").as_deref(),
            Some(events.as_str())
        );
        assert_eq!(
            attr(span, "carteiro.route").as_deref(),
            Some(queue.as_str())
        );
        assert!(attr(span, "messaging.message.id").is_some(), "event id");
        keys.push(attr(span, "messaging.rabbitmq.destination.routing_key").unwrap_or_default());
    }
    keys.sort();
    assert_eq!(
        keys,
        ["acesso.liberado", "email.solicitado", "fatura.solicitada"]
    );

    // The events themselves carry the delivery span's context on to their consumers.
    let got = Mutex::new(Vec::new());
    wait_for("the 3 relayed events", WAIT, || async {
        let batch = client.drain(&sink).await;
        let mut all = got.lock().expect("lock");
        all.extend(batch);
        (all.len() >= 3).then_some(())
    })
    .await;
    let relayed = got.into_inner().expect("lock");
    assert_eq!(relayed.len(), 3, "three events");
    let want = format!("00-{trace_id}-{}-01", hex(&delivery.span_id));
    for m in &relayed {
        let headers = m.delivery.properties.headers().clone().unwrap_or_default();
        let traceparent = to_text_pairs(&headers)
            .into_iter()
            .find(|(k, _)| k == "traceparent")
            .map(|(_, v)| v);
        assert_eq!(
            traceparent.as_deref(),
            Some(want.as_str()),
            "the delivery span's own traceparent"
        );
    }

    // The dead-lettered delivery: a root span with the failure class and its DLX copy.
    let (failed, dlx_copy) = wait_for("the dead-lettered delivery's spans", WAIT, || async {
        let all = spans(&received);
        delivery_and_copy(&all, &process, "messaging.message.id", "otel-bad")
    })
    .await;
    assert!(
        failed.parent_span_id.is_empty(),
        "no traceparent: a root span"
    );
    assert_eq!(
        attr(&failed, "carteiro.outcome").as_deref(),
        Some("dead_lettered")
    );
    assert_eq!(attr(&failed, "error.type").as_deref(), Some("dead-letter"));
    assert_eq!(
        attr(&dlx_copy, "carteiro.republish").as_deref(),
        Some("dead-letter")
    );
    assert_eq!(dlx_copy.name, format!("{queue}.dlx publish"));

    assert!(
        spans(&received)
            .iter()
            .all(|(service, _)| service == "carteiro-e2e"),
        "every span names the configured service"
    );
    gw.stop().await;
}

/// The `[telemetry]` section for a collector at `endpoint`.
fn telemetry_section(endpoint: &str) -> String {
    format!(
        "\n[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"carteiro-e2e\"\nexport_interval = \"200ms\"\n"
    )
}

#[tokio::test]
async fn a_retried_delivery_says_so_and_shows_its_copy_to_the_retry_tier() {
    let (endpoint, received) = collector().await;
    let queue = unique("otel-retry");
    let exchange = unique("otel-retry-in");
    let client = Client::connect().await;
    client.sink(&exchange).await;
    // The content service is down: the handler asks for a retry.
    let vars = "content_service = \"down\"";
    let toml =
        route_config(&queue, "enrollment", &exchange, vars, "") + &telemetry_section(&endpoint);
    let gw = Gateway::start(&toml).await;
    client.wait_for_consumer(&queue).await;
    client
        .publish(
            &exchange,
            "matricula.confirmada",
            json_props("otel-retry-1"),
            br#"{"matricula_id":"R1","usuario_id":"U1","curso_id":"C1"}"#,
        )
        .await;
    let process = format!("{queue} process");
    let (first, copy) = wait_for(
        "the first attempt's span and its retry copy",
        WAIT,
        || async {
            let all = spans(&received);
            delivery_and_copy(&all, &process, "carteiro.attempt", "1")
        },
    )
    .await;
    assert_eq!(attr(&first, "carteiro.outcome").as_deref(), Some("retried"));
    assert_eq!(attr(&first, "error.type").as_deref(), Some("retry"));
    assert_eq!(
        copy.name, "amq.default publish",
        "retry tiers are fed through the default exchange"
    );
    assert_eq!(attr(&copy, "carteiro.republish").as_deref(), Some("retry"));
    let tier = attr(&copy, "messaging.rabbitmq.destination.routing_key").unwrap_or_default();
    assert!(tier.starts_with(&format!("{queue}.retry.")), "{tier}");
    gw.stop().await;
}

#[tokio::test]
async fn the_relay_alone_exports_its_publish_spans_with_links_and_failures() {
    // What `carteiro relay` runs: the relay and its telemetry, no gateway.
    let (endpoint, received) = collector().await;
    let client = Client::connect().await;
    let events = unique("otel-relay-events");
    let sink = client.sink(&events).await;
    let nobody = client.unbound_exchange("otel-nobody-bound", false).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = sqlite_url(dir.path());
    let config = load_config(
        dir.path(),
        &format!(
            "version = 1\n[broker]\nurl = \"{}\"\n[store]\nurl = \"{url}\"\n[relay]\npoll_interval = \"100ms\"\n{}",
            amqp_url(),
            telemetry_section(&endpoint)
        ),
    );
    let store = migrated_store(&url).await;
    // A row emitted by a traced delivery, and one nobody can receive (returned).
    let (trace_id, delivery_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let mut traced = seed_request(&events, "traced", 0);
    traced.outbox[0].headers.push((
        "traceparent".into(),
        format!("00-{trace_id}-{delivery_span}-01"),
    ));
    let returned = seed_request(&nobody, "returned", 0);
    store
        .commit_batch(&[traced, returned])
        .await
        .expect("seed commit");

    let telemetry = Telemetry::start(&config.telemetry).expect("telemetry");
    assert!(telemetry.is_on());
    let relay = run_relay(
        Relay::new(
            &config.broker,
            &config.relay,
            &config.store.url,
            store.clone(),
            Arc::new(Metrics::default()),
            None,
        )
        .with_telemetry(telemetry.clone()),
    );

    let ok_name = format!("{events} publish");
    let failed_name = format!("{nobody} publish");
    let (ok, failed) = wait_for("the relay's two publish spans", WAIT, || async {
        let all = spans(&received);
        let ok = find_span(&all, |s| s.name == ok_name)?;
        let failed = find_span(&all, |s| s.name == failed_name)?;
        Some((ok, failed))
    })
    .await;
    stop_relay(relay).await;
    telemetry.shutdown().await;

    assert_eq!(ok.kind, SpanKind::Producer as i32);
    assert_eq!(ok.links.len(), 1);
    assert_eq!(
        hex(&ok.links[0].trace_id),
        trace_id,
        "linked to the emitting delivery"
    );
    assert_eq!(hex(&ok.links[0].span_id), delivery_span);
    assert_eq!(attr(&ok, "error.type"), None);
    assert_eq!(attr(&ok, "carteiro.outbox.attempt").as_deref(), Some("1"));
    assert!(
        failed.links.is_empty(),
        "a row without traceparent has nothing to link to"
    );
    assert_eq!(attr(&failed, "error.type").as_deref(), Some("returned"));
    assert_eq!(
        failed.status.as_ref().map(|s| s.code),
        Some(opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error as i32)
    );
    assert_eq!(
        client.drain(&sink).await.len(),
        1,
        "the traced row was published"
    );
}
