//! `carteiro dlq replay` and `dlq purge` as an operator runs them, against the real broker
//! and store: a replay by reason takes every matching dead letter once and leaves the rest;
//! a re-run replays nothing; a replay killed half-way and re-run replays each message once;
//! `--since`/`--older-than` purge exactly what they say; a replay after the inbox record was
//! purged runs the handler again.

use crate::support::{
    Client, Gateway, archived, counter_config, counter_dead_letter, dead_letter_route, pg_database,
    unconsumed_route, unique, wait_for, with_store,
};
use carteiro::common::labels::Outcome;
use carteiro::metrics::Metrics;
use carteiro::store::{DeadLetterFilter, NewDeadLetter, Store};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(120);
const TRAP_REASON: &str = "plugin trapped";

/// Runs `carteiro ARGS` to completion (bounded); returns its exit code and stdout.
async fn cli(args: Vec<String>) -> (i32, String) {
    let mut child = spawn_cli(&args);
    let deadline = Instant::now() + WAIT;
    loop {
        match child.try_wait().expect("wait for carteiro") {
            Some(status) => {
                let out = child.wait_with_output().expect("carteiro output");
                let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                eprintln!("carteiro {args:?} ->\n{stdout}{stderr}");
                return (status.code().unwrap_or(-1), stdout);
            }
            None if Instant::now() > deadline => {
                let _ = child.kill();
                panic!("carteiro {args:?} did not finish within {WAIT:?}");
            }
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn spawn_cli(args: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_carteiro"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn carteiro")
}

/// `carteiro dlq -c CONFIG REST...`
fn args(config: &Path, rest: &[&str]) -> Vec<String> {
    let mut out = vec![
        "dlq".to_owned(),
        "-c".to_owned(),
        config.display().to_string(),
    ];
    out.extend(rest.iter().map(|s| (*s).to_owned()));
    out
}

async fn count(store: &Store, filter: DeadLetterFilter) -> i64 {
    store.dead_letters_count(&filter).await.expect("count")
}

async fn kv_number(store: &Store, key: &str) -> i64 {
    match store.kv_get("counter", key).await {
        Ok(Some(entry)) => String::from_utf8_lossy(&entry.value).parse().unwrap_or(-1),
        _ => 0,
    }
}

/// A route whose plugin traps on `trap` and dead-letters `remember` (no retries), then,
/// once `traps` + `others` dead letters are archived, the same route on the `counter`
/// plugin: the bug is fixed, the dead letters can be replayed.
struct Fixed {
    gw: Gateway,
    queue: String,
    config: std::path::PathBuf,
    metrics: Arc<Metrics>,
}

async fn dead_letters_then_fix(prefix: &str, traps: usize, others: usize, pg: bool) -> Fixed {
    let client = Client::connect().await;
    let (queue, exchange, events) = (unique(prefix), unique("in"), unique("events"));
    client.sink(&exchange).await;
    client.sink(&events).await;
    let store_url = if pg { Some(pg_database().await) } else { None };
    let on = |toml: String| match &store_url {
        Some(url) => with_store(&toml, url),
        None => toml,
    };
    let broken = on(dead_letter_route(&queue, "fixture-mixed", &exchange));
    let gw = Gateway::start(&broken).await;
    client.wait_for_consumer(&queue).await;
    client
        .publish_numbered(&exchange, "t", traps, b"trap")
        .await;
    client
        .publish_numbered(&exchange, "r", others, b"remember")
        .await;
    let all = DeadLetterFilter {
        route: Some(queue.clone()),
        ..Default::default()
    };
    let total = (traps + others) as i64;
    wait_for("every dead letter archived", WAIT, || async {
        (count(&gw.store, all.clone()).await >= total).then_some(())
    })
    .await;
    let dir = gw.stop().await;

    let fixed = on(counter_config(&queue, &exchange, &events));
    let metrics = Arc::new(Metrics::default());
    let gw = Gateway::start_in(dir, &fixed, metrics.clone()).await;
    client.wait_for_consumer(&queue).await;
    let config = gw.dir.path().join("carteiro.toml");
    assert_eq!(count(&gw.store, all).await, total);
    Fixed {
        gw,
        queue,
        config,
        metrics,
    }
}

impl Fixed {
    fn reason(&self, reason: &str, replayed: Option<bool>) -> DeadLetterFilter {
        DeadLetterFilter {
            route: Some(self.queue.clone()),
            reason_contains: Some(reason.into()),
            replayed,
            ..Default::default()
        }
    }

    /// Waits until the counter plugin ran `n` times, then checks it stays there and that
    /// each of the messages `t-0..t-n` had its effects exactly once.
    async fn effects_exactly_once(&self, prefix: &str, n: i64) {
        wait_for(&format!("{n} handler runs"), WAIT, || async {
            (kv_number(&self.gw.store, "runs").await >= n).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(kv_number(&self.gw.store, "runs").await, n, "no extra runs");
        for i in 0..n {
            let seen = kv_number(&self.gw.store, &format!("seen/{prefix}-{i}")).await;
            assert_eq!(seen, 1, "effects of {prefix}-{i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_by_reason_takes_all_340_once_and_a_rerun_replays_nothing() {
    let f = dead_letters_then_fix("replay340", 340, 20, false).await;
    let store = &f.gw.store;
    assert_eq!(count(store, f.reason(TRAP_REASON, None)).await, 340);
    let route = f.queue.as_str();

    let (code, out) = cli(args(
        &f.config,
        &[
            "replay",
            "--route",
            route,
            "--reason",
            TRAP_REASON,
            "--dry-run",
        ],
    ))
    .await;
    assert_eq!(code, 0);
    assert!(
        out.contains("would replay 340 of 340 matching dead letters"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("340 ") && l.contains(TRAP_REASON)),
        "the group line: {out}"
    );
    assert_eq!(count(store, f.reason("", Some(true))).await, 0, "dry run");

    let (code, out) = cli(args(
        &f.config,
        &["replay", "--route", route, "--reason", TRAP_REASON],
    ))
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("340 replayed"), "{out}");
    f.effects_exactly_once("t", 340).await;
    assert_eq!(f.metrics.delivered(route, Outcome::Duplicate), 0);
    // Each trapped dead letter replayed exactly once; the other 20 untouched.
    let replayed = store
        .dead_letters_oldest_first(&f.reason(TRAP_REASON, None), 1_000)
        .await
        .expect("list");
    assert_eq!(replayed.len(), 340);
    assert!(replayed.iter().all(|d| d.replay_count == 1));
    assert_eq!(count(store, f.reason("runs 1 1", Some(false))).await, 20);
    assert_eq!(kv_number(store, "seen/r-0").await, 0);

    let (code, out) = cli(args(
        &f.config,
        &["replay", "--route", route, "--reason", TRAP_REASON],
    ))
    .await;
    assert_eq!(code, 0);
    assert!(
        out.contains("0 replayed"),
        "a re-run replays nothing: {out}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(kv_number(store, "runs").await, 340);
    f.gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_killed_half_way_then_rerun_replays_each_once_on_postgres() {
    const N: i64 = 200;
    let f = dead_letters_then_fix("replaykill", N as usize, 0, true).await;
    let store = &f.gw.store;
    let route = f.queue.as_str();

    // An explicit --limit stops the run and says how many remain.
    let (code, out) = cli(args(
        &f.config,
        &["replay", "--route", route, "--limit", "30"],
    ))
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("30 replayed"), "{out}");
    assert!(
        out.contains("stopped at --limit 30: 170 matching dead letters not replayed yet"),
        "{out}"
    );

    // A slow run, SIGKILLed half-way.
    let mut child = spawn_cli(&args(
        &f.config,
        &["replay", "--route", route, "--rate", "40/s"],
    ));
    let marked = wait_for("about half replayed", WAIT, || async {
        let n = count(store, f.reason("", Some(true))).await;
        (n >= 90).then_some(n)
    })
    .await;
    child.kill().expect("SIGKILL the replay");
    let _ = child.wait();
    // A COMMIT the killed run had sent may still complete on the server (PostgreSQL) after
    // the process is gone: count once it has had time to.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let marked_at_kill = count(store, f.reason("", Some(true))).await;
    assert!(
        marked_at_kill >= marked && marked_at_kill < N,
        "{marked_at_kill}"
    );

    // The re-run takes exactly what is left, but for the one row the killed run may still
    // hold a claim on: a run after that claim's lease (25 s) takes it.
    let (code, out) = cli(args(&f.config, &["replay", "--route", route])).await;
    assert_eq!(code, 0, "{out}");
    let mut replayed = replayed_in(&out);
    if out.contains("1 skipped") {
        assert_eq!(replayed, N - marked_at_kill - 1, "{out}");
        let started = Instant::now();
        while replayed < N - marked_at_kill {
            assert!(
                started.elapsed() < WAIT,
                "the killed run's claim never ended"
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
            let (code, out) = cli(args(&f.config, &["replay", "--route", route])).await;
            assert_eq!(code, 0, "{out}");
            replayed += replayed_in(&out);
        }
    }
    assert_eq!(
        replayed,
        N - marked_at_kill,
        "the re-runs take exactly what is left: {out}"
    );
    f.effects_exactly_once("t", N).await;
    let all = store
        .dead_letters_oldest_first(&f.reason("", None), 1_000)
        .await
        .expect("list");
    assert_eq!(all.len(), N as usize);
    assert!(
        all.iter().all(|d| d.replay_count == 1),
        "every dead letter replayed exactly once: {:?}",
        all.iter()
            .filter(|d| d.replay_count != 1)
            .map(|d| (d.id, d.replay_count))
            .collect::<Vec<_>>()
    );
    // At most the one row in flight at the kill went out twice; the inbox absorbed it.
    assert!(f.metrics.delivered(route, Outcome::Duplicate) <= 1);

    let (code, out) = cli(args(&f.config, &["replay", "--route", route])).await;
    assert_eq!(code, 0);
    assert!(out.contains("0 replayed"), "{out}");
    f.gw.stop().await;
}

/// `N` of a run's `N replayed` line.
fn replayed_in(out: &str) -> i64 {
    out.lines()
        .find_map(|l| l.strip_suffix(" replayed")?.parse().ok())
        .unwrap_or_else(|| panic!("no `N replayed` line in {out}"))
}

/// `--since 1h` deletes what was dead-lettered in the last hour (the newest), `--older-than
/// 1h` what was dead-lettered before that; replayed or not; nothing without a filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_since_and_older_than_delete_exactly_what_they_say() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/purge.db", dir.path().display());
    let config = dir.path().join("carteiro.toml");
    std::fs::write(
        &config,
        format!(
            "version = 1\n[broker]\nurl = \"{}\"\n[store]\nurl = \"{url}\"\n",
            crate::support::amqp_url()
        ),
    )
    .expect("config");
    let store = Store::connect(&url, 2).await.expect("store");
    store.migrate().await.expect("migrate");
    let now = carteiro::common::now_ms();
    let minutes = |m: i64| now - m * 60_000;
    let insert = |route: &str, at: i64| NewDeadLetter {
        route: route.into(),
        queue: format!("{route}.dlq"),
        reason: "r".into(),
        plugin: None,
        attempts: 1,
        headers: Vec::new(),
        body: Vec::new(),
        first_failed_at: None,
        dead_lettered_at: at,
    };
    let mut ids = Vec::new();
    for (route, age) in [("a", 120), ("a", 30), ("a", 1), ("b", 1)] {
        ids.push(
            store
                .dead_letter_insert(&insert(route, minutes(age)))
                .await
                .expect("insert"),
        );
    }
    store.dead_letter_mark_replayed(ids[2]).await.expect("mark");

    let (code, _) = cli(args(&config, &["purge"])).await;
    assert_eq!(code, 1, "no filter, nothing purged");
    let (code, out) = cli(args(&config, &["purge", "--route", "a", "--since", "1h"])).await;
    assert_eq!(code, 0);
    assert!(out.contains("2 dead letters deleted"), "{out}");
    let left: Vec<i64> = store
        .dead_letters_oldest_first(&DeadLetterFilter::default(), 10)
        .await
        .expect("list")
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(
        left,
        vec![ids[0], ids[3]],
        "the 30 min and 1 min old ones of route a"
    );

    let (code, out) = cli(args(&config, &["purge", "--older-than", "1h"])).await;
    assert_eq!(code, 0);
    assert!(out.contains("1 dead letters deleted"), "{out}");
    let left = store
        .dead_letters_oldest_first(&DeadLetterFilter::default(), 10)
        .await
        .expect("list");
    assert_eq!(left.iter().map(|d| d.id).collect::<Vec<_>>(), vec![ids[3]]);
}

/// A replay is a delivery like any other: deduplicated by the inbox while the original's
/// inbox record exists, processed again once retention purged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_after_the_inbox_retention_runs_the_handler_again() {
    let client = Client::connect().await;
    let (queue, exchange, events) = (unique("replayret"), unique("in"), unique("events"));
    client.sink(&exchange).await;
    client.sink(&events).await;
    let toml = counter_config(&queue, &exchange, &events);
    let metrics = Arc::new(Metrics::default());
    let gw = Gateway::start_in(
        tempfile::tempdir().expect("tempdir"),
        &toml,
        metrics.clone(),
    )
    .await;
    client.wait_for_consumer(&queue).await;
    let config = gw.dir.path().join("carteiro.toml");
    let failed = NewDeadLetter {
        headers: vec![(":message-id".into(), "m-1".into())],
        body: b"{}".to_vec(),
        ..counter_dead_letter(&queue, "content service down", 3)
    };
    let id = gw.store.dead_letter_insert(&failed).await.expect("insert");
    let runs = |n: i64| {
        let store = gw.store.clone();
        async move {
            wait_for(&format!("{n} runs"), WAIT, || async {
                (kv_number(&store, "runs").await >= n).then_some(())
            })
            .await;
        }
    };

    let (code, out) = cli(args(&config, &["replay", "--route", &queue])).await;
    assert!(code == 0 && out.contains("1 replayed"), "{out}");
    runs(1).await;
    // Replayed again while the inbox record exists: a duplicate, the handler does not run.
    let (code, out) = cli(args(
        &config,
        &["replay", "--route", &queue, "--include-replayed"],
    ))
    .await;
    assert!(code == 0 && out.contains("1 replayed"), "{out}");
    wait_for("the second copy acked as a duplicate", WAIT, || async {
        (metrics.delivered(&queue, Outcome::Duplicate) >= 1).then_some(())
    })
    .await;
    assert_eq!(kv_number(&gw.store, "runs").await, 1);
    // Retention purges the inbox record: the next replay runs the handler again.
    let purged = gw
        .store
        .inbox_purge_before(carteiro::common::now_ms() + 1)
        .await
        .expect("purge");
    assert!(purged >= 1);
    let (code, out) = cli(args(&config, &["replay", &id.to_string()])).await;
    assert!(code == 0 && out.contains("1 replayed"), "{out}");
    runs(2).await;
    assert_eq!(kv_number(&gw.store, "seen/m-1").await, 2, "effects twice");
    assert_eq!(archived(&gw.store, id).await.replay_count, 3);
    gw.stop().await;
}

/// Two operators replaying the same dead letters at once (a console job beside
/// `carteiro dlq replay`, a double click): they split the rows, and each message reaches the
/// queue once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replays_at_once_split_the_rows_and_publish_each_once() {
    const ROWS: usize = 100;
    let client = Client::connect().await;
    // Nobody consumes the route's queue: what arrives is what the replays published.
    let (queue, dir, store) = unconsumed_route(&client, "twice").await;
    for i in 0..ROWS {
        let record = NewDeadLetter {
            route: queue.clone(),
            queue: format!("{queue}.dlq"),
            reason: TRAP_REASON.to_owned(),
            plugin: Some("counter".to_owned()),
            attempts: 1,
            headers: vec![(
                carteiro::common::header_names::PROP_MESSAGE_ID.to_owned(),
                format!("twice-{i}"),
            )],
            body: b"x".to_vec(),
            first_failed_at: None,
            dead_lettered_at: carteiro::common::now_ms(),
        };
        store.dead_letter_insert(&record).await.expect("seed");
    }
    let path = dir.path().join("carteiro.toml");
    // Paced, so the two runs overlap over the whole selection.
    let run = || {
        cli(args(
            &path,
            &[
                "replay",
                "--route",
                &queue,
                "--reason",
                TRAP_REASON,
                "--rate",
                "100/s",
            ],
        ))
    };
    let ((code_a, out_a), (code_b, out_b)) = tokio::join!(run(), run());
    assert_eq!((code_a, code_b), (0, 0), "{out_a}\n{out_b}");
    let replayed = |out: &str| -> usize {
        out.lines()
            .find_map(|l| l.strip_suffix(" replayed")?.parse().ok())
            .unwrap_or_else(|| panic!("no `N replayed` line in {out}"))
    };
    assert_eq!(
        replayed(&out_a) + replayed(&out_b),
        ROWS,
        "{out_a}\n{out_b}"
    );
    let arrived = wait_for("the replays in the queue", WAIT, || async {
        let n = crate::resilience::queue_depth(&client, &queue).await;
        (n as usize >= ROWS).then_some(n)
    })
    .await;
    // Give a late duplicate the chance to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let arrived = arrived.max(crate::resilience::queue_depth(&client, &queue).await);
    assert_eq!(
        arrived as usize, ROWS,
        "each dead letter reaches the queue once"
    );
    let rows = store
        .dead_letters_list(&DeadLetterFilter {
            route: Some(queue.clone()),
            limit: Some(1_000),
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(rows.len(), ROWS);
    assert!(rows.iter().all(|d| d.replay_count == 1), "{rows:?}");
    crate::resilience::delete_queue(&client, &queue).await;
}
