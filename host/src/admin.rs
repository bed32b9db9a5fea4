//! The admin HTTP server (loopback by default): `/healthz`, `/readyz` (with plugin versions
//! and the last reload's outcome), `/metrics`, `POST /admin/reload`, `/shadow` (live-shadow
//! comparisons), `POST /admin/canary/{plugin}/promote|abort`, and a read-only
//! dead-letter API (`/dlq`, `/dlq/{id}`, `/dlq/stats`).

use crate::gateway::GatewayHandle;
use crate::store::DeadLetterFilter;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// Serves until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    handle: GatewayHandle,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route("/admin/reload", post(reload))
        .route("/shadow", get(shadow))
        .route("/admin/canary/{plugin}/{action}", post(canary))
        .route("/dlq", get(dlq_list))
        .route("/dlq/stats", get(dlq_stats))
        .route("/dlq/{id}", get(dlq_show))
        .with_state(handle);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await?;
    Ok(())
}

/// First line `ready` or why not; then the detail: plugin versions, routes, last reload. A
/// refused reload does not make the gateway unready: it still serves on the previous one.
async fn ready(State(h): State<GatewayHandle>) -> Response {
    let mut detail = h.live.readiness_detail();
    // Alerts are notes: a route with many dead letters still serves.
    for alert in h.alerts.active() {
        detail.push_str(&format!("dead-letter alert: {}\n", alert.describe()));
    }
    if h.gate.is_healthy() {
        (StatusCode::OK, format!("ready\n{detail}")).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store unavailable\n{detail}"),
        )
            .into_response()
    }
}

/// `promote` or `abort` plugin `plugin`'s canary.
async fn canary(
    State(h): State<GatewayHandle>,
    Path((plugin, action)): Path<(String, String)>,
) -> Response {
    let promote = match action.as_str() {
        "promote" => true,
        "abort" => false,
        _ => return (StatusCode::NOT_FOUND, "use promote or abort").into_response(),
    };
    match h.live.finish_canary(&plugin, promote) {
        Ok(state) => (StatusCode::OK, state).into_response(),
        Err(why) => (StatusCode::CONFLICT, why).into_response(),
    }
}

/// Live-shadow counts per route and result, and the newest disagreements.
async fn shadow(State(h): State<GatewayHandle>) -> Response {
    Json(h.live.shadows.report()).into_response()
}

/// Reloads the config file and plugins; 200 with the report when applied, 422 with the
/// reason when refused (the previous config keeps running).
async fn reload(State(h): State<GatewayHandle>) -> Response {
    let report = h.live.reload("POST /admin/reload").await;
    let status = if report.applied {
        StatusCode::OK
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    (status, Json(report)).into_response()
}

/// The text exposition; the outbox gauges are read from the store first (a store that does
/// not answer leaves their last values).
async fn metrics(State(h): State<GatewayHandle>) -> Response {
    if let Ok(status) = h.store.outbox_status().await {
        h.metrics.outbox_pending.set(status.pending);
        h.metrics.outbox_with_errors.set(status.with_errors);
        let age_ms = status.oldest_pending_age_ms.unwrap_or(0);
        h.metrics
            .outbox_oldest_pending_seconds
            .set(age_ms as f64 / 1000.0);
    }
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        h.metrics.encode(),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    route: Option<String>,
    reason: Option<String>,
    limit: Option<i64>,
}

fn store_error(e: impl std::fmt::Display) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
}

async fn dlq_list(State(h): State<GatewayHandle>, Query(q): Query<ListQuery>) -> Response {
    let filter = DeadLetterFilter {
        route: q.route,
        reason_contains: q.reason,
        limit: Some(q.limit.unwrap_or(100).clamp(1, 1000)),
        ..Default::default()
    };
    match h.store.dead_letters_list(&filter).await {
        Ok(rows) => Json(
            rows.iter()
                .map(crate::dlq::summary_json)
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => store_error(e),
    }
}

async fn dlq_show(State(h): State<GatewayHandle>, Path(id): Path<i64>) -> Response {
    match h.store.dead_letter_get(id).await {
        Ok(Some(row)) => Json(crate::dlq::detail_json(&row)).into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, format!("no dead letter {id}")).into_response(),
        Err(e) => store_error(e),
    }
}

async fn dlq_stats(State(h): State<GatewayHandle>) -> Response {
    match h.store.dead_letter_stats().await {
        Ok(stats) => Json(
            stats
                .iter()
                .map(
                    |s| serde_json::json!({"route": s.route, "reason": s.reason, "count": s.count}),
                )
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => store_error(e),
    }
}
