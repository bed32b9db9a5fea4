//! Loopback is not a trust boundary: a page of another site whose name resolves to
//! 127.0.0.1 (DNS rebinding) sends its own name in `Host`, and is refused before anything
//! is read; `[admin] allowed_hosts` adds names, `require_auth = "all"` closes the reads.

use super::{TOKEN, WAIT, console, gateway_with, http, loopback};
use crate::support::{counter_dead_letter, unique};
use carteiro::store::NewDeadLetter;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_refuses_foreign_hosts() {
    let (queue, port, _, gw) = console("console-hosts").await;
    let leaked = NewDeadLetter {
        headers: vec![("authorization".into(), "Bearer leaked-upstream".into())],
        body: br#"{"card":"4111-secret"}"#.to_vec(),
        ..counter_dead_letter(&queue, "card declined", 1)
    };
    let id = gw.store.dead_letter_insert(&leaked).await.expect("archive");
    let bearer = format!("Bearer {TOKEN}");
    let message = format!("/dead-letters/message/{id}");
    let json = format!("/dlq/{id}");
    let rebinding = format!("rebind.evil.example:{port}");

    for path in [
        message.as_str(),
        json.as_str(),
        "/",
        "/api/jobs",
        "/healthz",
        "/readyz",
    ] {
        for auth in [None, Some(bearer.as_str())] {
            let mut headers = vec![("host", rebinding.as_str())];
            if let Some(auth) = auth {
                headers.push(("authorization", auth));
            }
            let (status, _, body) =
                tokio::time::timeout(WAIT, http(port, "GET", path, &headers, ""))
                    .await
                    .expect("bounded");
            assert_eq!(
                status, 403,
                "GET {path} for another host (auth {auth:?}): {body}"
            );
            assert!(body.contains("allowed_hosts"), "{body}");
            assert!(
                !body.contains("leaked-upstream") && !body.contains("4111"),
                "{body}"
            );
        }
    }
    let (status, _, _) = http(
        port,
        "POST",
        "/api/dlq/purge",
        &[("host", &rebinding), ("authorization", &bearer)],
        &format!(r#"{{"route":"{queue}","confirm":1}}"#),
    )
    .await;
    assert_eq!(status, 403, "a state change for another host");
    assert_eq!(
        gw.store
            .dead_letter_get(id)
            .await
            .expect("get")
            .map(|d| d.id),
        Some(id)
    );
    // The gateway's own names still work.
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let (status, _, body) = http(port, "GET", &message, &[("host", &host)], "").await;
        assert_eq!(status, 200, "Host {host}: {body}");
        assert!(body.contains("4111-secret"), "{body}");
    }
    gw.stop().await;

    // A name of the deployment's own, and every read behind credentials.
    let queue = unique("console-hosts-all");
    let (port, listen) = loopback();
    let admin = format!(
        "{}allowed_hosts = [\"carteiro.internal\"]\nrequire_auth = \"all\"\n",
        super::credentials_toml(TOKEN, super::PASSWORD)
    );
    let gw = gateway_with(&queue, &listen, &admin).await;
    let named = format!("carteiro.internal:{port}");
    let (status, _, body) = http(port, "GET", "/dead-letters", &[("host", &named)], "").await;
    assert_eq!(status, 401, "require_auth = all: {body}");
    assert!(body.contains("needs credentials"), "{body}");
    let (status, _, _) = http(
        port,
        "GET",
        "/dead-letters",
        &[("host", &named), ("authorization", &bearer)],
        "",
    )
    .await;
    assert_eq!(status, 200);
    for probe in ["/healthz", "/readyz"] {
        let (status, _, _) = http(port, "GET", probe, &[("host", &named)], "").await;
        assert_eq!(status, 200, "{probe} stays open for probes");
    }
    let (status, _, _) = http(port, "GET", "/", &[("host", &rebinding)], "").await;
    assert_eq!(status, 403);
    gw.stop().await;
}
