//! Search, against a running gateway's archive (decoys: the number as a string, a body that
//! is not JSON, the same key one level down):
//! - `console_search_in_a_browser`: in headless Chromium, a query typed into the dead-letters
//!   page's box lists exactly the dead letters it matches — by a field, a string value, a
//!   nested field, a message id, two terms — each linked to its page and its journey; a query
//!   that does not parse says at which column and why. With
//!   `CARTEIRO_CONSOLE_SCREENSHOTS=docs/console` it writes `search.png`.
//! - `search_over_http_and_the_command_line`: `GET /dlq?q=` (400 with the column for a bad
//!   query) and `carteiro dlq list --search` find the same dead letter.
//! - `a_search_that_stops_short_says_so`: a search whose first term's dead letters are all on
//!   another route stops at `SEARCH_EXAMINED_MAX` index entries, and the console page,
//!   `GET /dlq` (headers) and `dlq list` (stderr) say where, and continue below it.

use super::browser::{click, log_in, text, type_into, wait_shown};
use super::driver::Browser;
use super::{dead_letter, gateway, http, loopback};
use crate::support::{Gateway, unique};
use fantoccini::{Client, Locator};

/// The archive both tests search, and its dead letters' ids.
struct Archive {
    gw: Gateway,
    /// `se-1`: matricula 123, late, in Campinas.
    hit: i64,
    /// `se-2`: matricula 124, late.
    late: i64,
    /// `se-3`: matricula "123", a string.
    string: i64,
    /// `se-4`: a text body that mentions matricula_id = 123.
    text: i64,
    /// `se-5`: matricula 123 one level down, under `aluno`.
    nested: i64,
}

impl Archive {
    async fn start(prefix: &str, listen: &str) -> Self {
        let queue = unique(prefix);
        let gw = gateway(&queue, listen, true).await;
        let store = &gw.store;
        let full = br#"{"matricula_id":123,"status":"late","endereco":{"cidade":"Campinas"}}"#;
        let hit = dead_letter(store, &queue, "curso lotado", "se-1", full).await;
        let other = br#"{"matricula_id":124,"status":"late"}"#;
        let late = dead_letter(store, &queue, "curso lotado", "se-2", other).await;
        let as_string = br#"{"matricula_id":"123"}"#;
        let string = dead_letter(store, &queue, "curso lotado", "se-3", as_string).await;
        let text = dead_letter(store, &queue, "not json", "se-4", b"matricula_id = 123").await;
        let deeper = br#"{"aluno":{"matricula_id":123}}"#;
        let nested = dead_letter(store, &queue, "curso lotado", "se-5", deeper).await;
        Self {
            gw,
            hit,
            late,
            string,
            text,
            nested,
        }
    }
}

