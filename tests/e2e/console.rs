//! The operators' console in a real browser (headless Chromium through chromedriver) and
//! over plain HTTP, against a running gateway with a known mix of dead letters.
//! - `console_in_a_browser`: routes; the right group counts; a message (pretty JSON,
//!   escaped hostile text); a group replay whose counts change; a purge that asks for its
//!   count; an unauthenticated state change refused (401).
//! - `console_auth_rules`: who may do what (bearer, basic, cross-site, off loopback).
//! - `console_refuses_to_render_in_a_frame`: framed in Chromium, the console does not
//!   render; a rebinding name gets the Host refusal; security headers on every response;
//!   `/readyz` off loopback shows only its status line to strangers.
//! - `console_refuses_foreign_hosts`: a request naming another host (DNS rebinding) is
//!   refused whatever its credentials; `allowed_hosts` and `require_auth = "all"`.
//! - `console_rates_and_running_jobs_are_bounded`: replay rates outside 0.01–10,000/s are
//!   refused (400), a fifth running replay too (429).
//! - `console_purge_deletes_only_what_it_counted`: dead letters archived while a purge runs
//!   are kept (the JSON purge too, which sends no `max_id`).
//! - `console_read_flood_does_not_starve_the_pipeline`: 30 clients reading the groups of a
//!   million dead letters on a two-connection pool; messages still flow, no store outage.
//! - `console_reload_applies_rotated_credentials`: a reload rotates `[admin]` credentials
//!   (the old ones refused); a rotated broker password refuses the reload, naming the key.
//! - `console_shadow_runs_only_plugin_folder_files`: a shadow run of `/etc/passwd`, a
//!   `../` path, a symlink out or a non-wasm file is refused without quoting it; a sha256 pin.
//! - `console_replay_stops_and_resumes_once`: a rate-limited replay stopped half-way, then
//!   started again, replays each message exactly once (JSON API);
//!   `a_running_replay_stops_with_its_gateway`: nothing is replayed once the gateway stopped.
//! - `console_edit_and_retry_in_a_browser`: a dead letter's edit form (the inbox rule it
//!   states, refusals, the edit record, a new id) and the journey page;
//!   `console_edit_needs_credentials_and_the_console_origin`: the edit's form post over HTTP.
//! - `console_charts_in_a_browser`: a known mix charted on the routes page (a line of 60
//!   minutes per outcome, the mix in the latest point) and a group's last 24 hours on the
//!   dead-letters page.
//! - `console_search_in_a_browser`: a query typed into the dead-letters page's search box
//!   lists exactly the dead letters it matches (a body field, a nested one, a string value, a
//!   message id), linked to their journeys, and a bad query says where;
//!   `search_over_http_and_the_command_line`: `GET /dlq?q=` and `carteiro dlq list --search`.

mod auth;
mod browser;
mod charts;
mod driver;
mod edit;
mod framing;
mod hosts;
mod limits;
mod purge_bound;
mod read_flood;
mod reload_creds;
mod resume;
mod search;
mod shadow_files;

use crate::support::{
    Gateway, counter_dead_letter, http_exchange, plugin_route, sqlite_config_head, unique,
    wait_for, wait_listening,
};
use carteiro::store::{DeadLetterFilter, NewDeadLetter, Store};
use std::time::Duration;

pub const WAIT: Duration = Duration::from_secs(60);
pub const USER: &str = "ops";
pub const PASSWORD: &str = "s3cret-pw";
pub const TOKEN: &str = "console-test-token";

/// A gateway whose route `queue` runs the `counter` plugin (acks everything, counts runs in
/// kv), with the admin server on `port` (`listen` given) and both kinds of credentials.
pub async fn gateway(queue: &str, listen: &str, credentials: bool) -> Gateway {
    let auth = if credentials {
        credentials_toml(TOKEN, PASSWORD)
    } else {
        String::new()
    };
    gateway_with(queue, listen, &auth).await
}

/// `token` and `basic` lines of `[admin]`.
pub fn credentials_toml(token: &str, password: &str) -> String {
    format!("token = \"{token}\"\nbasic = {{ user = \"{USER}\", password = \"{password}\" }}\n")
}

/// [`gateway`] with `admin` as the rest of its `[admin]` table.
pub async fn gateway_with(queue: &str, listen: &str, admin: &str) -> Gateway {
    let toml = config_toml(queue, listen, admin).await;
    gateway_on(queue, listen, &toml).await
}

/// The config [`gateway_with`] runs (its exchanges declared), to change and reload.
pub async fn config_toml(queue: &str, listen: &str, auth: &str) -> String {
    let exchange = unique("in");
    let events = unique("events");
    let client = crate::support::Client::connect().await;
    client.sink(&exchange).await;
    client.sink(&events).await;
    let variables = format!("out_exchange = \"{events}\"");
    sqlite_config_head(listen)
        + auth
        + &plugin_route("counter", "counter", &variables, queue, &exchange)
        + "routing_key = \"#\"\n[routes.retry]\nmax_attempts = 3\nbackoff = [\"1s\", \"5s\"]\n"
}

