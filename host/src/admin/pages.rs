//! The console's read-only pages: routes (with each route's last hour charted: `charts`),
//! dead-letter groups (each with its last day charted), one group's messages, one message
//! (with its edit form: `edit`). Everything shown comes from publishers or plugins and is
//! escaped by maud.

use super::auth::{Authenticated, NoActions};
use super::page::{Fields, age, error_page, page, query, time};
use super::target::group_url;
use super::{AdminState, banners, charts, groups, retention};
use crate::admin::GatewayHandle;
use crate::common::header_names::PROP_MESSAGE_ID;
use crate::common::now_ms;
use crate::store::{DeadLetter, DeadLetterFilter};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

/// Messages listed per group page.
const PAGE: i64 = 100;

/// `GET /console.css`: a file of its own, so the CSP needs no inline styles.
pub async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        super::page::CSS,
    )
        .into_response()
}

pub async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        super::page::JS,
    )
        .into_response()
}

fn depth(d: &super::overview::Depth) -> Markup {
    html! { @match d.messages { Some(n) => (n), None => span.muted { "?" } } }
}

/// `GET /`: every route.
pub async fn routes(State(s): State<AdminState>) -> Response {
    let o = s.probe.overview(&s.handle).await;
    let outcomes = super::overview::OUTCOMES;
    let kept = retention::outbox_line(&s.handle.retention, now_ms());
    page(
        "Routes",
        &banners(&s.handle),
        html! {
            @if !o.store_healthy { div.error { "The store is unavailable: consumption is paused." } }
            @if let Some(e) = &o.broker_error { div.error { "Queue depths unknown: " (e) } }
            table #routes {
                tr {
                    th { "Route" } th { "Ready" } th { "Consumers" } th { "In flight" }
                    @for (name, _) in outcomes { th { (name) } }
                    th { "Plugin" } th { "Retry tiers (ready)" } th { "DLQ" }
                }
                @for r in &o.routes {
                    tr data-route=(r.queue.queue) {
                        td { a href=(format!("/dead-letters?{}", query(&[("route", &r.queue.queue)]))) { (r.queue.queue) } }
                        td.num data-field="depth" { (depth(&r.queue)) }
                        td.num { @match r.queue.consumers { Some(n) => (n), None => "?" } }
                        td.num data-field="in-flight" { (r.in_flight) }
                        @for c in &r.outcomes {
                            td.num data-field=(c.outcome) {
                                (c.total)
                                @if let Some(rate) = c.per_minute { br; span.muted { (format!("{rate:.1}/min")) } }
                            }
                        }
                        td {
                            (r.plugin)
                            @if let Some(v) = &r.version { br; code title=(r.sha256.as_deref().unwrap_or("")) { (v) } }
                        }
                        td {
                            "max " (r.max_attempts) " attempts"
                            @for t in &r.tiers {
                                br;
                                code title=(t.depth.queue) { (super::page::delay(u64::try_from(t.delay_ms).unwrap_or(u64::MAX))) }
                                ": " (depth(&t.depth))
                            }
                        }
                        td.num { (depth(&r.dead_letter_queue)) }
                    }
                }
            }
            h2 { "Last hour" }
            div #charts {
                @for r in &o.routes { (charts::route_charts(&r.queue.queue, &r.last_hour)) }
                p.muted { "One point a minute, the current minute last; kept in the gateway since it started." }
            }
            h2 { "Outbox" }
            @match &o.outbox {
                Some(ob) => p #outbox {
                    strong { (ob.pending) } " pending"
                    @if let Some(a) = ob.oldest_pending_age_ms { ", oldest " (age(a)) " old" }
                    @if ob.with_errors > 0 { ", " (ob.with_errors) " with publish errors" }
                    "."
                },
                None => p.muted { "Outbox status unavailable (store)." },
            }
            p.muted #outbox-retention { (kept) }
            @if !o.app_outboxes.is_empty() {
                h2 { "Application outboxes" }
                table #app-outboxes {
                    thead { tr {
                        th { "outbox" } th.num { "pending" } th.num { "oldest" }
                        th.num { "failing" } th.num { "parked" } th.num { "published" } th { "relay" }
                    } }
                    tbody { @for (name, seen) in &o.app_outboxes {
                        tr {
                            td { (name) }
                            td.num { (seen.observed.pending) }
                            td.num { @if seen.observed.pending > 0 { (age((seen.observed.oldest_pending_seconds * 1000.0) as i64)) } @else { "-" } }
                            td.num { (seen.observed.failing) }
                            td.num { (seen.observed.parked) }
                            td.num { (seen.published) }
                            td { @if seen.active { "active" } @else { "standing by" } }
                        }
                    } }
                }
                p.muted { "Tables the applications write in their own transactions, relayed by this gateway; "
                    code { "carteiro outbox status" } " names parked rows. See docs/outboxes.md." }
            }
            p.muted { "Totals since the gateway started; rates over the last minute. "
                a href="/api/routes" { "JSON" } }
        },
    )
}

