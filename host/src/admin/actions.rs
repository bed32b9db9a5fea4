//! The console's state-changing forms — replay (a group or a selection, rate-limited, as a
//! background job), purge (a confirmation page whose count must be typed back), a shadow run
//! of a group against another plugin file — and the job pages that show their progress.
//! The JSON API (`api`) calls the same functions.

use super::jobs::{Job, Kind, ReplayContext};
use super::page::{Fields, error_page, page, see_other};
use super::target::Target;
use super::{AdminState, Refusal, banners};
use crate::admin::GatewayHandle;
use crate::dlq::run::{ReplayOptions, parse_rate};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::html;
use std::sync::Arc;

/// The config the gateway runs; 503 while it is still starting.
fn running_config(s: &AdminState) -> Result<Arc<crate::config::Config>, Refusal> {
    s.handle.live.status().config.ok_or_else(|| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is still starting",
        )
    })
}

/// Starts a replay job on `target`.
pub async fn start_replay(
    s: &AdminState,
    target: &Target,
    options: ReplayOptions,
) -> Result<Arc<Job>, Refusal> {
    let resolved = target.resolve(&s.handle.store).await?;
    let config = running_config(s)?;
    let connection = s.probe.connection(&config).await.map_err(|e| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot reach the broker to replay: {e:#}"),
        )
    })?;
    let ctx = ReplayContext {
        store: s.handle.store.clone(),
        connection,
        publish_timeout: config.broker.publish_timeout,
        metrics: s.handle.metrics.clone(),
    };
    s.jobs
        .start_replay(ctx, resolved.title, resolved.back, resolved.filter, options)
}

/// Deletes what `target` selects up to id `max_id` if `confirm` is how many that is;
/// returns how many were deleted. Without `max_id` (the JSON purge, a form that lost it),
/// the highest matching id is fixed before counting: dead letters archived while the purge
/// runs (it deletes in chunks, one transaction each) are never part of it. At most
/// [`super::jobs::MAX_RUNNING_PURGES`] run at once (else 429).
pub async fn do_purge(
    h: &GatewayHandle,
    jobs: &super::jobs::Jobs,
    target: &Target,
    max_id: Option<i64>,
    confirm: i64,
) -> Result<u64, Refusal> {
    let unavailable =
        |e: crate::store::StoreError| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
    let _slot = jobs.purge_slot()?;
    let resolved = target.resolve(&h.store).await?;
    let mut filter = resolved.filter;
    let max = match max_id {
        Some(max) => max,
        None => h
            .store
            .dead_letters_max_id(&filter)
            .await
            .map_err(unavailable)?
            .unwrap_or(0),
    };
    filter.before_id = Some(max.saturating_add(1));
    let count = h
        .store
        .dead_letters_count(&filter)
        .await
        .map_err(unavailable)?;
    if count != confirm {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            format!(
                "the confirmation ({confirm}) does not match: {count} dead letters would be \
                 deleted; nothing was deleted"
            ),
        ));
    }
    let purged = h
        .store
        .dead_letters_purge(&filter)
        .await
        .map_err(unavailable)?;
    tracing::info!(target = %resolved.title, purged, "dead letters purged from the console");
    Ok(purged)
}

/// Starts a shadow run of the plugin file `path` (under a plugin folder of the config,
/// optionally pinned by `sha256`: see `shadow_file`) on `target`.
pub async fn start_shadow(
    s: &AdminState,
    target: &Target,
    path: &str,
    sha256: Option<&str>,
) -> Result<Arc<Job>, Refusal> {
    let resolved = target.resolve(&s.handle.store).await?;
    let config = running_config(s)?;
    let file = super::shadow_file::check(&config, path, sha256)?;
    s.jobs.start_shadow(
        config,
        s.handle.store.clone(),
        resolved.title,
        resolved.back,
        file,
        resolved.filter,
    )
}

fn target_of(f: &Fields) -> Target {
    Target {
        route: f.get("route").unwrap_or_default().to_owned(),
        reason: f.get("reason").map(str::to_owned),
        ids: f
            .all("id")
            .iter()
            .filter_map(|id| id.parse().ok())
            .collect(),
    }
}

fn refused(h: &GatewayHandle, refusal: Refusal) -> Response {
    error_page(refusal.status, &banners(h), &refusal.why)
}