/// Types `query` into the dead-letters page's search box, submits it, and returns the ids
/// the results page lists, in order.
async fn search(c: &Client, base: &str, query: &str) -> Vec<i64> {
    c.goto(&format!("{base}/dead-letters"))
        .await
        .expect("dead-letters page");
    type_into(c, "search-query", query).await;
    click(c, "search-submit").await;
    wait_shown(c, &format!("the results of {query:?}"), "search-summary").await;
    let rows = c
        .find_all(Locator::Css("#search-results tr.result"))
        .await
        .expect("result rows");
    let mut ids = Vec::new();
    for row in rows {
        let id = row.attr("data-id").await.expect("attr").expect("data-id");
        ids.push(id.parse().expect("an id"));
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_search_in_a_browser() {
    let (_, listen) = loopback();
    let a = Archive::start("consolesearch", &listen).await;
    let browser = Browser::start().await;
    let c = &browser.client;
    log_in(c, &listen).await;
    let base = format!("http://{listen}");

    // A string value, newest first; then the number, which neither the string "123", the
    // text body nor the nested field matches.
    assert_eq!(
        search(c, &base, r#"body.status = "late""#).await,
        [a.late, a.hit]
    );
    let summary = text(c, "#search-summary").await;
    assert!(summary.contains("2 dead letters match"), "{summary}");
    Browser::screenshot(c, "search").await;
    assert_eq!(search(c, &base, "body.matricula_id = 123").await, [a.hit]);
    assert_eq!(
        search(c, &base, r#"body.matricula_id = "123""#).await,
        [a.string]
    );
    assert_eq!(
        search(c, &base, "body.aluno.matricula_id = 123").await,
        [a.nested]
    );
    assert_eq!(
        search(c, &base, r#"body.endereco.cidade = "Campinas""#).await,
        [a.hit]
    );
    // By message id: the text body too; two terms must both hold.
    assert_eq!(search(c, &base, "id:se-4").await, [a.text]);
    assert_eq!(
        search(c, &base, r#"id:se-2 body.status = "late""#).await,
        [a.late]
    );
    let none = search(c, &base, "id:se-1 body.matricula_id = 124").await;
    assert_eq!(none, Vec::<i64>::new());
    let summary = text(c, "#search-summary").await;
    assert!(summary.contains("No dead letter matches"), "{summary}");

    // Each result links to its page and its journey.
    search(c, &base, "body.matricula_id = 123").await;
    let message = c
        .find(Locator::Css("#search-results tr.result td a"))
        .await
        .expect("a link to the message");
    assert_eq!(
        text(c, "#search-results tr.result td a").await,
        format!("#{}", a.hit)
    );
    assert!(
        message
            .attr("href")
            .await
            .expect("href")
            .is_some_and(|href| href.ends_with(&format!("/dead-letters/message/{}", a.hit))),
        "the message's page"
    );
    c.find(Locator::Css("#search-results a.journey"))
        .await
        .expect("a link to the journey")
        .click()
        .await
        .expect("open the journey");
    let journey = wait_shown(c, "the journey page", "journey-summary").await;
    assert!(journey.contains("se-1"), "{journey}");

    // A query that does not parse: where, and why.
    c.goto(&format!("{base}/dead-letters"))
        .await
        .expect("dead-letters page");
    type_into(c, "search-query", "body.status = late").await;
    click(c, "search-submit").await;
    let refusal = wait_shown(c, "the refusal", "search-error").await;
    assert!(refusal.contains("column 15"), "{refusal}");
    assert!(refusal.contains("double quotes"), "{refusal}");
    let pointer = text(c, "#search-pointer").await;
    assert!(pointer.ends_with('^'), "{pointer}");

    browser.close().await;
    a.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_over_http_and_the_command_line() {
    let (port, listen) = loopback();
    let a = Archive::start("httpsearch", &listen).await;

    // GET /dlq?q=: the dead letter with its message id; a bad query names its column.
    let path = "/dlq?q=body.matricula_id%20%3D%20123";
    let (status, _, body) = http(port, "GET", path, &[], "").await;
    assert_eq!(status, 200, "{body}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&body).expect("JSON rows");
    let found: Vec<i64> = rows.iter().filter_map(|r| r["id"].as_i64()).collect();
    assert_eq!(found, [a.hit]);
    assert_eq!(rows[0]["message_id"], "se-1");
    let (status, _, body) = http(port, "GET", "/dlq?q=body.status%20%3D%20late", &[], "").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"column\":15"), "{body}");

    // carteiro dlq list --search: the same one, and the same refusal.
    let config = a.gw.dir.path().join("carteiro.toml");
    let listed = crate::edit::dlq(&config, &["list", "--search", "body.matricula_id = 123"]).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    let lines: Vec<&str> = listed.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with(&format!("#{} ", a.hit)), "{lines:?}");
    assert!(lines[0].contains("se-1"), "{lines:?}");
    let by_id = ["list", "--search", "id:se-5", "--json"];
    let listed = crate::edit::dlq(&config, &by_id).await;
    let row: serde_json::Value = serde_json::from_str(listed.stdout.trim()).expect("a JSON line");
    assert_eq!(row["id"].as_i64(), Some(a.nested));
    let refused = crate::edit::dlq(&config, &["list", "--search", "body.status = late"]).await;
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("column 15"), "{refused:?}");
    a.gw.stop().await;
}

/// The console's page, `GET /dlq` and `dlq list` when a search stops at its cap: 10,001 dead
/// letters share `status = "late"`, none on the route searched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_that_stops_short_says_so() {
    let (port, listen) = loopback();
    let queue = unique("stopsearch");
    let gw = gateway(&queue, &listen, true).await;
    let late = br#"{"status":"late"}"#;
    let count = carteiro::store::SEARCH_EXAMINED_MAX + 1;
    let mut ids = Vec::new();
    for i in 0..count {
        ids.push(dead_letter(&gw.store, &queue, "lotado", &format!("ss-{i}"), late).await);
    }
    ids.sort_unstable();
    // The newest SEARCH_EXAMINED_MAX are read; the oldest is below where it stops.
    let stop = ids[1];
    let q = "q=body.status%20%3D%20%22late%22%20route%3Anowhere";

    let (status, head, body) = http(port, "GET", &format!("/dlq?{q}"), &[], "").await;
    assert_eq!((status, body.trim()), (200, "[]"), "{head}");
    let head = head.to_ascii_lowercase();
    let stopped = format!("x-carteiro-search-stopped-before: {stop}");
    assert!(head.contains(&stopped), "no `{stopped}` in\n{head}");
    assert!(head.contains("x-carteiro-search-note: the search stopped after reading 10000"));
    let below = format!("/dlq?{q}&before={stop}");
    let (status, head, body) = http(port, "GET", &below, &[], "").await;
    assert_eq!((status, body.trim()), (200, "[]"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("x-carteiro-search"),
        "{head}"
    );

    let page = format!("/dead-letters/search?{q}");
    let (status, _, body) = http(port, "GET", &page, &[], "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("id=\"search-stopped\""), "{body}");
    assert!(
        body.contains("No dead letter matches among those read."),
        "{body}"
    );
    assert!(body.contains(&format!("before={stop}")), "{body}");
    assert!(body.contains("Continue with older ones"), "{body}");

    let config = gw.dir.path().join("carteiro.toml");
    let search = ["list", "--search", "body.status = \"late\" route:nowhere"];
    let listed = crate::edit::dlq(&config, &search).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    assert_eq!(listed.stdout.trim(), "", "{listed:?}");
    assert!(
        listed.stderr.contains(&format!("(here: --before {stop})")),
        "{listed:?}"
    );
    gw.stop().await;
}