/// `GET /dead-letters[?route=R]`: groups by route and normalised reason.
pub async fn groups(State(s): State<AdminState>, RawQuery(q): RawQuery) -> Response {
    let f = Fields::parse(q.as_deref().unwrap_or(""));
    let route = f.get("route");
    let h = &s.handle;
    let groups = match groups::groups(&h.store, route).await {
        Ok(g) => g,
        Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &banners(h), &e.to_string()),
    };
    let title = match route {
        Some(r) => format!("Dead letters of {r}"),
        None => "Dead letters".to_owned(),
    };
    let now = now_ms();
    let kept = retention::dead_letters_line(&h.retention, now);
    // The charts only add to the page: a store that does not answer shows "?" for them.
    let hours = charts::GroupHours::read(&h.store, route, now).await.ok();
    page(
        &title,
        &banners(h),
        html! {
            @if route.is_some() { p { a href="/dead-letters" { "All routes" } } }
            (super::search::search_box("", route))
            p.muted #dead-letter-retention { (kept) }
            @if groups.is_empty() { p #no-groups { "No dead letters." } }
            @else {
                table #groups {
                    tr { th { "Route" } th { "Reason (normalised)" } th { "Count" } th { "Not replayed" } th { "First seen" } th { "Last seen" } th { "Last 24 hours" } }
                    @for g in &groups {
                        tr.group data-route=(g.route) data-reason=(g.reason) {
                            td { (g.route) }
                            td { a href=(group_url(&g.route, &g.reason)) { (g.reason) }
                                @if g.reasons.len() > 1 { br; span.muted { (g.reasons.len()) " variants, e.g. " (g.example) } } }
                            td.num data-field="count" { (g.count) }
                            td.num data-field="unreplayed" { (g.unreplayed) }
                            td { (time(g.first_at)) }
                            td { (time(g.last_at)) }
                            td.spark data-field="hours" { (charts::group_chart(hours.as_ref().map(|hours| hours.of(&g.route, &g.reason)))) }
                        }
                    }
                }
            }
        },
    )
}

/// `GET /dead-letters/group?route=R&reason=N[&before=ID]`: the group, its actions and its
/// messages (newest first, [`PAGE`] at a time).
pub async fn group(
    State(s): State<AdminState>,
    Extension(who): Extension<Authenticated>,
    RawQuery(q): RawQuery,
) -> Response {
    let off = who.why_no_actions().is_some();
    let f = Fields::parse(q.as_deref().unwrap_or(""));
    let h = &s.handle;
    let (Some(route), Some(reason)) = (f.get("route"), f.get("reason")) else {
        return error_page(
            StatusCode::BAD_REQUEST,
            &banners(h),
            "route and reason are required",
        );
    };
    let group = match groups::find(&h.store, route, reason).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            return page(
                "Group",
                &banners(h),
                html! { p #empty-group { "No dead letters left in this group." }
                p { a href=(format!("/dead-letters?{}", query(&[("route", route)]))) { "Back to the route's dead letters" } } },
            );
        }
        Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &banners(h), &e.to_string()),
    };
    let filter = DeadLetterFilter {
        before_id: f.get("before").and_then(|b| b.parse().ok()),
        limit: Some(PAGE),
        ..group.filter()
    };
    let rows = match h.store.dead_letters_list(&filter).await {
        Ok(r) => r,
        Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &banners(h), &e.to_string()),
    };
    page(
        &format!("{} · {}", group.route, group.reason),
        &banners(h),
        html! {
            p #group-summary {
                strong data-field="count" { (group.count) } " dead letters, "
                strong data-field="unreplayed" { (group.unreplayed) } " not replayed; first seen "
                (time(group.first_at)) ", last seen " (time(group.last_at)) "."
            }
            (group_actions(&group.route, &group.reason, who))
            form #messages method="post" action="/dead-letters/replay" {
                input type="hidden" name="route" value=(group.route);
                input type="hidden" name="reason" value=(group.reason);
                input type="hidden" name="scope" value="selection";
                table {
                    tr { th { "" } th { "Id" } th { "Message id" } th { "Dead-lettered" } th { "Attempts" } th { "Reason" } th { "Replays" } }
                    @for d in &rows { (message_row(d)) }
                }
                label { "Rate " input type="text" name="rate" value="50" size="5"; " /s " }
                button #replay-selected type="submit" disabled[off] { "Replay selected" }
            }
            @if rows.len() as i64 == PAGE {
                @if let Some(last) = rows.last() {
                    p { a href=(format!("{}&{}", group_url(&group.route, &group.reason), query(&[("before", &last.id.to_string())]))) { "Older" } }
                }
            }
        },
    )
}

