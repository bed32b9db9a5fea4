//! `carteiro dlq replay --shadow NEW.wasm` and `--only-acked-by NEW.wasm` over dead letters a
//! buggy version produced, as an operator runs them.

use crate::resilience::{Running, carteiro, queue_depth};
use crate::support::{
    Client, Gateway, dead_letter_route, dead_letters, json_props, plugin, unique, wait_for,
};
use carteiro::store::{CommitRequest, KvWrite, Store};
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

/// Everything in the store a shadow run could touch, as comparable text.
async fn snapshot(db: &Path) -> Vec<String> {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open the SQLite file");
    let mut out = Vec::new();
    for sql in [
        "SELECT 'kv|' || namespace || '|' || key || '|' || hex(value) || '|' || version FROM kv",
        "SELECT 'inbox|' || route || '|' || key FROM inbox",
        "SELECT 'outbox|' || id || '|' || event_id FROM outbox",
        "SELECT 'dead|' || id || '|' || coalesce(replayed_at, '-') || '|' || replay_count FROM dead_letters",
    ] {
        let rows: Vec<(String,)> = sqlx::query_as(sql)
            .fetch_all(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        out.extend(rows.into_iter().map(|(r,)| r));
    }
    pool.close().await;
    out.sort();
    out
}

async fn dlq(config: &Path, args: &[&str]) -> String {
    let mut cmd = carteiro();
    cmd.arg("dlq").arg("-c").arg(config).args(args);
    let finished = Running::spawn(cmd).finish(WAIT).await;
    eprintln!(
        "carteiro dlq {args:?} ->\n{}{}",
        finished.stdout, finished.stderr
    );
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);
    finished.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_replay_reports_exactly_what_the_fixed_version_acks_and_changes_nothing() {
    const OK: usize = 12;
    const REMEMBER: usize = 5;
    const RETRY: usize = 3;
    let client = Client::connect().await;
    let (queue, exchange) = (unique("shadow"), unique("in"));
    // The buggy version traps on everything; a trap dead-letters at once.
    let gw = Gateway::start(&dead_letter_route(&queue, "fixture-trap", &exchange)).await;
    client.wait_for_consumer(&queue).await;
    let mut bodies = Vec::new();
    for i in 0..OK {
        bodies.push((format!("ok-{i}"), "fine"));
    }
    for i in 0..REMEMBER {
        bodies.push((format!("remember-{i}"), "remember"));
    }
    for i in 0..RETRY {
        bodies.push((format!("retry-{i}"), "retry-until-3"));
    }
    for (id, body) in &bodies {
        client
            .publish(&exchange, "k", json_props(id), body.as_bytes())
            .await;
    }
    let total = bodies.len();
    dead_letters(&gw.store, &queue, total).await;
    // Real kv the fixed version's writes would overwrite: it must stay as it is.
    let seeded = CommitRequest {
        route: "seed".into(),
        inbox_key: unique("seed"),
        namespace: "fixture-trap".into(),
        reads: Vec::new(),
        writes: vec![KvWrite {
            key: "done/ok-0".into(),
            value: Some(b"before".to_vec()),
        }],
        outbox: Vec::new(),
    };
    gw.store.commit_batch(&[seeded]).await.expect("seed kv");
    let dir = gw.stop().await;
    let config = dir.path().join("carteiro.toml");
    let db = dir.path().join("carteiro.db");
    let fixed = plugin("fixture-mixed");
    let fixed = fixed.display().to_string();

    let before = snapshot(&db).await;
    assert_eq!(
        before.iter().filter(|r| r.starts_with("dead|")).count(),
        total
    );
    let queues = [queue.clone(), format!("{queue}.dlq")];
    let mut depths = Vec::new();
    for q in &queues {
        depths.push(queue_depth(&client, q).await);
    }
    assert_eq!(depths, vec![0, 0]);

    // The shadow, as JSON: one line per dead letter, then the summary.
    let out = dlq(
        &config,
        &["replay", "--route", &queue, "--shadow", &fixed, "--json"],
    )
    .await;
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert_eq!(lines.len(), total + 1, "{out}");
    let mut now_acked = Vec::new();
    for line in &lines[..total] {
        let id = line["message_id"].as_str().expect("message id").to_owned();
        assert_eq!(line["then"]["verdict"], "dead-letter");
        assert!(
            line["then"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("plugin trapped")),
            "{line}"
        );
        assert_eq!(
            line["then"]["sha256"].as_str().map(str::len),
            Some(64),
            "{line}"
        );
        let verdict = line["now"]["verdict"].as_str().expect("verdict");
        match id.split('-').next() {
            Some("ok") => {
                assert_eq!(verdict, "ack", "{line}");
                assert_eq!(
                    line["kv_writes"],
                    serde_json::json!([{"key": format!("done/{id}"), "value": "1"}]),
                    "{line}"
                );
                now_acked.push(id);
            }
            Some("remember") => {
                assert_eq!(verdict, "dead-letter", "{line}");
                assert_eq!(line["now"]["reason"], "runs 1 1");
                assert_eq!(line["kv_writes"], serde_json::json!([]));
            }
            Some("retry") => {
                assert_eq!(verdict, "retry", "{line}");
                assert_eq!(line["now"]["reason"], "attempt 1 of 3");
            }
            _ => panic!("unexpected message {id}"),
        }
    }
    now_acked.sort();
    let mut expected: Vec<String> = (0..OK).map(|i| format!("ok-{i}")).collect();
    expected.sort();
    assert_eq!(
        now_acked, expected,
        "exactly the messages the fixed version acks"
    );
    let summary = &lines[total]["summary"];
    assert_eq!(summary["total"], total);
    assert_eq!(summary["dead_letter_to_ack"], OK);
    assert_eq!(summary["still_dead_letter"], REMEMBER);
    assert_eq!(summary["dead_letter_to_retry"], RETRY);
    assert_eq!(summary["dead_letter_to_failure"], 0);

    // The human report says the same.
    let out = dlq(&config, &["replay", "--route", &queue, "--shadow", &fixed]).await;
    assert!(
        out.contains(&format!(
            "dead-letter → ack: {OK}, still dead-letter: {REMEMBER}, dead-letter → retry: {RETRY}"
        )),
        "{out}"
    );
    assert!(out.contains("kv set    \"done/ok-3\" = \"1\""), "{out}");

    // Nothing changed: not in the store, not in the broker.
    assert_eq!(snapshot(&db).await, before, "the store is untouched");
    for (q, depth) in queues.iter().zip(&depths) {
        assert_eq!(queue_depth(&client, q).await, *depth, "{q} untouched");
    }

    // Then for real: only the messages the shadow acks go back to the queue.
    let out = dlq(
        &config,
        &["replay", "--route", &queue, "--only-acked-by", &fixed],
    )
    .await;
    assert!(out.contains(&format!("{OK} replayed")), "{out}");
    let replayed = wait_for("the replays in the work queue", WAIT, || async {
        let depth = queue_depth(&client, &queue).await as usize;
        (depth == OK).then_some(depth)
    })
    .await;
    assert_eq!(replayed, OK);
    let mut in_queue: Vec<String> = client
        .drain(&queue)
        .await
        .iter()
        .filter_map(|m| m.properties.message_id().as_ref().map(|s| s.to_string()))
        .collect();
    in_queue.sort();
    assert_eq!(in_queue, expected);
    let store = Store::connect(&format!("sqlite://{}", db.display()), 2)
        .await
        .expect("store");
    let rows = store
        .dead_letters_oldest_first(&Default::default(), 1_000)
        .await
        .expect("dead letters");
    for d in &rows {
        let id = d
            .letter
            .headers
            .iter()
            .find(|(k, _)| k == ":message-id")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        assert_eq!(
            d.replay_count,
            i64::from(id.starts_with("ok-")),
            "{id} replayed iff the shadow acks it"
        );
    }
    let kv = store
        .kv_get("fixture-trap", "done/ok-0")
        .await
        .expect("kv")
        .expect("seeded");
    assert_eq!(kv.value, b"before", "the shadow never wrote the real kv");
}
