//! Issue 16, what an operator watches: `/metrics` scraped before and after a known batch
//! (every counter moves by exactly the batch's numbers, nothing else moves), and
//! dead-letter alerts (one ERROR per window, the gauge, the `/readyz` note, and clearing).
//! Issue 25: retention's purges in `/metrics` and the console.

use crate::live::{free_port, http, sha256_of};
use crate::resilience::{Running, carteiro};
use crate::support::{
    Client, Gateway, counter_dead_letter, json_props, migrated_store, plugin, plugin_route,
    route_config, seed_outbox, unique, wait_for,
};
use carteiro::runtime::short_version;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// Every `_total` counter sample and histogram `_count` of an exposition, by name and
/// labels. Gauges and sums are left out: they are not counts of the batch.
fn counters(exposition: &str) -> BTreeMap<String, f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let name = series.split('{').next().unwrap_or_default();
            name.ends_with("_total") || name.ends_with("_count")
        })
        .filter_map(|(series, value)| Some((series.to_owned(), value.parse().ok()?)))
        .collect()
}

/// What moved between two scrapes (series absent before count from zero).
fn moved(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(series, now)| {
            let delta = now - before.get(series).copied().unwrap_or(0.0);
            (delta != 0.0).then(|| (series.clone(), delta))
        })
        .collect()
}

