//! Who may do what on the admin server, over plain HTTP.

use super::{Console, PASSWORD, TOKEN, USER, basic, count, gateway, http, loopback, runs};
use crate::support::{unique, wait_for, wait_listening};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_auth_rules() {
    let Console {
        gw, queue, port, ..
    } = Console::with_dead_letters("console-auth", "bad input", "a", 3).await;
    let bearer = format!("Bearer {TOKEN}");
    let good_basic = basic(USER, PASSWORD);
    let bad_basic = basic(USER, "wrong");
    let replay = format!(r#"{{"route":"{queue}","reason":"bad input <n>","rate":100}}"#);
    let json = ("content-type", "application/json");

    // On loopback, pages are open; state changes are not.
    let (status, _, page) = http(port, "GET", "/dead-letters", &[], "").await;
    assert_eq!(status, 200);
    assert!(page.contains("bad input &lt;n&gt;"), "{page}");
    // The group's actions show, disabled, with why and a way to log in; with credentials
    // they are on.
    let group = page
        .split("href=\"")
        .find(|s| s.starts_with("/dead-letters/group?"))
        .and_then(|s| s.split('"').next())
        .expect("a link to the group")
        .replace("&amp;", "&");
    let (_, _, anonymous) = http(port, "GET", &group, &[], "").await;
    assert!(
        anonymous.contains("id=\"actions-off\"") && anonymous.contains("href=\"/login\""),
        "{anonymous}"
    );
    assert!(anonymous.contains("id=\"replay-group-submit\" type=\"submit\" disabled"));
    let (_, _, known) = http(port, "GET", &group, &[("authorization", &good_basic)], "").await;
    assert!(
        !known.contains("actions-off") && !known.contains("disabled"),
        "{known}"
    );
    let (status, head, _) = http(port, "GET", "/login", &[], "").await;
    assert_eq!(status, 401, "/login always asks");
    assert!(
        head.to_lowercase().contains("www-authenticate: basic"),
        "{head}"
    );
    let (status, head, _) =
        http(port, "GET", "/login", &[("authorization", &good_basic)], "").await;
    assert_eq!(status, 303, "{head}");
    for (method, path) in [
        ("POST", "/admin/reload"),
        ("POST", "/admin/canary/counter/abort"),
        ("POST", "/api/dlq/replay"),
        ("POST", "/api/dlq/purge"),
        ("POST", "/dead-letters/replay"),
        ("POST", "/dead-letters/purge"),
        ("POST", "/jobs/1/stop"),
    ] {
        let (status, head, body) = http(port, method, path, &[json], &replay).await;
        assert_eq!(status, 401, "{method} {path} without credentials: {body}");
        assert!(body.contains("needs credentials"), "{body}");
        assert!(
            !head.to_lowercase().contains("www-authenticate"),
            "no login dialog for a refused post: {head}"
        );
        let (status, _, _) = http(
            port,
            method,
            path,
            &[json, ("authorization", "Bearer nope")],
            &replay,
        )
        .await;
        assert_eq!(status, 401, "{method} {path} with a wrong token");
        let (status, _, _) = http(
            port,
            method,
            path,
            &[json, ("authorization", &bad_basic)],
            &replay,
        )
        .await;
        assert_eq!(status, 401, "{method} {path} with a wrong password");
    }
    assert_eq!(count(&gw.store, &queue, "bad input", Some(true)).await, 0);

    // Basic auth from another site is refused (CSRF); from the console's own pages it works.
    let form = format!("route={queue}&reason=bad+input+%3Cn%3E&scope=group&rate=100");
    let (status, _, body) = http(
        port,
        "POST",
        "/dead-letters/replay",
        &[
            ("authorization", &good_basic),
            ("origin", "http://evil.example"),
        ],
        &form,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, _, _) = http(
        port,
        "POST",
        "/dead-letters/replay",
        &[
            ("authorization", &good_basic),
            ("sec-fetch-site", "cross-site"),
        ],
        &form,
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(count(&gw.store, &queue, "bad input", Some(true)).await, 0);

    // The bearer token starts the replay (a job), which finishes and marks all three.
    let (status, head, body) = http(
        port,
        "POST",
        "/api/dlq/replay",
        &[json, ("authorization", &bearer)],
        &replay,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let job: serde_json::Value = serde_json::from_str(&body).expect("job JSON");
    let location = format!("/api/jobs/{}", job["id"]);
    assert!(head.contains(&location), "{head}");
    let done = wait_for("the replay job to finish", super::WAIT, || async {
        let (_, _, body) = http(port, "GET", &location, &[], "").await;
        let job: serde_json::Value = serde_json::from_str(&body).ok()?;
        (job["finished"] == true).then_some(job)
    })
    .await;
    assert_eq!(
        (done["planned"].as_u64(), done["done"].as_u64()),
        (Some(3), Some(3)),
        "{done}"
    );
    assert_eq!(done["remaining"], 0);
    runs(&gw.store, 3).await;
    assert_eq!(count(&gw.store, &queue, "bad input", Some(true)).await, 3);

    // Purge by JSON needs the right count.
    let purge = |n: i64| format!(r#"{{"route":"{queue}","reason":"bad input <n>","confirm":{n}}}"#);
    let (status, _, body) = http(
        port,
        "POST",
        "/api/dlq/purge",
        &[json, ("authorization", &bearer)],
        &purge(2),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("does not match"), "{body}");
    assert_eq!(count(&gw.store, &queue, "bad input", None).await, 3);
    let (status, _, body) = http(
        port,
        "POST",
        "/api/dlq/purge",
        &[
            json,
            ("authorization", &good_basic),
            ("origin", &format!("http://127.0.0.1:{port}")),
        ],
        &purge(3),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""purged":3"#), "{body}");
    assert_eq!(count(&gw.store, &queue, "bad input", None).await, 0);
    gw.stop().await;

    // Without credentials configured, no state change is possible at all.
    let queue = unique("console-nocreds");
    let (port, listen) = loopback();
    let gw = gateway(&queue, &listen, false).await;
    let (status, _, body) = http(
        port,
        "POST",
        "/admin/reload",
        &[("authorization", "Bearer x")],
        "",
    )
    .await;
    assert_eq!(status, 401);
    assert!(body.contains("no admin credentials"), "{body}");
    let (status, _, _) = http(port, "GET", "/", &[], "").await;
    assert_eq!(status, 200);
    gw.stop().await;

    // Off loopback every page needs credentials (the probes excepted).
    let queue = unique("console-open");
    let port = crate::live::free_port();
    let gw = gateway(&queue, &format!("0.0.0.0:{port}"), true).await;
    wait_listening("the admin server", port, super::WAIT).await;
    for path in ["/", "/dead-letters", "/api/routes", "/dlq", "/metrics"] {
        let (status, _, body) = http(port, "GET", path, &[], "").await;
        assert_eq!(status, 401, "GET {path} off loopback: {body}");
        assert!(body.contains("needs credentials"), "{body}");
        let (status, _, _) = http(port, "GET", path, &[("authorization", &bearer)], "").await;
        assert_eq!(status, 200, "GET {path} with the token");
    }
    for path in ["/healthz", "/readyz"] {
        let (status, _, _) = http(port, "GET", path, &[], "").await;
        assert_eq!(status, 200, "{path} stays open for probes");
    }
    gw.stop().await;
}
