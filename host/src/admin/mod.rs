//! The admin HTTP server (loopback by default) and the operators' console.
//!
//! # Layout
//! - this file: the router, the shared state, and [`banners`] (shown on every page).
//! - `auth`: credentials (`[admin] token`, `basic`, `require_auth`), who may do what, CSRF.
//! - `origin`: the `Host` allow-list and the framing and security headers of every response.
//! - `api`: JSON — `/healthz`, `/readyz`, `/metrics`, `POST /admin/reload`, `/shadow`,
//!   `POST /admin/canary/{plugin}/promote|abort`, `/dlq`, `/dlq/{id}`, `/dlq/stats`, and the
//!   console's actions as JSON under `/api/...`.
//! - `overview`: what the routes page shows (depths, in flight, outcomes, tiers, outbox).
//! - `groups`: dead letters grouped by route and normalised reason.
//! - `retention`: the console's lines on how long outbox rows and dead letters are kept.
//! - `target`: what an action applies to (a group, a selection, a route) as a store filter.
//! - `jobs`: background replays and shadow runs, with progress, capped per kind.
//! - `shadow_file`: which plugin file a shadow run may load.
//! - `read_limit`: how many admin requests may use the store at once.
//! - `page`, `pages`, `actions`: the console's HTML (maud), read-only pages, and forms.
//! - `edit`: edit and retry on a dead letter's page (the form, the inbox rule, the edits);
//!   `journey`: a message's journey page; `search`: the search box and its results.
//! - `charts`: what the routes and dead-letters pages chart (each route's last hour, each
//!   group's last day); `sparkline`: a chart as inline SVG.

mod actions;
mod api;
pub mod auth;
mod charts;
mod edit;
pub mod groups;
mod jobs;
mod journey;
mod origin;
mod overview;
mod page;
mod pages;
mod read_limit;
mod retention;
mod search;
mod shadow_file;
mod sparkline;
mod target;

use crate::config::AdminConfig;
use crate::live::LiveHandle;
use crate::metrics::Metrics;
use crate::pipeline::StoreGate;
use crate::store::Store;
use axum::Router;
use axum::extract::FromRef;
use axum::routing::{get, post};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What a running gateway exposes to the admin server (and to tests): built by `gateway`.
#[derive(Clone)]
pub struct GatewayHandle {
    pub metrics: Arc<Metrics>,
    pub store: Store,
    pub gate: StoreGate,
    /// Dead-letter alerts of the routes that have one.
    pub alerts: Arc<crate::alerts::DeadLetterAlerts>,
    /// Reloads and what runs now (plugin versions, the last reload's outcome).
    pub live: LiveHandle,
    /// The retention policy in effect and each table's last purge (`housekeeping`).
    pub retention: Arc<crate::housekeeping::RetentionStatus>,
}

/// A refusal: status and why. Here, below `jobs`, `shadow_file` and `actions`, which all
/// refuse alike; the console shows `why` on an error page, the JSON API as `{"error": why}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct Refusal {
    /// The HTTP status answered.
    pub status: axum::http::StatusCode,
    /// What was refused and what to do, for the person who asked.
    pub why: String,
}

impl Refusal {
    pub fn new(status: axum::http::StatusCode, why: impl Into<String>) -> Self {
        Self {
            status,
            why: why.into(),
        }
    }
}

impl From<(axum::http::StatusCode, String)> for Refusal {
    fn from((status, why): (axum::http::StatusCode, String)) -> Self {
        Self { status, why }
    }
}

/// As a bare `(status, why)` answers: the status, `why` as plain text.
impl axum::response::IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        axum::response::IntoResponse::into_response((self.status, self.why))
    }
}

/// What every handler can reach.
#[derive(Clone)]
pub struct AdminState {
    pub handle: GatewayHandle,
    pub jobs: Arc<jobs::Jobs>,
    pub probe: Arc<overview::Probe>,
}

