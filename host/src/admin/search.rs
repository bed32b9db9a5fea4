//! Search in the console: the box on the dead-letters page ([`search_box`], a plain GET form)
//! and `GET /dead-letters/search?q=QUERY[&route=R][&before=ID]`, the dead letters a search
//! finds (`dlq::search`: `id:`, `correlation:`, `body.PATH = VALUE`, `route:`, `reason:`),
//! newest first, [`PAGE`] at a time, each linked to its page and its journey. A page reads at
//! most `store::SEARCH_EXAMINED_MAX` index entries; one that stopped there before it was full
//! says so, how to narrow the search, and links to the older ones.

use super::page::{Fields, error_page, page, query, time};
use super::{AdminState, banners};
use crate::common::header_names::PROP_MESSAGE_ID;
use crate::store::{DeadLetter, DeadLetterFilter};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};

/// Dead letters listed per page of results.
const PAGE: i64 = 100;

/// The search box: `query` in it, and the route the page is about (searched within).
pub fn search_box(query: &str, route: Option<&str>) -> Markup {
    html! {
        form #search method="get" action="/dead-letters/search" {
            @if let Some(route) = route { input type="hidden" name="route" value=(route); }
            label {
                "Search "
                input #search-query type="search" name="q" value=(query) size="60"
                    placeholder="id:ABC · correlation:XYZ · body.matricula_id = 123";
            }
            " "
            button #search-submit type="submit" { "Search" }
            @if let Some(route) = route { " " span.muted { "in route " (route) } }
            br;
            span.muted {
                "By message id (" code { "id:ABC" } "), correlation id (" code { "correlation:XYZ" }
                ") or a field of a JSON body (" code { "body.matricula_id = 123" } ", "
                code { "body.status = \"late\"" } ", nested: " code { "body.endereco.cidade = \"Campinas\"" }
                "); terms separated by spaces all hold, with " code { "route:R" } " and "
                code { "reason:TEXT" } "."
            }
        }
    }
}

/// `GET /dead-letters/search?q=QUERY[&route=R][&before=ID]`
pub async fn search(State(s): State<AdminState>, RawQuery(q): RawQuery) -> Response {
    let f = Fields::parse(q.as_deref().unwrap_or(""));
    let h = &s.handle;
    let route = f.get("route");
    let Some(text) = f.get("q") else {
        return page(
            "Search dead letters",
            &banners(h),
            html! {
                (search_box("", route))
                p #search-empty { "Type a search above." }
            },
        );
    };
    let refused = |why: Markup| {
        let mut response = page(
            "Search dead letters",
            &banners(h),
            html! { (search_box(text, route)) div.error #search-error { (why) } },
        );
        *response.status_mut() = StatusCode::BAD_REQUEST;
        response
    };
    let parsed = match crate::dlq::search::parse(text) {
        Ok(parsed) => parsed,
        Err(e) => {
            return refused(html! {
                "This search does not parse: " (e) pre #search-pointer { (e.pointer(text)) }
            });
        }
    };
    let base = DeadLetterFilter {
        route: route.map(str::to_owned),
        before_id: f.get("before").and_then(|b| b.parse().ok()),
        limit: Some(PAGE),
        ..Default::default()
    };
    let filter = match parsed.narrow(base) {
        Ok(filter) => filter,
        Err(why) => return refused(html! { (why) }),
    };
    let page_found = match h.store.dead_letters_search(&filter).await {
        Ok(found) => found,
        Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &banners(h), &e.to_string()),
    };
    let rows = &page_found.rows;
    // A full page may have more behind it: the next one starts below its last id. A search
    // that stopped short continues below where it stopped.
    let below = match rows.last() {
        Some(last) if rows.len() as i64 == PAGE => Some(last.id),
        _ => page_found.stopped_before,
    };
    let older = below.map(|id| {
        let id = id.to_string();
        let mut pairs = vec![("q", text), ("before", id.as_str())];
        if let Some(route) = route {
            pairs.push(("route", route));
        }
        format!("/dead-letters/search?{}", query(&pairs))
    });
    let stopped = page_found
        .stopped_before
        .map(|id| crate::dlq::search::stopped_short(page_found.examined, id));
    page(
        "Search dead letters",
        &banners(h),
        html! {
            (search_box(text, route))
            p #search-summary {
                @match rows.len() {
                    0 if stopped.is_some() => "No dead letter matches among those read.",
                    0 => "No dead letter matches.",
                    1 if stopped.is_some() => "1 dead letter matches among those read.",
                    1 => "1 dead letter matches.",
                    n if stopped.is_some() => { (n) " dead letters match among those read." },
                    n if older.is_some() => { "The newest " (n) " that match." },
                    n => { (n) " dead letters match, newest first." },
                }
            }
            @if let Some(stopped) = &stopped { p.notice #search-stopped { (stopped) } }
            @if !rows.is_empty() {
                table #search-results {
                    tr {
                        th { "Id" } th { "Route" } th { "Message id" } th { "Dead-lettered" }
                        th { "Attempts" } th { "Reason" } th { "Replays" } th { "Journey" }
                    }
                    @for d in rows { (result_row(d)) }
                }
            }
            @if let Some(older) = &older {
                p { a #search-older href=(older) {
                    @if stopped.is_some() { "Continue with older ones" } @else { "Older" }
                } }
            }
        },
    )
}

/// One dead letter found, like a group's message row, with its journey.
fn result_row(d: &DeadLetter) -> Markup {
    html! {
        tr.result data-id=(d.id) {
            td { a href=(format!("/dead-letters/message/{}", d.id)) { "#" (d.id) } }
            td { (d.letter.route) }
            td { code { (d.header(PROP_MESSAGE_ID).unwrap_or("-")) } }
            td { (time(d.letter.dead_lettered_at)) }
            td.num { (d.letter.attempts) }
            td { (d.letter.reason) }
            td.num { (d.replay_count) }
            td { a.journey href=(format!("/dead-letters/message/{}/journey", d.id)) { "journey" } }
        }
    }
}
