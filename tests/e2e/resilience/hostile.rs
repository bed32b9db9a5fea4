//! The real binary against hostile plugins and process-level faults (issue 12): per-delivery
//! totals with the gateway's peak RSS measured, a panicking delivery, SIGHUP (a reload in place), and SIGTERM
//! while the store is unavailable or the broker does not answer.

use super::{Running, carteiro};
use crate::blackhole::Blackhole;
use crate::support::dead_letters;
use crate::support::{Client, amqp_url, json_props, load_config, route_config, unique, wait_for};
use std::path::{Path, PathBuf};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

fn write_config(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("carteiro.toml");
    std::fs::write(&path, toml.replace("{dir}", &dir.display().to_string())).expect("config");
    path
}

/// Peak resident set of a process (`VmHWM`), in bytes.
pub(crate) fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib * 1024
}

pub(crate) fn signal(pid: u32, name: &str) {
    let ok = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill -{name} {pid}");
}

struct Child {
    gateway: Running,
    store: carteiro::store::Store,
    client: Client,
    queue: String,
    exchange: String,
    dir: tempfile::TempDir,
}

async fn start(plugin: &str, extra: &str, fault: Option<&str>) -> Child {
    start_edited(plugin, extra, fault, |toml| toml).await
}

/// [`start`] with the config changed by `edit` first.
async fn start_edited(
    plugin: &str,
    extra: &str,
    fault: Option<&str>,
    edit: impl FnOnce(String) -> String,
) -> Child {
    let (queue, exchange) = (unique("hostile"), unique("in"));
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = edit(
        route_config(&queue, plugin, &exchange, "", extra)
            .replace("memory = \"32MiB\"", "memory = \"64MiB\""),
    );
    let path = write_config(dir.path(), &toml);
    let client = Client::connect().await;
    client.sink(&exchange).await;
    let mut cmd = carteiro();
    cmd.args(["run", "-c"]).arg(&path);
    if let Some(fault) = fault {
        cmd.env("CARTEIRO_FAULT", fault);
    }
    let mut gateway = Running::spawn(cmd);
    gateway.wait_stderr("consumer started", WAIT).await;
    let config = load_config(dir.path(), &std::fs::read_to_string(&path).expect("read"));
    let store = carteiro::services::open_store(&config)
        .await
        .expect("store");
    Child {
        gateway,
        store,
        client,
        queue,
        exchange,
        dir,
    }
}

impl Child {
    async fn publish(&self, id: &str, body: &[u8]) {
        self.client
            .publish(&self.exchange, "k", json_props(id), body)
            .await;
    }