impl FromRef<AdminState> for GatewayHandle {
    fn from_ref(state: &AdminState) -> Self {
        state.handle.clone()
    }
}

/// Banners shown at the top of every console page: the raised dead-letter alerts.
pub fn banners(handle: &GatewayHandle) -> Vec<String> {
    let active = handle.alerts.active();
    let dead_letters = active
        .iter()
        .map(|alert| format!("Dead-letter alert: {}", alert.describe()));
    let slot_lag = handle.metrics.outbox.slot_lag_alert();
    dead_letters
        .chain(slot_lag.map(|lag| format!("Relay alert: {lag}")))
        .collect()
}

/// The router: console pages, JSON, and the auth guard in front of everything.
pub fn router(handle: GatewayHandle, admin: &AdminConfig) -> (Router, AdminState) {
    let state = AdminState {
        handle,
        jobs: Arc::default(),
        probe: Arc::default(),
    };
    let credentials = Arc::new(auth::Credentials::new(admin, state.handle.live.clone()));
    let reads = Arc::new(read_limit::ReadLimit::for_pool(
        state.handle.live.config().map(|c| c.store.max_connections),
    ));
    let app = Router::new()
        // Console pages.
        .route("/", get(pages::routes))
        .route("/console.js", get(pages::script))
        .route("/console.css", get(pages::stylesheet))
        .route("/login", get(|| async { page::see_other("/") }))
        .route("/dead-letters", get(pages::groups))
        .route("/dead-letters/group", get(pages::group))
        .route("/dead-letters/search", get(search::search))
        .route("/dead-letters/message/{id}", get(pages::message))
        .route("/dead-letters/message/{id}/edit", post(edit::submit))
        .route("/dead-letters/message/{id}/journey", get(journey::journey))
        .route("/dead-letters/replay", post(actions::replay))
        .route(
            "/dead-letters/purge",
            get(actions::purge_confirm).post(actions::purge),
        )
        .route("/dead-letters/shadow", post(actions::shadow))
        .route("/jobs", get(actions::jobs))
        .route("/jobs/{id}", get(actions::job))
        .route("/jobs/{id}/stop", post(actions::stop))
        // JSON.
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(api::ready))
        .route("/metrics", get(api::metrics))
        .route("/admin/reload", post(api::reload))
        .route("/shadow", get(api::shadow))
        .route("/admin/canary/{plugin}/{action}", post(api::canary))
        .route("/dlq", get(api::dlq_list))
        .route("/dlq/stats", get(api::dlq_stats))
        .route("/dlq/{id}", get(api::dlq_show))
        .route("/api/routes", get(api::routes))
        .route("/api/dlq/groups", get(api::groups))
        .route("/api/dlq/replay", post(api::replay))
        .route("/api/dlq/purge", post(api::purge))
        .route("/api/dlq/shadow", post(api::shadow_run))
        .route("/api/jobs", get(api::jobs))
        .route("/api/jobs/{id}", get(api::job))
        .route("/api/jobs/{id}/stop", post(api::stop))
        .with_state(state.clone())
        // Inside the guard: a refused request never waits for, nor takes, a turn.
        .layer(axum::middleware::from_fn_with_state(
            reads,
            read_limit::limit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            credentials,
            auth::guard,
        ));
    (app, state)
}

/// How long a shutdown waits for the console's running jobs to stop.
const JOBS_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the console and the JSON API until `stop`, then stops the jobs they started.
pub async fn serve(
    listener: tokio::net::TcpListener,
    handle: GatewayHandle,
    admin: AdminConfig,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let (app, state) = router(handle, &admin);
    // Totals sampled every few seconds, for the routes page's rates.
    let sampler = {
        let (state, stop) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(overview::SAMPLE_EVERY);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = every.tick() => state.probe.sample(&state.handle),
                }
            }
        })
    };
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    sampler.abort();
    state.jobs.stop_all(JOBS_GRACE).await;
    served?;
    Ok(())
}
