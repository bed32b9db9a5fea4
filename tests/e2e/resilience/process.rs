//! The real `carteiro` binary: SIGTERM with deliveries in flight, bad config files, and
//! broker credentials that must never be printed.

use super::{Running, carteiro, counter_value, delete_queue, queue_depth, run_to_end, topology_of};
use crate::support::{Client, amqp_url, json_props, load_config, route_config, unique, wait_for};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Writes `toml` (with `{dir}` replaced) to `dir/carteiro.toml` and returns its path.
fn write_config(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("carteiro.toml");
    let toml = toml.replace("{dir}", &dir.display().to_string());
    std::fs::write(&path, toml).expect("write config");
    path
}

fn command(args: &[&str], config: &Path) -> std::process::Command {
    let mut cmd = carteiro();
    cmd.args(args).arg("-c").arg(config);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_deliveries_and_loses_nothing() {
    const PUBLISHED: usize = 1500;
    let (queue, exchange, events) = (unique("sigterm"), unique("in"), unique("events"));
    let dir = tempfile::tempdir().expect("tempdir");
    let vars = format!("out_exchange = \"{events}\"");
    let path = write_config(
        dir.path(),
        &route_config(&queue, "counter", &exchange, &vars, ""),
    );
    let client = Client::connect().await;
    client.sink(&events).await;
    // A backlog waiting before the gateway starts, so its prefetch window fills at once.
    let config = load_config(dir.path(), &std::fs::read_to_string(&path).expect("read"));
    carteiro::topology::declare_route(&client.conn, &topology_of(&config.routes[0]))
        .await
        .expect("declare the route");
    let ids: Vec<String> = (0..PUBLISHED).map(|i| format!("term-{i}")).collect();
    for id in &ids {
        client.publish(&exchange, "k", json_props(id), b"{}").await;
    }

    let mut gateway = Running::spawn(command(&["run"], &path));
    gateway
        .wait_stderr("consumer started", Duration::from_secs(60))
        .await;
    let store = carteiro::services::open_store(&config)
        .await
        .expect("store");
    wait_for("the first commits", Duration::from_secs(30), || async {
        (counter_value(&store, "runs").await >= 20).then_some(())
    })
    .await;
    let term = std::process::Command::new("kill")
        .args(["-TERM", &gateway.pid().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    // The grace period for in-flight deliveries is 30 s.
    let finished = gateway.finish(Duration::from_secs(40)).await;
    assert_eq!(
        finished.code,
        Some(0),
        "clean exit after SIGTERM; stderr:\n{}",
        finished.stderr
    );
    assert!(
        finished.stderr.contains("consumer stopped"),
        "{}",
        finished.stderr
    );

    // Every message is either committed (exactly once) or back in the queue: never both.
    let mut committed = 0;
    for id in &ids {
        let seen = counter_value(&store, &format!("seen/{id}")).await;
        let in_inbox = store.inbox_contains(&queue, id).await.expect("inbox");
        assert!(seen <= 1, "{id} committed {seen} times");
        assert_eq!(
            seen == 1,
            in_inbox,
            "{id}: effects and inbox record together"
        );
        committed += usize::from(in_inbox);
    }
    assert_eq!(counter_value(&store, "runs").await, committed as u64);
    let remaining = wait_for(
        "unacked deliveries back in the queue",
        Duration::from_secs(10),
        || async {
            let remaining = queue_depth(&client, &queue).await as usize;
            (committed + remaining == PUBLISHED).then_some(remaining)
        },
    )
    .await;
    eprintln!("SIGTERM: {committed} committed, {remaining} left in the queue");
    assert!(
        remaining > 0,
        "SIGTERM came after the backlog was drained; nothing was in flight"
    );
    delete_queue(&client, &queue).await;
}

/// One broken config: how to break the working one, and what the error must say.
struct Broken<'a> {
    what: &'a str,
    from: &'a str,
    to: &'a str,
    /// Expected in stderr; `{line}` is the 1-based line of `to`.
    says: Vec<&'a str>,
}

#[tokio::test]
async fn bad_config_files_fail_with_the_file_line_and_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.wasm");
    let missing = missing.display().to_string();
    let good = route_config(&unique("cfg"), "noop", &unique("in"), "", "")
        .replace("{dir}", &dir.path().display().to_string());
    let noop = crate::support::plugin("noop").display().to_string();
    let cases = [
        Broken {
            what: "unknown key",
            from: "prefetch = 16",
            to: "prefetch = 16\ncolour = \"blue\"",
            says: vec!["carteiro.toml:{line}", "unknown field `colour`"],
        },
        Broken {
            what: "missing plugin file",
            from: &noop,
            to: &missing,
            says: vec!["`plugins.noop.path`", "no plugin file at", &missing],
        },
        Broken {
            what: "bad duration",
            from: "timeout = \"2s\"",
            to: "timeout = \"2 fortnights\"",
            says: vec![
                "carteiro.toml:{line}",
                "\"2 fortnights\", expected a duration; write e.g.",
            ],
        },
        Broken {
            what: "route to an unknown plugin",
            from: "plugin = \"noop\"",
            to: "plugin = \"ghost\"",
            says: vec![
                "carteiro.toml:{line}",
                "`routes[0].plugin`",
                "unknown plugin `ghost`",
            ],
        },
    ];
    let path = write_config(dir.path(), &good);
    let ok = run_to_end(
        command(&["check", "--no-environment"], &path),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(ok.code, Some(0), "the base config is valid: {}", ok.stderr);

    for case in &cases {
        assert!(
            good.contains(case.from),
            "{}: {:?} not in config",
            case.what,
            case.from
        );
        let broken = good.replacen(case.from, case.to, 1);
        let last_line = case.to.lines().last().unwrap_or_default();
        let line = broken
            .lines()
            .position(|l| l == last_line)
            .map_or(0, |i| i + 1);
        let path = write_config(dir.path(), &broken);
        for args in [&["check", "--no-environment"][..], &["run"][..]] {
            let out = run_to_end(command(args, &path), Duration::from_secs(60)).await;
            let context = format!("{} / carteiro {args:?}: stderr:\n{}", case.what, out.stderr);
            assert!(!matches!(out.code, Some(0) | None), "{context}");
            for needle in &case.says {
                let needle = needle.replace("{line}", &line.to_string());
                assert!(
                    out.stderr.contains(&needle),
                    "{needle:?} missing: {context}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_queue_declared_with_other_arguments_is_refused_and_kept() {
    let queue = unique("clash");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(
        dir.path(),
        &route_config(&queue, "noop", &unique("in"), "", ""),
    );
    // Someone else's queue of the same name: same dead-letter exchange, but a TTL.
    let client = Client::connect().await;
    let mut args = FieldTable::default();
    let dlx = carteiro::topology::dlx_name(&queue);
    args.insert(
        ShortString::from("x-dead-letter-exchange"),
        AMQPValue::LongString(LongString::from(dlx.as_str())),
    );
    args.insert(
        ShortString::from("x-message-ttl"),
        AMQPValue::LongLongInt(60_000),
    );
    let durable = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    client
        .channel
        .queue_declare(queue.as_str().into(), durable, args)
        .await
        .expect("declare the clashing queue");
    client
        .publish("", &queue, json_props("keep-me"), b"{}")
        .await;

    for args in [&["check"][..], &["run"][..]] {
        let out = run_to_end(command(args, &path), Duration::from_secs(60)).await;
        let context = format!("carteiro {args:?}: stderr:\n{}", out.stderr);
        assert!(!matches!(out.code, Some(0) | None), "{context}");
        for needle in [
            format!("queue '{queue}' already exists with a different 'x-message-ttl'"),
            "delete the queue".to_owned(),
        ] {
            assert!(
                out.stderr.contains(&needle),
                "{needle:?} missing: {context}"
            );
        }
    }
    assert_eq!(
        queue_depth(&client, &queue).await,
        1,
        "never deleted or drained"
    );
    delete_queue(&client, &queue).await;
}

/// The shared broker's URL with a user that does not exist and a distinctive password.
fn url_with_password(password: &str) -> String {
    let url = amqp_url();
    let host = url.rsplit_once('@').map_or(url.as_str(), |(_, h)| h);
    let host = host.split_once("://").map_or(host, |(_, h)| h);
    format!("amqp://carteiro-nobody:{password}@{host}")
}

#[tokio::test]
async fn broker_credentials_never_reach_the_logs() {
    const PASSWORD: &str = "s3cr3t-pw-42";
    let redacted = "amqp://carteiro-nobody:***@";
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = route_config(&unique("creds"), "noop", &unique("in"), "", "").replace(
        &amqp_url(),
        &url_with_password("${CARTEIRO_TEST_BROKER_PW}"),
    );
    let path = write_config(dir.path(), &toml);

    // `run` keeps retrying a broker that refuses the login; verbose logs included.
    let mut cmd = command(&["run"], &path);
    cmd.env("CARTEIRO_TEST_BROKER_PW", PASSWORD)
        .env("CARTEIRO_LOG", "info,carteiro=trace,lapin=trace");
    let mut gateway = Running::spawn(cmd);
    gateway
        .wait_stderr("reconnecting", Duration::from_secs(60))
        .await;
    let run = gateway.kill().await;
    assert!(run.stderr.contains(redacted), "{}", run.stderr);

    // `check` fails on the same broker and says where it tried to connect.
    let mut cmd = command(&["check"], &path);
    cmd.env("CARTEIRO_TEST_BROKER_PW", PASSWORD);
    let check = run_to_end(cmd, Duration::from_secs(60)).await;
    assert!(!matches!(check.code, Some(0) | None), "{}", check.stderr);
    assert!(check.stderr.contains(redacted), "{}", check.stderr);
    assert!(check.stderr.contains("ACCESS_REFUSED"), "{}", check.stderr);
    assert_eq!(
        check
            .stderr
            .matches("cannot connect to the broker at")
            .count(),
        1,
        "said once: {}",
        check.stderr
    );

    for (what, out) in [("run", &run), ("check", &check)] {
        for text in [&out.stdout, &out.stderr] {
            assert!(
                !text.contains(PASSWORD),
                "carteiro {what} printed the broker password:\n{text}"
            );
        }
    }
}