/// Beside actions the viewer cannot take: why, and what to do.
fn why_no_actions(who: Authenticated) -> Markup {
    html! {
        @match who.why_no_actions() {
            Some(NoActions::LogIn) => p.notice #actions-off {
                "Replay, purge, edit and shadow runs need the [admin] credentials: "
                a href="/login" { "log in" } " first."
            },
            Some(NoActions::NoCredentials) => p.notice #actions-off {
                "Replay, purge, edit and shadow runs are off: this config sets no [admin] token or \
                 basic credentials (docs/admin.md). The CLI (carteiro dlq ...) works meanwhile."
            },
            None => {},
        }
    }
}

fn group_actions(route: &str, reason: &str, who: Authenticated) -> Markup {
    let off = who.why_no_actions().is_some();
    html! {
        fieldset {
            legend { "Actions on the whole group" }
            (why_no_actions(who))
            form.inline #replay-group method="post" action="/dead-letters/replay" {
                input type="hidden" name="route" value=(route);
                input type="hidden" name="reason" value=(reason);
                input type="hidden" name="scope" value="group";
                label { "Rate " input #replay-rate type="text" name="rate" value="50" size="5"; " /s " }
                label { "Limit " input type="text" name="limit" size="5" placeholder="all"; }
                " "
                button #replay-group-submit type="submit" disabled[off] { "Replay group" }
            }
            form.inline #purge-group method="get" action="/dead-letters/purge" {
                input type="hidden" name="route" value=(route);
                input type="hidden" name="reason" value=(reason);
                button.danger #purge-group-submit type="submit" disabled[off] { "Purge group…" }
            }
            form.inline #shadow-group method="post" action="/dead-letters/shadow" {
                input type="hidden" name="route" value=(route);
                input type="hidden" name="reason" value=(reason);
                label { "Shadow run against " input #shadow-path type="text" name="path" size="40" placeholder="plugins/new.wasm"; }
                " "
                label { "sha256 " input #shadow-sha256 type="text" name="sha256" size="20" placeholder="optional pin"; }
                " "
                button #shadow-submit type="submit" disabled[off] { "Shadow run" }
            }
            p.muted { "A replay takes the group's dead letters not replayed yet, oldest first, and marks each after its confirm: running it again continues where a stopped run ended." }
        }
    }
}

fn message_row(d: &DeadLetter) -> Markup {
    html! {
        tr.message data-id=(d.id) {
            td { input type="checkbox" name="id" value=(d.id); }
            td { a href=(format!("/dead-letters/message/{}", d.id)) { "#" (d.id) } }
            td { code { (d.header(PROP_MESSAGE_ID).unwrap_or("-")) } }
            td { (time(d.letter.dead_lettered_at)) }
            td.num { (d.letter.attempts) }
            td { (d.letter.reason) }
            td.num { (d.replay_count) }
        }
    }
}

/// The body for people: pretty JSON if it is JSON, else the text, else a hex preview.
fn body_text(body: &[u8]) -> (String, &'static str) {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
        && let Ok(pretty) = serde_json::to_string_pretty(&value)
    {
        return (pretty, "JSON");
    }
    match std::str::from_utf8(body) {
        Ok(text) => (text.to_owned(), "text"),
        Err(_) => {
            let shown = &body[..body.len().min(4096)];
            (hex::encode(shown), "not UTF-8; hex of the first 4 KiB")
        }
    }
}