    async fn committed(&self, namespace: &str, key: &str) {
        wait_for(&format!("kv {key}"), WAIT, || async {
            self.store.kv_get(namespace, key).await.ok().flatten()
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_delivery_totals_bound_the_gateways_memory() {
    let child = start(
        "fixture-hostile",
        "on_plugin_failure = \"dead-letter\"",
        None,
    )
    .await;
    let attacks = [
        ("kv-bytes", "kv total of"),
        ("event-bytes", "event total of"),
        ("log-flood", "log total of"),
        ("huge-reason", "rrrr"),
        ("header-flood", "headers take more than"),
        ("long-content-type", "content type is 300 bytes"),
    ];
    for (attack, _) in &attacks {
        child.publish(&unique(attack), attack.as_bytes()).await;
    }
    let good = unique("good");
    child.publish(&good, b"fine").await;
    child
        .committed("fixture-hostile", &format!("ok/{good}"))
        .await;
    let rows = dead_letters(&child.store, &child.queue, attacks.len()).await;
    for (attack, says) in attacks {
        let row = rows
            .iter()
            .find(|d| d.letter.body == attack.as_bytes())
            .unwrap_or_else(|| panic!("no dead letter for {attack}"));
        assert!(
            row.letter.reason.contains(says),
            "{attack}: {}",
            row.letter.reason
        );
        assert!(
            row.letter.reason.len() <= 4096,
            "{attack}: reason of {}",
            row.letter.reason.len()
        );
        if attack.ends_with("bytes") || attack == "log-flood" {
            assert!(
                row.letter
                    .headers
                    .iter()
                    .any(|(k, v)| k == "x-carteiro-failure" && v == "resource-limit"),
                "{attack}: {:?}",
                row.letter.headers
            );
        }
    }
    // Without the totals, `event-bytes` alone makes the host hold 100 events of 8 MiB and
    // `kv-bytes` 10,000 values of 4 MiB. With them: the guest's 64 MiB, a 16 MiB total,
    // and the gateway itself.
    let peak = peak_rss(child.gateway.pid());
    eprintln!("gateway peak RSS: {} MiB", peak >> 20);
    assert!(peak < 300 << 20, "gateway peak RSS {} MiB", peak >> 20);
    let good = unique("good");
    child.publish(&good, b"fine").await;
    child
        .committed("fixture-hostile", &format!("ok/{good}"))
        .await;
    child.gateway.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_delivery_is_requeued_once_then_dead_lettered_and_sighup_reloads_in_place() {
    let mut child = start("fixture-mixed", "", Some("panic-on-body")).await;
    child.publish("panics", b"panic please").await;
    for i in 0..3 {
        let id = unique(&format!("good-{i}"));
        child.publish(&id, b"fine").await;
        child
            .committed("fixture-mixed", &format!("done/{id}"))
            .await;
    }
    let rows = dead_letters(&child.store, &child.queue, 1).await;
    assert!(
        rows[0]
            .letter
            .reason
            .contains("the gateway panicked twice processing this message: fault injection"),
        "{}",
        rows[0].letter.reason
    );
    assert_eq!(rows[0].letter.body, b"panic please");
    let stderr = child.gateway.stderr();
    assert_eq!(
        stderr
            .matches("the gateway panicked processing this delivery")
            .count(),
        2,
        "one requeue, then the reject:\n{stderr}"
    );

    // SIGHUP: the unchanged config reloads with nothing to change; still serving.
    signal(child.gateway.pid(), "HUP");
    child
        .gateway
        .wait_stderr("SIGHUP received", Duration::from_secs(10))
        .await;
    child
        .gateway
        .wait_stderr("reload applied", Duration::from_secs(30))
        .await;
    let id = unique("after-hup");
    child.publish(&id, b"fine").await;
    child
        .committed("fixture-mixed", &format!("done/{id}"))
        .await;
    signal(child.gateway.pid(), "TERM");
    let finished = child.gateway.finish(Duration::from_secs(40)).await;
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_within_the_grace_period_while_the_store_is_locked() {
    use sqlx::Connection;
    let mut child = start("fixture-mixed", "", None).await;
    let db = child.dir.path().join("carteiro.db");
    // Another process's write lock: every write of the gateway fails as busy.
    let mut locker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open the gateway's SQLite file");
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut locker)
        .await
        .expect("take the write lock");
    child.publish(&unique("blocked"), b"fine").await;
    // And a dead letter for the archiver, which must not wait for the store forever.
    child
        .client
        .publish(
            &format!("{}.dlx", child.queue),
            "",
            lapin::BasicProperties::default(),
            b"to archive",
        )
        .await;
    child
        .gateway
        .wait_stderr("store unavailable", Duration::from_secs(60))
        .await;
    signal(child.gateway.pid(), "TERM");
    let started = std::time::Instant::now();
    // 30 s grace for in-flight deliveries, then every task ends.
    let finished = child.gateway.finish(Duration::from_secs(50)).await;
    assert!(started.elapsed() < Duration::from_secs(50));
    assert!(finished.code.is_some(), "exited: {}", finished.stderr);
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut locker)
        .await
        .expect("release");
    // Nothing was lost: the delivery and the dead letter are back in their queues.
    let depth = super::queue_depth(&child.client, &child.queue).await;
    let dlq = super::queue_depth(&child.client, &format!("{}.dlq", child.queue)).await;
    assert_eq!((depth, dlq), (1, 1), "both wait in the broker");
}

/// A broker that stops answering (a blackholed network, with heartbeats too slow to notice
/// it soon) does not hold a SIGTERM: each step of a route's stop that waits for the broker
/// (the consumer's cancel, the channel's and connection's close) gives up after 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_while_the_broker_does_not_answer() {
    let url = amqp_url();
    let (hole, proxied) = Blackhole::in_front_of(&url).await;
    let child = start_edited("fixture-mixed", "", None, |toml| {
        toml.replace(&url, &proxied)
            .replace("heartbeat = \"5s\"", "heartbeat = \"120s\"")
    })
    .await;
    hole.close();
    signal(child.gateway.pid(), "TERM");
    let started = std::time::Instant::now();
    let finished = child.gateway.finish(Duration::from_secs(90)).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(40),
        "took {took:?}: {}",
        finished.stderr
    );
    assert!(
        finished
            .stderr
            .contains("route stop: a step did not end in time"),
        "{}",
        finished.stderr
    );
}
