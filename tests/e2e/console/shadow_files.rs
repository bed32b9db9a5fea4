//! A console shadow run loads only a `.wasm` under a plugin folder of the config, optionally
//! pinned by sha256: `/etc/passwd`, a `../` path, a symlink out of the folder, a file beside
//! the config are refused, and no refusal quotes a byte of the file.

use super::{
    TOKEN, WAIT, assert_no_jobs, config_toml, credentials_toml, dead_letter, http, loopback,
    post_form, post_json, wait_ready,
};
use crate::support::{Gateway, plugin, unique, wait_for};
use std::sync::Arc;

const SECRET: &str = "TOPSECRET-do-not-show";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shadow_runs_only_plugin_folder_files() {
    let queue = unique("console-shadow-files");
    let (port, listen) = loopback();
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).expect("plugins folder");
    let counter = std::fs::read(plugin("counter")).expect("counter.wasm");
    std::fs::write(plugins.join("counter.wasm"), &counter).expect("copy");
    std::fs::write(plugins.join("counter-v2.wasm"), &counter).expect("copy");
    std::fs::write(plugins.join("notes.txt"), SECRET).expect("a text file");
    std::fs::write(dir.path().join("secret.wasm"), SECRET).expect("a file outside");
    std::os::unix::fs::symlink(dir.path().join("secret.wasm"), plugins.join("link.wasm"))
        .expect("symlink out");
    let toml = config_toml(&queue, &listen, &credentials_toml(TOKEN, super::PASSWORD))
        .await
        .replace(
            &plugin("counter").display().to_string(),
            "{dir}/plugins/counter.wasm",
        );
    let gw = Gateway::start_in(dir, &toml, Arc::default()).await;
    wait_ready(&queue, &listen).await;
    dead_letter(&gw.store, &queue, "card declined", "s-1", b"{}").await;
    let shadow = |path: &str, sha256: Option<&str>| {
        let mut body = serde_json::json!({"route": queue, "reason": "card declined", "path": path});
        if let Some(pin) = sha256 {
            body["sha256"] = serde_json::json!(pin);
        }
        body.to_string()
    };
    let outside = gw.dir.path().join("secret.wasm").display().to_string();
    for (path, status, words) in [
        ("/etc/passwd", 403, "not in a plugin folder"),
        (
            "plugins/../../../../../../../../etc/passwd",
            403,
            "not in a plugin folder",
        ),
        (outside.as_str(), 403, "not in a plugin folder"),
        ("secret.wasm", 403, "not in a plugin folder"),
        ("plugins/link.wasm", 403, "not in a plugin folder"),
        ("plugins/notes.txt", 400, "not a WebAssembly component"),
        ("plugins/missing.wasm", 400, "no plugin file"),
    ] {
        let (got, _, body) = post_json(port, "/api/dlq/shadow", &shadow(path, None)).await;
        assert_eq!(got, status, "{path}: {body}");
        assert!(body.contains(words), "{path}: {body}");
        assert!(
            !body.contains(SECRET) && !body.contains("root:"),
            "{path}: {body}"
        );
    }
    let form = format!("route={queue}&reason=card+declined&path=%2Fetc%2Fpasswd");
    let (got, _, body) = post_form(port, "/dead-letters/shadow", &form).await;
    assert_eq!(got, 403, "the form too: {body}");
    assert_no_jobs(port, "nothing ran").await;

    // Pinned: the wrong digest is refused, the right one runs.
    let digest = crate::live::sha256_of(&gw.dir.path().join("plugins/counter-v2.wasm"));
    let pinned = |sha256: &str| shadow("plugins/counter-v2.wasm", Some(sha256));
    let (got, _, body) = post_json(port, "/api/dlq/shadow", &pinned(&"0".repeat(64))).await;
    assert_eq!(got, 400, "{body}");
    assert!(body.contains(&format!("has sha256 {digest}")), "{body}");
    let (got, _, body) = post_json(port, "/api/dlq/shadow", &pinned(&digest)).await;
    assert_eq!(got, 202, "{body}");
    let job: serde_json::Value = serde_json::from_str(&body).expect("job");
    let location = format!("/api/jobs/{}", job["id"]);
    let done = wait_for("the shadow run to finish", WAIT, || async {
        let (_, _, body) = http(port, "GET", &location, &[], "").await;
        let job: serde_json::Value = serde_json::from_str(&body).ok()?;
        (job["finished"] == true).then_some(job)
    })
    .await;
    assert_eq!(done["error"], serde_json::Value::Null, "{done}");
    assert_eq!(done["summary"]["summary"]["sha256"], digest, "{done}");
    assert_eq!(
        done["summary"]["summary"]["dead_letter_to_ack"], 1,
        "{done}"
    );
    gw.stop().await;
}
