//! The admin server's JSON (and text) endpoints, and the console's actions as JSON with the
//! same semantics as the forms: `POST /api/dlq/replay` (a background job; poll
//! `/api/jobs/{id}`), `POST /api/dlq/purge` (with the count as confirmation),
//! `POST /api/dlq/shadow`.

use super::target::Target;
use super::{AdminState, Refusal};
use crate::admin::GatewayHandle;
use crate::dlq::run::ReplayOptions;
use crate::store::DeadLetterFilter;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use serde::Deserialize;

/// First line `ready` or why not; then the detail: plugin versions, routes, last reload. A
/// refused reload does not make the gateway unready: it still serves on the previous one.
/// Where reads need credentials (off loopback, `require_auth = "all"`), an unauthenticated
/// probe gets the first line only: the detail names files, versions and reload errors.
pub async fn ready(
    State(h): State<GatewayHandle>,
    Extension(who): Extension<super::auth::Authenticated>,
) -> Response {
    let mut detail = String::new();
    if who.may_read() {
        detail = h.live.readiness_detail();
        // Alerts are notes: a route with many dead letters still serves.
        for alert in h.alerts.active() {
            detail.push_str(&format!("dead-letter alert: {}\n", alert.describe()));
        }
        if let Some(lag) = h.metrics.outbox.slot_lag_alert() {
            detail.push_str(&format!("relay alert: {lag}\n"));
        }
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
pub async fn canary(
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
        Err(why) => (StatusCode::CONFLICT, why.to_string()).into_response(),
    }
}

/// Live-shadow counts per route and result, and the newest disagreements.
pub async fn shadow(State(h): State<GatewayHandle>) -> Response {
    Json(h.live.shadows.report()).into_response()
}

/// Reloads the config file and plugins; 200 with the report when applied, 422 with the
/// reason when refused (the previous config keeps running).
pub async fn reload(State(h): State<GatewayHandle>) -> Response {
    let report = h.live.reload("POST /admin/reload").await;
    let status = if report.applied {
        StatusCode::OK
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    (status, Json(report)).into_response()
}

/// The text exposition; the outbox gauges are read from the store first when the scrape has
/// its turn at once (`read_limit::StoreTurn`: a scrape never waits behind console reads), and
/// keep their last values otherwise, as when the store does not answer.
pub async fn metrics(
    State(h): State<GatewayHandle>,
    turn: Option<Extension<super::read_limit::StoreTurn>>,
) -> Response {
    let status = match turn {
        Some(Extension(super::read_limit::StoreTurn(false))) => None,
        _ => h.store.outbox_status().await.ok(),
    };
    if let Some(status) = status {
        h.metrics.outbox.pending.set(status.pending);
        h.metrics.outbox.with_errors.set(status.with_errors);
        let age_ms = status.oldest_pending_age_ms.unwrap_or(0);
        h.metrics
            .outbox
            .oldest_pending_seconds
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
pub struct ListQuery {
    route: Option<String>,
    reason: Option<String>,
    limit: Option<i64>,
    /// Only ids below this: the next page, or where a search stopped short.
    before: Option<i64>,
    /// A search (`dlq::search`: `id:..`, `correlation:..`, `body.PATH = VALUE`, ...).
    q: Option<String>,
}

/// `GET /dlq`'s header when a search stopped short (`DeadLetterPage::stopped_before`): the id
/// to continue below (`&before=`); with it, [`SEARCH_NOTE`] says why.
pub const SEARCH_STOPPED_BEFORE: &str = "x-carteiro-search-stopped-before";
/// `GET /dlq`'s header that explains [`SEARCH_STOPPED_BEFORE`] (`dlq::search::stopped_short`).
pub const SEARCH_NOTE: &str = "x-carteiro-search-note";

fn store_error(e: impl std::fmt::Display) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
}

/// `GET /dlq[?route=R][&reason=TEXT][&q=QUERY][&limit=N][&before=ID]`: dead letters, newest
/// first; a search that does not parse is refused (400, `{"error": ..., "column": N}`). A
/// search that stopped short of a full page (`store::SEARCH_EXAMINED_MAX`) says where, in
/// headers ([`SEARCH_STOPPED_BEFORE`], [`SEARCH_NOTE`]).
pub async fn dlq_list(State(h): State<GatewayHandle>, Query(q): Query<ListQuery>) -> Response {
    let mut filter = DeadLetterFilter {
        route: q.route,
        reason_contains: q.reason,
        limit: Some(q.limit.unwrap_or(100).clamp(1, 1000)),
        before_id: q.before,
        ..Default::default()
    };
    if let Some(query) = q.q.as_deref().filter(|query| !query.trim().is_empty()) {
        let refused = |why: String, column: Option<usize>| {
            let body = serde_json::json!({ "error": why, "column": column });
            (StatusCode::BAD_REQUEST, Json(body)).into_response()
        };
        filter = match crate::dlq::search::parse(query) {
            Ok(search) => match search.narrow(filter) {
                Ok(narrowed) => narrowed,
                Err(why) => return refused(why.to_string(), None),
            },
            Err(e) => return refused(e.to_string(), Some(e.column)),
        };
    }
    let page = match h.store.dead_letters_search(&filter).await {
        Ok(page) => page,
        Err(e) => return store_error(e),
    };
    let rows: Vec<_> = page.rows.iter().map(crate::dlq::summary_json).collect();
    let mut response = Json(rows).into_response();
    if let Some(below) = page.stopped_before {
        let note = crate::dlq::search::stopped_short(page.examined, below);
        let headers = response.headers_mut();
        for (name, value) in [
            (SEARCH_STOPPED_BEFORE, below.to_string()),
            (SEARCH_NOTE, note),
        ] {
            if let Ok(value) = axum::http::HeaderValue::from_str(&value) {
                headers.insert(name, value);
            }
        }
    }
    response
}

pub async fn dlq_show(State(h): State<GatewayHandle>, Path(id): Path<i64>) -> Response {
    match h.store.dead_letter_get(id).await {
        Ok(Some(row)) => Json(crate::dlq::detail_json(&row)).into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, format!("no dead letter {id}")).into_response(),
        Err(e) => store_error(e),
    }
}

pub async fn dlq_stats(State(h): State<GatewayHandle>) -> Response {
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

/// The routes page as JSON.
pub async fn routes(State(s): State<AdminState>) -> Response {
    Json(s.probe.overview(&s.handle).await).into_response()
}

#[derive(Debug, Deserialize)]
pub struct GroupsQuery {
    route: Option<String>,
}

/// Dead-letter groups (route, normalised reason, counts, first/last seen), largest first.
pub async fn groups(State(h): State<GatewayHandle>, Query(q): Query<GroupsQuery>) -> Response {
    match super::groups::groups(&h.store, q.route.as_deref()).await {
        Ok(groups) => Json(groups).into_response(),
        Err(e) => store_error(e),
    }
}

/// `POST /api/dlq/replay` body.
#[derive(Debug, Deserialize)]
pub struct ReplayRequest {
    #[serde(flatten)]
    target: Target,
    /// Replays per second.
    rate: Option<f64>,
    /// Stop after this many.
    limit: Option<u64>,
    /// Take replayed ones too.
    #[serde(default)]
    include_replayed: bool,
}

fn refused(refusal: impl Into<Refusal>) -> Response {
    let Refusal { status, why } = refusal.into();
    (status, Json(serde_json::json!({ "error": why }))).into_response()
}

fn accepted(job: &super::jobs::Job) -> Response {
    (
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/api/jobs/{}", job.id))],
        Json(job.json()),
    )
        .into_response()
}

/// Answers a JSON request: `body` parsed as `T` (refused with 400 when it does not parse),
/// then what `act` makes of it, a refusal answered as `{"error": why}`.
async fn answer<T, F>(body: &[u8], act: impl FnOnce(T) -> F) -> Response
where
    T: serde::de::DeserializeOwned,
    F: Future<Output = Result<Response, Refusal>>,
{
    let request = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return refused((StatusCode::BAD_REQUEST, format!("bad request body: {e}"))),
    };
    act(request).await.unwrap_or_else(refused)
}

/// Starts a replay job (same engine and semantics as `carteiro dlq replay`).
pub async fn replay(State(s): State<AdminState>, body: axum::body::Bytes) -> Response {
    answer(&body, |request: ReplayRequest| async move {
        if let Some(Err(why)) = request.rate.map(crate::dlq::run::check_rate) {
            return Err(Refusal::new(StatusCode::BAD_REQUEST, why.to_string()));
        }
        let options = ReplayOptions {
            include_replayed: request.include_replayed,
            limit: request.limit,
            rate_per_sec: request.rate,
            to_queue: None,
        };
        super::actions::start_replay(&s, &request.target, options)
            .await
            .map(|job| accepted(&job))
    })
    .await
}

/// `POST /api/dlq/purge` body: the target, and `confirm`: how many dead letters it holds
/// (as the caller last saw it); a different count refuses the purge (409). `max_id`: only
/// dead letters up to this id (default: the highest matching id when the count is taken).
#[derive(Debug, Deserialize)]
pub struct PurgeRequest {
    #[serde(flatten)]
    target: Target,
    confirm: i64,
    max_id: Option<i64>,
}

pub async fn purge(State(s): State<AdminState>, body: axum::body::Bytes) -> Response {
    answer(&body, |request: PurgeRequest| async move {
        super::actions::do_purge(
            &s.handle,
            &s.jobs,
            &request.target,
            request.max_id,
            request.confirm,
        )
        .await
        .map(|purged| Json(serde_json::json!({ "purged": purged })).into_response())
    })
    .await
}

/// `POST /api/dlq/shadow` body: the target, the new plugin file (under a plugin folder of
/// the config) and optionally its SHA-256.
#[derive(Debug, Deserialize)]
pub struct ShadowRequest {
    #[serde(flatten)]
    target: Target,
    path: String,
    sha256: Option<String>,
}

pub async fn shadow_run(State(s): State<AdminState>, body: axum::body::Bytes) -> Response {
    answer(&body, |request: ShadowRequest| async move {
        super::actions::start_shadow(
            &s,
            &request.target,
            &request.path,
            request.sha256.as_deref(),
        )
        .await
        .map(|job| accepted(&job))
    })
    .await
}

pub async fn jobs(State(s): State<AdminState>) -> Response {
    Json(s.jobs.list().iter().map(|j| j.json()).collect::<Vec<_>>()).into_response()
}

pub async fn job(State(s): State<AdminState>, Path(id): Path<u64>) -> Response {
    match s.jobs.get(id) {
        Some(job) => Json(job.json()).into_response(),
        None => refused((StatusCode::NOT_FOUND, format!("no job {id}"))),
    }
}

pub async fn stop(State(s): State<AdminState>, Path(id): Path<u64>) -> Response {
    match s.jobs.get(id) {
        Some(job) => {
            job.stop();
            Json(job.json()).into_response()
        }
        None => refused((StatusCode::NOT_FOUND, format!("no job {id}"))),
    }
}