fn gauge(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn scrape(port: u16) -> String {
    let (status, body) = http(port, "GET", "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

/// What a test of the gateway binary starts from: a fresh queue named after `prefix`, a
/// fresh exchange with a sink, the client that declared it, a free port for the admin server
/// and a folder for the config and the database.
async fn setup(prefix: &str) -> (String, String, Client, u16, tempfile::TempDir) {
    let (queue, exchange) = (unique(prefix), unique("in"));
    let client = Client::connect().await;
    client.sink(&exchange).await;
    let dir = tempfile::tempdir().expect("tempdir");
    (queue, exchange, client, free_port(), dir)
}

/// `toml` with the admin server on `127.0.0.1:port`.
fn admin_on(toml: &str, port: u16) -> String {
    toml.replace(
        "[admin]\nlisten = \"\"",
        &format!("[admin]\nlisten = \"127.0.0.1:{port}\""),
    )
}

/// The gateway binary (`carteiro run -c`) on `toml` with its `{dir}` in `dir`, written as
/// `dir/carteiro.toml`; returned once the gateway runs.
async fn run_binary(dir: &Path, toml: &str) -> Running {
    let config = dir.join("carteiro.toml");
    let toml = toml.replace("{dir}", &dir.display().to_string());
    std::fs::write(&config, toml).expect("config");
    let mut cmd = carteiro();
    cmd.args(["run", "-c"]).arg(&config);
    let mut gw = Running::spawn(cmd);
    gw.wait_stderr("gateway running", WAIT).await;
    gw
}

#[tokio::test]
async fn metrics_move_by_exactly_a_known_batch() {
    let (mixed, enroll) = (unique("ops-mixed"), unique("ops-enroll"));
    let (exchange, events) = (unique("in"), unique("events"));
    let client = Client::connect().await;
    client.sink(&exchange).await;
    client.sink(&events).await;
    let port = free_port();
    let mixed_route = route_config(
        &mixed,
        "fixture-mixed",
        &exchange,
        "",
        "on_plugin_failure = \"dead-letter\"\nretry = { max_attempts = 3, backoff = [\"200ms\"] }",
    );
    let toml = admin_on(&mixed_route, port)
        + &plugin_route(
            "enrollment",
            "enrollment",
            &format!("events_exchange = \"{events}\""),
            &enroll,
            &exchange,
        )
        + "routing_key = \"enroll\"\n";
    // The mixed route takes every key but `enroll`.
    let toml = toml.replace("routing_key = \"#\"", "routing_key = \"m\"");
    let gw = Gateway::start(&toml).await;
    client.wait_for_consumer(&mixed).await;
    client.wait_for_consumer(&enroll).await;
    let before = scrape(port).await;

    let send = |key: &'static str, id: Option<String>, body: String| {
        let client = &client;
        let exchange = &exchange;
        async move {
            let props = match id {
                Some(id) => json_props(&id),
                None => lapin::BasicProperties::default().with_delivery_mode(2),
            };
            client.publish(exchange, key, props, body.as_bytes()).await;
        }
    };
    let batch = unique("b");
    for i in 0..6 {
        send("m", Some(format!("{batch}-ok-{i}")), "ok".into()).await;
    }
    for i in 0..3 {
        send("m", Some(format!("{batch}-r2-{i}")), "retry-until-2".into()).await;
    }
    for i in 0..2 {
        send("m", Some(format!("{batch}-trap-{i}")), "trap".into()).await;
    }
    send("m", Some(format!("{batch}-r9")), "retry-until-9".into()).await;
    send("m", None, "no message id".into()).await;
    for i in 0..4 {
        let body = format!(r#"{{"matricula_id":"{batch}-{i}","usuario_id":"U","curso_id":"C"}}"#);
        send("enroll", Some(format!("{batch}-e-{i}")), body).await;
    }
    // 6 ok + 3 retried-then-acked on the mixed route, 4 on the enrollment route.
    wait_for("the batch's acks", WAIT, || async {
        let text = scrape(port).await;
        let acked = moved(&counters(&before), &counters(&text));
        let n = |route: &str| {
            acked
                .get(&format!(
                    "carteiro_deliveries_total{{route=\"{route}\",outcome=\"acked\"}}"
                ))
                .copied()
                .unwrap_or(0.0)
        };
        (n(&mixed) == 9.0 && n(&enroll) == 4.0).then_some(())
    })
    .await;
    // Then the duplicates: two of the acked messages again.
    for i in 0..2 {
        send("m", Some(format!("{batch}-ok-{i}")), "ok".into()).await;
    }
    // A fresh instance per handler run (the default isolation), none reused.
    let instances = |name: &str| {
        let version = sha256_of(&plugin(name));
        let version = short_version(&version);
        format!(
            "carteiro_plugin_instances_created_total{{plugin=\"{name}\",version=\"{version}\"}}"
        )
    };
    let expected: BTreeMap<String, f64> = [
        (format!("carteiro_deliveries_total{{route=\"{mixed}\",outcome=\"acked\"}}"), 9.0),
        (format!("carteiro_deliveries_total{{route=\"{mixed}\",outcome=\"duplicate\"}}"), 2.0),
        // 3 × one retry, and two for retry-until-9 before its attempts ran out.
        (format!("carteiro_deliveries_total{{route=\"{mixed}\",outcome=\"retried\"}}"), 5.0),
        (format!("carteiro_deliveries_total{{route=\"{mixed}\",outcome=\"dead_lettered\"}}"), 4.0),
        (format!("carteiro_deliveries_total{{route=\"{enroll}\",outcome=\"acked\"}}"), 4.0),
        (format!("carteiro_delivery_seconds_count{{route=\"{mixed}\"}}"), 20.0),
        (format!("carteiro_delivery_seconds_count{{route=\"{enroll}\"}}"), 4.0),
        (format!("carteiro_retries_total{{route=\"{mixed}\",reason_class=\"handler\"}}"), 5.0),
        (format!("carteiro_dead_letters_total{{route=\"{mixed}\",reason_class=\"trap\"}}"), 2.0),
        (format!("carteiro_dead_letters_total{{route=\"{mixed}\",reason_class=\"retries-exhausted\"}}"), 1.0),
        (format!("carteiro_dead_letters_total{{route=\"{mixed}\",reason_class=\"missing-key\"}}"), 1.0),
        (format!("carteiro_dead_letters_archived_total{{route=\"{mixed}\"}}"), 4.0),
        (format!("carteiro_plugin_failures_total{{route=\"{mixed}\",kind=\"trap\"}}"), 2.0),
        // Handler runs: 6 ok, 3 × 2, 2 traps, 3 attempts of retry-until-9; the key-less
        // message and the duplicates never reach the plugin.
        (format!("carteiro_handler_seconds_count{{route=\"{mixed}\"}}"), 17.0),
        (format!("carteiro_handler_seconds_count{{route=\"{enroll}\"}}"), 4.0),
        (instances("fixture-mixed"), 17.0),
        (instances("enrollment"), 4.0),
        ("carteiro_outbox_published_total".to_owned(), 12.0),
        // Immediate dispatch: every row went straight from its commit, none was claimed.
        ("carteiro_outbox_handed_total".to_owned(), 12.0),
    ]
    .into_iter()
    .collect();
    let after = wait_for(
        "every counter to reach the batch's numbers",
        WAIT,
        || async {
            let text = scrape(port).await;
            let got = moved(&counters(&before), &counters(&text));
            let version_free: BTreeMap<String, f64> = got
                .into_iter()
                .filter(|(s, _)| !s.starts_with("carteiro_plugin_version_deliveries_total"))
                .collect();
            (version_free == expected).then_some(text)
        },
    )
    .await;
    // Give a stray late count the chance to show, then compare once more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let settled = scrape(port).await;
    assert_eq!(
        moved(&counters(&after), &counters(&settled)),
        BTreeMap::new(),
        "nothing moves after the batch"
    );
    for (series, value) in [
        ("carteiro_outbox_pending", 0.0),
        ("carteiro_outbox_oldest_pending_seconds", 0.0),
        ("carteiro_store_available", 1.0),
        (
            &*format!("carteiro_route_connected{{route=\"{mixed}\"}}"),
            1.0,
        ),
    ] {
        assert_eq!(gauge(&settled, series), Some(value), "{series}\n{settled}");
    }
    for series in [
        "carteiro_store_outages_total",
        "carteiro_replay_replayed_total",
    ] {
        assert_eq!(gauge(&settled, series), Some(0.0), "{series} exported as 0");
    }
    gw.stop().await;
}

/// The gateway binary with an alert of 3 dead letters in 8 s: three traps raise it once
/// (one ERROR, the gauge, a `/readyz` note); two more inside the window log nothing more;
/// when the window passes it clears; three more raise it again.
#[tokio::test]
async fn a_dead_letter_alert_is_raised_once_per_window_and_clears() {
    let (queue, exchange, client, port, dir) = setup("ops-alert").await;
    let toml = route_config(
        &queue,
        "fixture-mixed",
        &exchange,
        "",
        "on_plugin_failure = \"dead-letter\"\ndead_letter_alert = { count = 3, window = \"8s\" }",
    );
    let mut gw = run_binary(dir.path(), &admin_on(&toml, port)).await;
    client.wait_for_consumer(&queue).await;
    let errors = |gw: &Running| {
        gw.stderr()
            .lines()
            .filter(|l| l.contains("ERROR") && l.contains("dead-letter alert"))
            .count()
    };
    let active = format!("carteiro_dead_letter_alert_active{{route=\"{queue}\"}}");
    let alert_is = |want: f64| {
        let active = active.clone();
        async move { (gauge(&scrape(port).await, &active) == Some(want)).then_some(()) }
    };
    assert_eq!(gauge(&scrape(port).await, &active), Some(0.0));

    let trap = |n: usize, tag: &'static str| {
        let client = &client;
        let exchange = &exchange;
        async move {
            for i in 0..n {
                let id = unique(tag) + &i.to_string();
                client
                    .publish(exchange, "k", json_props(&id), b"trap")
                    .await;
            }
        }
    };
    trap(3, "first").await;
    wait_for("the alert to be raised", WAIT, || alert_is(1.0)).await;
    let (status, ready) = http(port, "GET", "/readyz").await;
    assert_eq!(status, 200, "an alert does not make the gateway unready");
    assert!(
        ready.contains(&format!(
            "dead-letter alert: route `{queue}`: 3 dead letters in the last 8s (threshold 3)"
        )) && ready.contains("plugin trapped"),
        "{ready}"
    );
    trap(2, "more").await;
    wait_for("five dead letters counted", WAIT, || async {
        let (_, ready) = http(port, "GET", "/readyz").await;
        ready
            .contains("5 dead letters in the last 8s")
            .then_some(())
    })
    .await;
    assert_eq!(errors(&gw), 1, "one ERROR while raised:\n{}", gw.stderr());

    wait_for("the alert to clear", Duration::from_secs(30), || {
        alert_is(0.0)
    })
    .await;
    gw.wait_stderr("dead-letter alert cleared", WAIT).await;
    let (_, ready) = http(port, "GET", "/readyz").await;
    assert!(!ready.contains("dead-letter alert"), "{ready}");
    assert_eq!(errors(&gw), 1, "no ERROR after the first:\n{}", gw.stderr());

    trap(3, "again").await;
    wait_for("the alert to be raised again", WAIT, || alert_is(1.0)).await;
    assert_eq!(errors(&gw), 2, "one ERROR per raise:\n{}", gw.stderr());
    gw.kill().await;
}

/// Issue 25: the real binary starts on a store holding dead letters (two replayed ones
/// dead-lettered days ago, an unreplayed one as old, a replayed one an hour old) and three
/// outbox rows published three hours ago, with `[dead_letters] retain = "1d"` and the outbox's
/// retention under its deprecated name `[relay] retention = "2h"`. Loading warns about the
/// old name; the first pass (at start) purges the two old replayed dead letters and the three
/// rows; `/metrics` counts them with the time of the purge, and the console says what is kept
/// and what the last purge removed.
#[tokio::test]
async fn retention_purges_show_in_metrics_and_the_console() {
    let (queue, exchange, _client, port, dir) = setup("ops-retain").await;
    let url = format!("sqlite://{}/carteiro.db", dir.path().display());
    let store = migrated_store(&url).await;
    let now = carteiro::common::now_ms();
    let (hour, day) = (3_600_000, 24 * 3_600_000);
    let mut kept = Vec::new();
    for (age, replayed, purged) in [
        (2 * day, true, true),
        (3 * day, true, true),
        (3 * day, false, false),
        (hour, true, false),
    ] {
        let mut dead_letter = counter_dead_letter(&queue, "bad input", 1);
        dead_letter.dead_lettered_at = now - age;
        let id = store
            .dead_letter_insert(&dead_letter)
            .await
            .expect("archive");
        if replayed {
            store.dead_letter_mark_replayed(id).await.expect("mark");
        }
        if !purged {
            kept.push(id);
        }
    }
    seed_outbox(&store, &exchange, 1, 3).await;
    let pool = sqlx::SqlitePool::connect(&url).await.expect("sqlite");
    sqlx::query("UPDATE outbox SET published_at = $1")
        .bind(now - 3 * hour)
        .execute(&pool)
        .await
        .expect("published");

    let toml = admin_on(
        &route_config(&queue, "fixture-mixed", &exchange, "", ""),
        port,
    )
    .replace(
        "poll_interval = \"200ms\"",
        "poll_interval = \"200ms\"\nretention = \"2h\"",
    ) + "[dead_letters]\nretain = \"1d\"\n";
    let gw = run_binary(dir.path(), &toml).await;
    assert!(
        gw.stderr().contains("`relay.retention`: deprecated"),
        "{}",
        gw.stderr()
    );

    let purged = |table: &str| format!("carteiro_retention_purged_total{{table=\"{table}\"}}");
    let text = wait_for("the first pass's purges in /metrics", WAIT, || async {
        let text = scrape(port).await;
        (gauge(&text, &purged("dead_letters")) == Some(2.0)
            && gauge(&text, &purged("outbox")) == Some(3.0))
        .then_some(text)
    })
    .await;
    let stamp = "carteiro_retention_last_success_timestamp_seconds{table=\"dead_letters\"}";
    let at = gauge(&text, stamp).unwrap_or_else(|| panic!("{stamp} missing:\n{text}"));
    assert!(
        at * 1000.0 >= now as f64,
        "{stamp} {at} before the start:\n{text}"
    );

    let left = store
        .dead_letters_oldest_first(&Default::default(), 10)
        .await
        .expect("dead letters");
    assert_eq!(left.iter().map(|d| d.id).collect::<Vec<_>>(), kept);
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(rows, 0, "the published rows are gone");

    let (status, page) = http(port, "GET", "/dead-letters").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains(
            "Retention: replayed dead letters (never-replayed ones are kept) are purged 1 day \
             after they were dead-lettered; last purge"
        ) && page.contains("removed 2 (2 since the gateway started)"),
        "{page}"
    );
    let (status, page) = http(port, "GET", "/").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("Retention: published outbox rows are purged 2h after their publish")
            && page.contains("removed 3 (3 since the gateway started)"),
        "{page}"
    );
    gw.kill().await;
}
