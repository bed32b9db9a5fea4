//! A live shadow (`[plugins.NAME] shadow = "new.wasm"`) on real traffic: a known mix of
//! messages on which `fixture-mixed-v2` agrees or disagrees with the live `fixture-mixed`.

use super::{free_port, http, sample, sha256_of};
use crate::live::ADMIN_TOKEN;
use crate::resilience::{Running, carteiro};
use crate::support::{
    Client, Gateway, assert_contains_all, dead_letter_route, dead_letters, json_props, plugin,
    unique, wait_for,
};
use carteiro::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_shadow_counts_agreements_and_disagreements_on_a_known_mix() {
    // body, how many, what the shadow comparison must say
    let mix = [
        ("fine", 10, "agree"),
        ("trap", 2, "agree"),
        ("remember", 4, "verdict"),
        ("fine-v2", 3, "effects"),
        ("boom", 2, "shadow-failure"),
    ];
    let total: usize = mix.iter().map(|m| m.1).sum();
    let (queue, exchange) = (unique("liveshadow"), unique("in"));
    let shadow = plugin("fixture-mixed-v2");
    let version = sha256_of(&shadow)[..12].to_owned();
    let port = free_port();
    let toml = dead_letter_route(&queue, "fixture-mixed", &exchange)
        .replace(
            "timeout = \"2s\"",
            &format!(
                "timeout = \"2s\"\nshadow = \"{}\"\nshadow_max_in_flight = 64",
                shadow.display()
            ),
        )
        .replace(
            "listen = \"\"",
            &format!("listen = \"127.0.0.1:{port}\"\ntoken = \"{ADMIN_TOKEN}\""),
        );
    let client = Client::connect().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Gateway::start_in(dir, &toml, Arc::new(Metrics::default())).await;
    client.wait_for_consumer(&queue).await;
    for (body, n, _) in mix {
        for i in 0..n {
            client
                .publish(
                    &exchange,
                    "k",
                    json_props(&format!("{body}-{i}")),
                    body.as_bytes(),
                )
                .await;
        }
    }

    let line = |result: &str| {
        format!(
            "carteiro_shadow_runs_total{{route=\"{queue}\",version=\"{version}\",result=\"{result}\"}}"
        )
    };
    let kinds = ["agree", "verdict", "effects", "shadow-failure", "skipped"];
    let metrics = wait_for("every delivery shadowed", WAIT, || async {
        let (_, m) = http(port, "GET", "/metrics").await;
        let n: f64 = kinds.iter().map(|k| sample(&m, &line(k))).sum();
        (n >= total as f64).then_some(m)
    })
    .await;
    for kind in kinds {
        let want: usize = mix.iter().filter(|m| m.2 == kind).map(|m| m.1).sum();
        assert_eq!(
            sample(&metrics, &line(kind)),
            want as f64,
            "{kind}:\n{metrics}"
        );
    }

    // The live deliveries were decided by the live version alone; the shadow wrote nothing.
    dead_letters(&gw.store, &queue, 6).await;
    let kv = |key: String| {
        let store = gw.store.clone();
        async move {
            store
                .kv_get("fixture-mixed", &key)
                .await
                .expect("kv")
                .map(|e| String::from_utf8_lossy(&e.value).into_owned())
        }
    };
    for i in 0..10 {
        let id = format!("fine-{i}");
        wait_for(&format!("{id} committed"), WAIT, || {
            kv(format!("done/{id}"))
        })
        .await;
    }
    for i in 0..3 {
        assert_eq!(
            kv(format!("done/fine-v2-{i}")).await.as_deref(),
            Some("1"),
            "live's value"
        );
    }
    for i in 0..2 {
        assert_eq!(
            kv(format!("done/boom-{i}")).await.as_deref(),
            Some("1"),
            "live acked"
        );
    }
    for i in 0..4 {
        assert_eq!(
            kv(format!("done/remember-{i}")).await,
            None,
            "the shadow's ack is not committed"
        );
    }

    // The kept disagreements, over HTTP and as `carteiro shadow report` prints them.
    let (status, body) = http(port, "GET", "/shadow").await;
    assert_eq!(status, 200);
    let report: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let kept = report["disagreements"].as_array().expect("disagreements");
    assert_eq!(kept.len(), 9, "{body}");
    for d in kept {
        let id = d["message_id"].as_str().unwrap_or_default();
        let body = id.rsplit_once('-').map_or("", |(b, _)| b);
        let want = mix.iter().find(|m| m.0 == body).map(|m| m.2);
        assert_eq!(d["kind"].as_str(), want, "{d}");
    }
    assert_eq!(report["counts"][&queue]["agree"], 12, "{body}");
    let config = gw.dir.path().join("carteiro.toml");
    let mut cmd = carteiro();
    cmd.args(["shadow", "report", "-c"]).arg(&config);
    let out = Running::spawn(cmd).finish(WAIT).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_contains_all(
        &out.stdout,
        &[
            "agree 12, effects 3, shadow-failure 2, verdict 4",
            "newest 9 disagreements",
            "live:   dead-letter: runs 1 1",
        ],
    );
    gw.stop().await;
}
