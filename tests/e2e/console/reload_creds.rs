//! Credentials a reload changes apply at once: after rotating `[admin] token` and `basic`
//! and `POST /admin/reload`, the old ones are refused and the report says what changed.
//! A rotated broker password cannot be applied by a reload: the reload is refused and names
//! the key.

use super::{USER, basic, config_toml, credentials_toml, gateway_on, http, loopback};
use crate::support::unique;

/// `POST path` without a body, with `authorization`: the status and the body.
async fn post_as(port: u16, path: &str, authorization: &str) -> (u16, String) {
    let (status, _, body) = http(port, "POST", path, &[("authorization", authorization)], "").await;
    (status, body)
}

/// Status of a state change that needs credentials (an unknown job: 404 once through).
async fn stop_job(port: u16, authorization: &str) -> u16 {
    post_as(port, "/api/jobs/999/stop", authorization).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_reload_applies_rotated_credentials() {
    let queue = unique("console-rotate");
    let (port, listen) = loopback();
    let toml = config_toml(&queue, &listen, &credentials_toml("old-token", "old-pw")).await;
    let gw = gateway_on(&queue, &listen, &toml).await;
    let path = gw.dir.path().join("carteiro.toml");
    let dir = gw.dir.path().display().to_string();
    let (old_bearer, new_bearer) = ("Bearer old-token", "Bearer new-token");
    let (old_basic, new_basic) = (basic(USER, "old-pw"), basic(USER, "new-pw"));
    assert_eq!(stop_job(port, old_bearer).await, 404);
    assert_eq!(stop_job(port, new_bearer).await, 401);

    let rotated = toml
        .replace("old-token", "new-token")
        .replace("old-pw", "new-pw")
        .replace("{dir}", &dir);
    std::fs::write(&path, &rotated).expect("rewrite the config");
    let (status, body) = post_as(port, "/admin/reload", old_bearer).await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).expect("report");
    let changes = report["changes"].to_string();
    assert!(changes.contains("[admin] token: changed"), "{body}");
    assert!(changes.contains("[admin] basic: changed"), "{body}");
    assert!(
        !body.contains("new-token") && !body.contains("new-pw"),
        "no secret in the report: {body}"
    );
    assert_eq!(stop_job(port, old_bearer).await, 401, "old token refused");
    assert_eq!(
        stop_job(port, &old_basic).await,
        401,
        "old password refused"
    );
    assert_eq!(stop_job(port, new_bearer).await, 404, "new token accepted");
    assert_eq!(
        stop_job(port, &new_basic).await,
        404,
        "new password accepted"
    );

    // A new broker password: refused, naming the key; the running config stays.
    let amqp = crate::support::amqp_url();
    let other = amqp.replacen("guest:guest@", "guest:rotated@", 1);
    assert_ne!(amqp, other, "the test broker URL carries guest:guest");
    std::fs::write(&path, rotated.replace(&amqp, &other)).expect("rewrite the config");
    let (status, body) = post_as(port, "/admin/reload", new_bearer).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("[broker] url changed and carries credentials"),
        "{body}"
    );
    assert!(body.contains("restart"), "{body}");
    assert!(
        !body.contains("rotated"),
        "no password in the refusal: {body}"
    );
    assert_eq!(stop_job(port, new_bearer).await, 404);
    gw.stop().await;
}