/// `POST /dead-letters/replay`: `route`, `reason` (a group), `scope` (`group` or
/// `selection` with `id`s), `rate` (per second), `limit`.
pub async fn replay(State(s): State<AdminState>, body: String) -> Response {
    let f = Fields::parse(&body);
    let mut target = target_of(&f);
    let selection = f.get("scope") == Some("selection");
    if selection && target.ids.is_empty() {
        return refused(
            &s.handle,
            Refusal::new(StatusCode::BAD_REQUEST, "select at least one dead letter"),
        );
    }
    if !selection {
        target.ids.clear();
    }
    let rate = match f.get("rate").map(parse_rate).transpose() {
        Ok(r) => r,
        Err(why) => {
            return refused(
                &s.handle,
                Refusal::new(StatusCode::BAD_REQUEST, why.to_string()),
            );
        }
    };
    let limit = match f.get("limit").map(str::parse::<u64>).transpose() {
        Ok(l) => l,
        Err(_) => {
            return refused(
                &s.handle,
                Refusal::new(StatusCode::BAD_REQUEST, "limit must be a whole number"),
            );
        }
    };
    let options = ReplayOptions {
        include_replayed: f.get("include_replayed").is_some(),
        limit,
        rate_per_sec: rate,
        to_queue: None,
    };
    match start_replay(&s, &target, options).await {
        Ok(job) => see_other(&format!("/jobs/{}", job.id)),
        Err(e) => refused(&s.handle, e),
    }
}

/// `GET /dead-letters/purge?route=..&reason=..[&id=..]`: what would be deleted, and the form
/// that deletes it once its count is typed back.
pub async fn purge_confirm(State(s): State<AdminState>, RawQuery(q): RawQuery) -> Response {
    let f = Fields::parse(q.as_deref().unwrap_or(""));
    let target = target_of(&f);
    let h = &s.handle;
    let resolved = match target.resolve(&h.store).await {
        Ok(r) => r,
        Err(e) => return refused(h, e),
    };
    let (count, max_id) = match (
        h.store.dead_letters_count(&resolved.filter).await,
        h.store.dead_letters_max_id(&resolved.filter).await,
    ) {
        (Ok(c), Ok(m)) => (c, m.unwrap_or(0)),
        (Err(e), _) | (_, Err(e)) => {
            return refused(
                h,
                Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            );
        }
    };
    page(
        "Purge dead letters",
        &banners(h),
        html! {
            div.error {
                "This deletes " strong #purge-count { (count) } " dead letters of "
                (resolved.title) " for good, replayed or not. It cannot be undone."
            }
            form #purge-form method="post" action="/dead-letters/purge" {
                input type="hidden" name="route" value=(target.route);
                @if let Some(reason) = &target.reason { input type="hidden" name="reason" value=(reason); }
                @for id in &target.ids { input type="hidden" name="id" value=(id); }
                input type="hidden" name="max_id" value=(max_id);
                label { "Type " strong { (count) } " to confirm: "
                    input #confirm type="text" name="confirm" autocomplete="off" required; }
                " "
                button.danger #purge-submit type="submit" { "Delete " (count) " dead letters" }
            }
            p { a href=(resolved.back) { "Cancel" } }
        },
    )
}

/// `POST /dead-letters/purge`: deletes when `confirm` matches the count shown.
pub async fn purge(State(s): State<AdminState>, body: String) -> Response {
    let f = Fields::parse(&body);
    let target = target_of(&f);
    let h = &s.handle;
    let Some(confirm) = f.get("confirm").and_then(|c| c.parse::<i64>().ok()) else {
        return refused(
            h,
            Refusal::new(
                StatusCode::BAD_REQUEST,
                "type the number of dead letters to confirm the purge; nothing was deleted",
            ),
        );
    };
    let max_id = f.get("max_id").and_then(|m| m.parse().ok());
    let back = match target.resolve(&h.store).await {
        Ok(r) => r.back,
        Err(e) => return refused(h, e),
    };
    match do_purge(h, &s.jobs, &target, max_id, confirm).await {
        Ok(purged) => page(
            "Purged",
            &banners(h),
            html! {
                div.notice #purged { (purged) " dead letters deleted." }
                p { a href=(format!("/dead-letters?{}", super::page::query(&[("route", &target.route)]))) { "Back to the route's dead letters" } }
                p.muted { "(" (back) ")" }
            },
        ),
        Err(e) => refused(h, e),
    }
}

/// `POST /dead-letters/shadow`: `route`, `reason`, `path` (the new plugin file), `sha256`
/// (optional pin).
pub async fn shadow(State(s): State<AdminState>, body: String) -> Response {
    let f = Fields::parse(&body);
    let target = target_of(&f);
    match start_shadow(
        &s,
        &target,
        f.get("path").unwrap_or_default(),
        f.get("sha256"),
    )
    .await
    {
        Ok(job) => see_other(&format!("/jobs/{}", job.id)),
        Err(e) => refused(&s.handle, e),
    }
}