/// Where a replay of a foreign dead letter goes (`foreign_dlq`).
fn replays_to(d: &DeadLetter) -> String {
    match crate::foreign_dlq::origin(d) {
        Some(origin) => crate::dlq::describe(&origin),
        None => format!("queue `{}`", d.letter.queue),
    }
}

/// A Celery task's name, id and arguments.
fn celery_section(task: &crate::foreign_dlq::CeleryTask) -> Markup {
    let json = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    html! {
        h2 { "Celery task" }
        table #celery {
            tr { th { "Task" } td #celery-task { code { (task.task) } } }
            tr { th { "Task id" } td { code { (task.id) } } }
            tr { th { "Args" } td { pre #celery-args { (json(&task.args)) } } }
            tr { th { "Kwargs" } td { pre { (json(&task.kwargs)) } } }
        }
    }
}

/// `GET /dead-letters/message/{id}`
pub async fn message(
    State(s): State<AdminState>,
    Extension(who): Extension<Authenticated>,
    Path(id): Path<i64>,
) -> Response {
    let off = who.why_no_actions().is_some();
    let h: &GatewayHandle = &s.handle;
    let d = match h.store.dead_letter_get(id).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            return error_page(
                StatusCode::NOT_FOUND,
                &banners(h),
                &format!("no dead letter {id}"),
            );
        }
        Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &banners(h), &e.to_string()),
    };
    let reason = groups::normalise_reason(&d.letter.reason);
    let (body, kind) = body_text(&d.letter.body);
    // The history only adds to the page: a store that does not answer shows none.
    let events = h.store.dead_letter_events(id).await.unwrap_or_default();
    let inbox = super::edit::inbox(&s, &d).await;
    page(
        &format!("Dead letter #{}", d.id),
        &banners(h),
        html! {
            p { a href=(group_url(&d.letter.route, &reason)) { "Group: " (reason) } }
            table #facts {
                tr { th { "Message id" } td #message-id { code { (d.header(PROP_MESSAGE_ID).unwrap_or("-")) } } }
                tr { th { "Route" } td { (d.letter.route) } }
                tr { th { "Queue" } td { (d.letter.queue) } }
                tr { th { "Reason" } td #reason { (d.letter.reason) } }
                tr { th { "Plugin" } td { (d.letter.plugin.as_deref().unwrap_or("-")) } }
                tr { th { "Attempts" } td #attempts { (d.letter.attempts) } }
                tr { th { "First failed" } td { @match d.letter.first_failed_at { Some(t) => (time(t)), None => "-" } } }
                tr { th { "Dead-lettered" } td { (time(d.letter.dead_lettered_at)) } }
                tr { th { "Replayed" } td { (d.replay_count) " times"
                    @if let Some(t) = d.replayed_at { ", last " (time(t)) } } }
                tr { th { "Edited" } td #edited { @match d.edited_at { Some(t) => (time(t)), None => "never" } } }
                @if let Some(of) = d.replay_of {
                    tr { th { "Replay of" } td { a href=(format!("/dead-letters/message/{of}")) { "#" (of) } } }
                }
                @if crate::foreign_dlq::is_foreign(&d) {
                    tr { th { "Replays to" } td #replays-to { (replays_to(&d)) } }
                }
            }
            @if let Some(task) = crate::dlq::celery_task(&d) {
                (celery_section(&task))
            }
            p { a #journey-link href=(format!("/dead-letters/message/{}/journey", d.id)) { "Journey: every attempt, replay and edit of this message" } }
            (why_no_actions(who))
            @if d.edited_at.is_none() {
                form.inline method="post" action="/dead-letters/replay" {
                    input type="hidden" name="route" value=(d.letter.route);
                    input type="hidden" name="reason" value=(reason);
                    input type="hidden" name="scope" value="selection";
                    input type="hidden" name="id" value=(d.id);
                    input type="hidden" name="include_replayed" value="1";
                    button #replay-one type="submit" disabled[off] { "Replay this message" }
                }
            }
            h2 { "Body " span.muted { "(" (d.letter.body.len()) " bytes, " (kind) ")" } }
            pre #body { (body) }
            (super::edit::section(&d, &inbox, &events, off))
            h2 { "Headers" }
            table #headers {
                tr { th { "Name" } th { "Value" } }
                @for (k, v) in &d.letter.headers { tr { td { code { (k) } } td { code { (v) } } } }
            }
        },
    )
}
