//! `GET /dead-letters/message/{id}/journey`: a message's journey (`dlq::journey`) — every
//! attempt that did not end in an ack (when, plugin version, verdict or failure with its
//! reason, the retry tier it waited in, the trace id), the dead-lettering, each replay and
//! edit, the dead letters its replays became again, and the outcome.

use super::page::{error_page, page, time};
use super::{AdminState, banners};
use crate::dlq::edit::Dedup;
use crate::dlq::journey::{self, Step, What};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};

/// The first hex digits of a sha256 shown (the plugin version, as the routes page shows it).
fn version(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}

fn link(id: i64) -> Markup {
    html! { a href=(format!("/dead-letters/message/{id}")) { "#" (id) } }
}

fn row(step: &Step) -> Markup {
    html! {
        tr.step data-kind=(step.what.word()) {
            td { (time(step.at)) }
            td { (link(step.dead_letter)) }
            @match &step.what {
                What::Attempt(a) => {
                    td { "attempt " (a.n) }
                    td { (a.plugin) " " code title=(a.sha256) { (version(&a.sha256)) } }
                    td.outcome { (a.outcome) }
                    td.reason { (a.reason) }
                    td { @match &a.tier { Some(tier) => { "waited in " code { (tier) } }, None => "dead-lettered" } }
                    td { @if let Some(trace) = &a.trace { code.trace { (trace) } } }
                },
                What::Dropped(n) => {
                    td { "attempts" }
                    td colspan="5" { (n) " earlier attempts not kept (a message keeps its newest "
                        (crate::common::journey::MAX_ATTEMPTS) ")" }
                },
                What::DeadLettered { reason, kind, attempts, plugin, sha256 } => {
                    td { strong { "dead-lettered" } }
                    td {
                        (plugin.as_deref().unwrap_or("-"))
                        @if let Some(sha) = sha256 { " " code title=(sha) { (version(sha)) } }
                    }
                    td.outcome { (kind.as_deref().unwrap_or("by the broker")) }
                    td.reason { (reason) }
                    td { "after " (attempts) " attempts" }
                    td {}
                },
                What::Replayed => {
                    td { strong { "replayed" } }
                    td colspan="5" { "sent back to the route's queue as archived" }
                },
                What::Edited { actor, changes } => {
                    td { strong { "edited" } }
                    td colspan="5" { "by " (actor) ": " (changes.summary()) }
                },
            }
        }
    }
}

/// `GET /dead-letters/message/{id}/journey`
pub async fn journey(State(s): State<AdminState>, Path(id): Path<i64>) -> Response {
    let h = &s.handle;
    let unavailable = |e: crate::store::StoreError| {
        error_page(StatusCode::SERVICE_UNAVAILABLE, &banners(h), &e.to_string())
    };
    let route = match h.store.dead_letter_get(id).await {
        Ok(Some(d)) => d.letter.route,
        Ok(None) => {
            let why = format!("no dead letter {id}");
            return error_page(StatusCode::NOT_FOUND, &banners(h), &why);
        }
        Err(e) => return unavailable(e),
    };
    let dedup = h
        .live
        .config()
        .and_then(|config| Dedup::of(&config, &route));
    let j = match journey::read(&h.store, id, dedup.as_ref()).await {
        Ok(Some(j)) => j,
        Ok(None) => {
            let why = format!("no dead letter {id}");
            return error_page(StatusCode::NOT_FOUND, &banners(h), &why);
        }
        Err(e) => return unavailable(e),
    };
    page(
        &format!("Journey of dead letter #{id}"),
        &banners(h),
        html! {
            p { a href=(format!("/dead-letters/message/{id}")) { "Back to dead letter #" (id) } }
            p #journey-summary {
                "Message " code { (j.message_id.as_deref().unwrap_or("(no message id)")) }
                " on route " (j.route) "; its dead letters, oldest first: "
                @for (i, dl) in j.dead_letters.iter().enumerate() {
                    @if i > 0 { ", " }
                    (link(*dl))
                }
                "."
            }
            table #journey {
                tr {
                    th { "When" } th { "Dead letter" } th { "Step" } th { "Plugin version" }
                    th { "Verdict or failure" } th { "Reason" } th { "Then" } th { "Trace" }
                }
                @for step in &j.steps { (row(step)) }
            }
            p #journey-outcome { strong { "Outcome: " } (j.outcome.describe()) }
            p.muted {
                "Attempts come from the history a message carries on its retry and dead-letter \
                 copies (its newest " (crate::common::journey::MAX_ATTEMPTS) "); an attempt that \
                 acked records nothing there: the route's inbox record is its outcome. Trace ids \
                 show when telemetry is on."
            }
        },
    )
}