/// `POST /jobs/{id}/stop`
pub async fn stop(State(s): State<AdminState>, Path(id): Path<u64>) -> Response {
    match s.jobs.get(id) {
        Some(job) => {
            job.stop();
            see_other(&format!("/jobs/{id}"))
        }
        None => refused(
            &s.handle,
            Refusal::new(StatusCode::NOT_FOUND, format!("no job {id}")),
        ),
    }
}

/// `GET /jobs`
pub async fn jobs(State(s): State<AdminState>) -> Response {
    let jobs = s.jobs.list();
    page(
        "Jobs",
        &banners(&s.handle),
        html! {
            @if jobs.is_empty() { p.muted { "No replays or shadow runs since the gateway started." } }
            @else {
                table {
                    tr { th { "Job" } th { "Kind" } th { "On" } th { "Started" } th { "Progress" } th { "State" } }
                    @for job in &jobs {
                        @let st = job.state();
                        tr {
                            td { a href=(format!("/jobs/{}", job.id)) { "#" (job.id) } }
                            td { (format!("{:?}", job.kind).to_lowercase()) }
                            td { (job.title) }
                            td { (super::page::time(job.started_ms)) }
                            td.num { (st.done) " / " (st.planned) }
                            td { (state_word(&st)) }
                        }
                    }
                }
            }
        },
    )
}

fn state_word(st: &super::jobs::State) -> &'static str {
    match (st.finished, st.stopped, st.error.is_some()) {
        (false, _, _) => "running",
        (true, true, _) => "stopped",
        (true, false, true) => "failed",
        (true, false, false) => "done",
    }
}

/// `GET /jobs/{id}`: progress while it runs (the script polls `/api/jobs/{id}`), the report
/// once it is over.
pub async fn job(State(s): State<AdminState>, Path(id): Path<u64>) -> Response {
    let Some(job) = s.jobs.get(id) else {
        return refused(
            &s.handle,
            Refusal::new(StatusCode::NOT_FOUND, format!("no job {id}")),
        );
    };
    let st = job.state();
    let title = match job.kind {
        Kind::Replay => format!("Replay #{}", job.id),
        Kind::Shadow => format!("Shadow run #{}", job.id),
    };
    page(
        &title,
        &banners(&s.handle),
        html! {
            @if !st.finished { noscript { meta http-equiv="refresh" content="2"; } }
            p { (job.title) }
            div #job data-job=(job.id) data-finished=(st.finished) {
                p {
                    progress max=(st.planned.max(1)) value=(st.done) {}
                    " "
                    span data-field="done" { (st.done) } " of " span data-field="planned" { (st.planned) }
                    @match job.kind { Kind::Replay => " replayed", Kind::Shadow => " run" }
                }
                p #job-state { "State: " strong { (state_word(&st)) } }
            }
            @if !st.finished && job.kind == Kind::Replay {
                form method="post" action=(format!("/jobs/{}/stop", job.id)) {
                    button type="submit" { "Stop" }
                    " "
                    span.muted { "A stopped replay resumes where it stopped when you start the same replay again." }
                }
            }
            @if let Some(error) = &st.error { div.error { (error) } }
            @if let Some(remaining) = st.remaining {
                p #remaining { (remaining) " matching dead letters not replayed yet." }
            }
            @if st.stopped { div.notice { "Stopped. Start the same replay again to continue with what is left." } }
            @if !st.failed.is_empty() {
                h2 { "Failed" }
                ul { @for (id, why) in &st.failed { li { "#" (id) ": " (why) } } }
            }
            @if let Some(summary) = &st.summary {
                h2 { "Shadow report" }
                p.muted { "Nothing was committed or published." }
                @let sm = &summary["summary"];
                table #shadow-summary {
                    tr { th { "sha256" } td { code { (sm["sha256"].as_str().unwrap_or("")) } } }
                    tr { th { "messages" } td.num { (sm["total"]) } }
                    tr { th { "dead-letter → ack" } td.num { (sm["dead_letter_to_ack"]) } }
                    tr { th { "still dead-letter" } td.num { (sm["still_dead_letter"]) } }
                    tr { th { "dead-letter → retry" } td.num { (sm["dead_letter_to_retry"]) } }
                    tr { th { "dead-letter → failure" } td.num { (sm["dead_letter_to_failure"]) } }
                }
            }
            @if !st.lines.is_empty() { pre #shadow-lines { @for line in &st.lines { (line) "\n" } } }
            p { a #back href=(job.back) { "Back" } }
        },
    )
}