/// Starts `toml` (from [`config_toml`]) and waits for its consumer and admin server.
pub async fn gateway_on(queue: &str, listen: &str, toml: &str) -> Gateway {
    let gw = Gateway::start(toml).await;
    wait_ready(queue, listen).await;
    gw
}

/// A [`gateway`] with both kinds of credentials on a fresh queue named after `prefix`, its
/// admin server on a free loopback port: the queue, the port, its address and the gateway.
pub async fn console(prefix: &str) -> (String, u16, String, Gateway) {
    let queue = unique(prefix);
    let (port, listen) = loopback();
    let gw = gateway(&queue, &listen, true).await;
    (queue, port, listen, gw)
}

/// Waits for the route's consumer and the admin server of a gateway just started.
pub async fn wait_ready(queue: &str, listen: &str) {
    crate::support::Client::connect()
        .await
        .wait_for_consumer(queue)
        .await;
    if let Some((_, port)) = listen.rsplit_once(':') {
        let port: u16 = port.parse().expect("a port");
        wait_listening("the admin server to listen", port, WAIT).await;
    }
}

/// Archives a dead letter on `route` with `reason` and `body`, message id `id`.
pub async fn dead_letter(store: &Store, route: &str, reason: &str, id: &str, body: &[u8]) -> i64 {
    let now = carteiro::common::now_ms();
    let record = NewDeadLetter {
        headers: vec![
            (":message-id".into(), id.into()),
            (":content-type".into(), "application/json".into()),
            ("x-tenant".into(), "<b>acme</b>".into()),
        ],
        body: body.to_vec(),
        first_failed_at: Some(now - 5_000),
        dead_lettered_at: now,
        ..counter_dead_letter(route, reason, 3)
    };
    store
        .dead_letter_insert(&record)
        .await
        .expect("archive a dead letter")
}

/// A console [`gateway`] (credentials set) on a queue named after `prefix`, holding `n` dead
/// letters with reasons `REASON 0..n` and message ids `ID-0..n`.
pub struct Console {
    pub gw: Gateway,
    pub queue: String,
    /// The admin server's port, on loopback.
    pub port: u16,
    /// The dead letters, oldest first.
    pub ids: Vec<i64>,
}

impl Console {
    pub async fn with_dead_letters(prefix: &str, reason: &str, id: &str, n: i64) -> Self {
        let (queue, port, _, gw) = console(prefix).await;
        let mut ids = Vec::new();
        for i in 0..n {
            let reason = format!("{reason} {i}");
            ids.push(dead_letter(&gw.store, &queue, &reason, &format!("{id}-{i}"), b"{}").await);
        }
        Self {
            gw,
            queue,
            port,
            ids,
        }
    }
}

/// How many dead letters of `route` have a reason containing `text` (replayed or not).
pub async fn count(store: &Store, route: &str, text: &str, replayed: Option<bool>) -> i64 {
    store
        .dead_letters_count(&DeadLetterFilter {
            route: Some(route.into()),
            reason_contains: Some(text.into()),
            replayed,
            ..Default::default()
        })
        .await
        .expect("count")
}

/// Waits until the counter plugin ran `n` times (kv `runs`).
pub async fn runs(store: &Store, n: i64) {
    wait_for(&format!("{n} handler runs"), WAIT, || async {
        let runs = match store.kv_get("counter", "runs").await {
            Ok(Some(e)) => String::from_utf8_lossy(&e.value).parse().unwrap_or(-1),
            _ => 0,
        };
        (runs >= n).then_some(())
    })
    .await;
}

/// A loopback address nobody listens on.
pub fn loopback() -> (u16, String) {
    let port = crate::live::free_port();
    (port, format!("127.0.0.1:{port}"))
}

/// One HTTP/1.1 request with `headers` and `body`; returns the status, the head and the body.
/// `Host` is `127.0.0.1:PORT` unless `headers` has one.
pub async fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    // `Host: 127.0.0.1:PORT` unless the caller gives one (a rebinding page's name).
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    http_exchange(port, &request, WAIT, &format!("{method} {path}")).await
}

/// `POST path` with the test token and the JSON `body`: the status, head and body.
pub async fn post_json(port: u16, path: &str, body: &str) -> (u16, String, String) {
    let bearer = format!("Bearer {TOKEN}");
    let headers = [
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
    ];
    http(port, "POST", path, &headers, body).await
}

/// `POST path` of a console form (`form` the body) with the test token: the status, head and
/// body.
pub async fn post_form(port: u16, path: &str, form: &str) -> (u16, String, String) {
    let bearer = format!("Bearer {TOKEN}");
    http(port, "POST", path, &[("authorization", &bearer)], form).await
}

/// Asserts that no background job was started (`GET /api/jobs` lists none).
pub async fn assert_no_jobs(port: u16, why: &str) {
    let (_, _, jobs) = http(port, "GET", "/api/jobs", &[], "").await;
    assert_eq!(jobs.trim(), "[]", "{why}: {jobs}");
}

/// `Authorization: Basic ...` for `user:password`.
pub fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}
