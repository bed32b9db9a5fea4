//! The console in a browser refuses to be framed (`X-Frame-Options: DENY`, CSP
//! `frame-ancestors 'none'`), still works under its CSP (its stylesheet and script are files
//! of its own), and a DNS-rebinding page (a name of another site that resolves to
//! 127.0.0.1) gets the Host refusal instead of a dead letter. Over HTTP: the headers on
//! every kind of response, and `/readyz` off loopback shows only its status line unless the
//! caller is authenticated.

use super::browser::log_in;
use super::driver::Browser;
use super::{PASSWORD, TOKEN, WAIT, console, dead_letter, gateway_with, http};
use crate::support::{unique, wait_for};

/// Frames `path` of the page's own origin (same origin: only the headers can refuse it)
/// and tells whether the console rendered inside.
const FRAME: &str = r#"
    const f = document.createElement("iframe");
    f.id = "framed";
    f.onload = () => { f.dataset.loaded = "1"; };
    f.src = arguments[0];
    document.body.appendChild(f);
"#;
const FRAMED: &str = r#"
    const f = document.getElementById("framed");
    let doc = null;
    try { doc = f.contentDocument; } catch (e) { doc = null; }
    if (doc && doc.querySelector("a.brand")) return "rendered";
    return f.dataset.loaded === "1" ? "blocked" : "loading";
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_refuses_to_render_in_a_frame() {
    let (queue, port, listen, gw) = console("console-frame").await;
    let id = dead_letter(
        &gw.store,
        &queue,
        "card declined",
        "f-1",
        br#"{"card":"4111"}"#,
    )
    .await;

    // Headers on a page, JSON, a script, a refusal.
    for (method, path, status) in [
        ("GET", "/".to_owned(), 200),
        ("GET", format!("/dead-letters/message/{id}"), 200),
        ("GET", "/api/jobs".to_owned(), 200),
        ("GET", "/console.css".to_owned(), 200),
        ("GET", "/login".to_owned(), 401),
        ("POST", "/api/dlq/purge".to_owned(), 401),
    ] {
        let (got, head, _) = http(port, method, &path, &[], "").await;
        assert_eq!(got, status, "{method} {path}");
        let head = head.to_lowercase();
        for header in [
            "x-frame-options: deny",
            "content-security-policy: default-src 'self'; frame-ancestors 'none'",
            "x-content-type-options: nosniff",
            "referrer-policy: no-referrer",
        ] {
            assert!(
                head.contains(header),
                "{method} {path} lacks {header}: {head}"
            );
        }
    }

    let browser = Browser::start().await;
    let c = &browser.client;
    log_in(c, &listen).await;
    // Its own stylesheet applies under the CSP (the header is a flex box).
    let display = c
        .execute(
            "return getComputedStyle(document.querySelector('header')).display",
            vec![],
        )
        .await
        .expect("style");
    assert_eq!(display, "flex", "the stylesheet loads under the CSP");
    c.execute(
        FRAME,
        vec![serde_json::json!(format!("/dead-letters/message/{id}"))],
    )
    .await
    .expect("frame the console");
    let outcome = wait_for("the frame to load", WAIT, || async {
        let state = c.execute(FRAMED, vec![]).await.ok()?;
        (state != "loading").then_some(state)
    })
    .await;
    assert_eq!(outcome, "blocked", "the console rendered inside a frame");

    // A rebinding page's name: the refusal, not the dead letter.
    c.goto(&format!(
        "http://rebind.evil.example:{port}/dead-letters/message/{id}"
    ))
    .await
    .expect("open the rebinding name");
    let text = c.source().await.expect("page");
    assert!(text.contains("does not answer to the host name"), "{text}");
    assert!(!text.contains("4111"), "{text}");
    browser.close().await;
    gw.stop().await;

    // Off loopback, /readyz tells a stranger only whether the gateway is ready.
    let queue = unique("console-readyz");
    let port = crate::live::free_port();
    let gw = gateway_with(
        &queue,
        &format!("0.0.0.0:{port}"),
        &super::credentials_toml(TOKEN, PASSWORD),
    )
    .await;
    let (status, _, body) = http(port, "GET", "/readyz", &[], "").await;
    assert_eq!(status, 200);
    assert_eq!(body, "ready\n", "no detail for an unauthenticated probe");
    let bearer = format!("Bearer {TOKEN}");
    let (status, _, body) = http(port, "GET", "/readyz", &[("authorization", &bearer)], "").await;
    assert_eq!(status, 200);
    assert!(body.contains("plugin counter: version"), "{body}");
    gw.stop().await;
}
