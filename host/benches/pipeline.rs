//! Full-pipeline throughput — consume, `enrollment` handler, inbox + kv + outbox group
//! commit, ack — on SQLite and on PostgreSQL, side by side with a plain lapin consumer that
//! only acks (the broker's ceiling on this machine). Rounds alternate SQLite, PostgreSQL,
//! baseline; every run gets fresh random queues and a fresh database.
//!
//! Workload per run: `BENCH_MESSAGES` (default 20,000) persistent messages with distinct
//! message ids and an enrollment body are published (with confirms) into the route's queue
//! before the consumer starts; the clock runs from the first handler run (baseline: first
//! delivery) until every message is acked. Relay disabled: this measures the pipeline only.
//!
//! Run: `bench/run.sh`, or with the services up and the URLs exported:
//! `CARTEIRO_TEST_AMQP_URL=... CARTEIRO_TEST_POSTGRES_URL=... cargo bench -p carteiro --bench pipeline`
//! Knobs: `BENCH_MESSAGES`, `BENCH_ROUNDS` (default 3), `BENCH_PREFETCH` (default 256),
//! `BENCH_SYSTEMS` (default `sqlite,postgres,baseline`; also `sqlite-native`, `postgres-native`:
//! the enrollment handler compiled into the gateway, no Wasm), `BENCH_REUSE=N` (the plugin
//! with `isolation = "per-batch"`, `reuse = N`), `BENCH_BATCH=N` (the route with
//! `batch = { max = N, wait = BENCH_BATCH_WAIT }`, default wait 20ms; needs a plugin that
//! exports handle-batch: `BENCH_PLUGIN=enrollment-py-batch`).

mod common;
mod native_enrollment;

use carteiro::common::labels::Outcome;
use carteiro::config::{self, Config};
use carteiro::metrics::Metrics;
use carteiro::runtime::native::NativeHandler;
use carteiro::topology::{self, DeclaredRoute, QueueType, RouteTopology};
use common::{
    CpuBudget, CpuSample, Named, amqp_url, connect_amqp, create_pg_database,
    delete_queues_and_exchange, drop_pg_database, env_list, env_or, median, postgres_admin, unique,
};
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum System {
    Sqlite,
    Postgres,
    /// The same gateway with the enrollment handler compiled in (no Wasm).
    SqliteNative,
    PostgresNative,
    Baseline,
}

impl System {
    fn on_postgres(self) -> bool {
        matches!(self, System::Postgres | System::PostgresNative)
    }

    fn native(self) -> bool {
        matches!(self, System::SqliteNative | System::PostgresNative)
    }
}

/// The systems of `BENCH_SYSTEMS`.
impl Named for System {
    const ALL: &'static [System] = &[
        System::Sqlite,
        System::Postgres,
        System::SqliteNative,
        System::PostgresNative,
        System::Baseline,
    ];

    fn name(self) -> &'static str {
        match self {
            System::Sqlite => "sqlite",
            System::Postgres => "postgres",
            System::SqliteNative => "sqlite-native",
            System::PostgresNative => "postgres-native",
            System::Baseline => "baseline",
        }
    }
}

struct Settings {
    amqp: String,
    pg_admin: Option<String>,
    messages: usize,
    rounds: usize,
    prefetch: u16,
    systems: Vec<System>,
    /// The enrollment handler's language: `enrollment`, `enrollment-py`, `enrollment-js`.
    plugin: String,
}

/// One timed run.
struct Run {
    rate: f64,
    elapsed: Duration,
    /// Where the CPU went during the timed window, per message.
    budget: CpuBudget,
    /// Mean seconds per plugin `handle` and per delivery (receipt to settlement).
    handler_mean: Option<f64>,
    delivery_mean: Option<f64>,
}

fn settings() -> Settings {
    let amqp = amqp_url();
    let mut systems = env_list("BENCH_SYSTEMS", "sqlite,postgres,baseline", System::parse);
    let pg_admin = postgres_admin(&mut systems, |system| system.on_postgres());
    Settings {
        amqp,
        pg_admin,
        messages: env_or("BENCH_MESSAGES", 20_000),
        rounds: env_or("BENCH_ROUNDS", 3),
        prefetch: env_or("BENCH_PREFETCH", 256),
        systems,
        plugin: std::env::var("BENCH_PLUGIN").unwrap_or_else(|_| "enrollment".into()),
    }
}

/// The same topology the gateway declares for `route` (so its own declare is a no-op).
fn route_topology(config: &Config) -> RouteTopology {
    config.routes[0].topology()
}

/// Publishes `n` enrollment messages to `queue` through the default exchange, with confirms
/// (a window of 1,000 unconfirmed at a time).
async fn publish_all(conn: &Connection, queue: &str, n: usize) {
    let channel = conn.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut pending = Vec::with_capacity(1_000);
    for i in 0..n {
        let body = format!(r#"{{"matricula_id":"M{i}","usuario_id":"U","curso_id":"C"}}"#);
        let props = BasicProperties::default()
            .with_message_id(format!("msg-{i}").into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                Default::default(),
                body.as_bytes(),
                props,
            )
            .await
            .expect("publish");
        pending.push(confirm);
        if pending.len() == 1_000 || i + 1 == n {
            for c in pending.drain(..) {
                let confirmation = c.await.expect("confirm");
                assert!(!confirmation.is_nack(), "the broker nacked a publish");
            }
        }
    }
    let _ = channel.close(200, "published".into()).await;
}

async fn delete_topology(conn: &Connection, declared: &DeclaredRoute) {
    let mut queues = vec![declared.queue.as_str(), declared.dlq.as_str()];
    queues.extend(declared.retry_queues.iter().map(|(_, q)| q.as_str()));
    delete_queues_and_exchange(conn, &queues, &declared.dlx).await;
}

/// Sum and count of a histogram `family` for `route` in the Prometheus text.
fn histogram_mean(text: &str, family: &str, route: &str) -> Option<f64> {
    let label = format!("route=\"{route}\"");
    let find = |suffix: &str| {
        text.lines()
            .find(|l| l.contains(&format!("{family}_{suffix}")) && l.contains(&label))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let (sum, count) = (find("sum")?, find("count")?);
    (count > 0.0).then(|| sum / count)
}

fn gateway_toml(s: &Settings, queue: &str, store_url: &str) -> String {
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/plugins")
        .join(format!("{}.wasm", s.plugin));
    assert!(
        plugin.is_file(),
        "{} is missing: run scripts/build-plugins.sh (and scripts/build-lang-plugins.sh)",
        plugin.display()
    );
    format!(
        r#"
version = 1
[broker]
url = "{amqp}"
[store]
url = "{store_url}"
[relay]
enabled = false
[admin]
listen = ""
[plugins.enrollment]
path = "{plugin}"
timeout = "5s"
{concurrency}
{isolation}
[plugins.enrollment.variables]
events_exchange = "bench.events"
[[routes]]
queue = "{queue}"
plugin = "enrollment"
prefetch = {prefetch}
idempotency_key = "message_id"
{batch}
"#,
        amqp = s.amqp,
        plugin = plugin.display(),
        prefetch = s.prefetch,
        // BENCH_MAX_CONCURRENCY: the plugin's max_concurrency (default: the gateway's).
        concurrency = std::env::var("BENCH_MAX_CONCURRENCY")
            .map(|n| format!("max_concurrency = {n}"))
            .unwrap_or_default(),
        // BENCH_REUSE: one instance serves N deliveries (default: a fresh one per delivery).
        isolation = std::env::var("BENCH_REUSE")
            .map(|n| format!("isolation = \"per-batch\"\nreuse = {n}"))
            .unwrap_or_default(),
        // BENCH_BATCH: deliveries per handle-batch call (default: no batching, `handle`).
        batch = std::env::var("BENCH_BATCH")
            .map(|n| {
                let wait = std::env::var("BENCH_BATCH_WAIT").unwrap_or_else(|_| "20ms".into());
                format!("batch = {{ max = {n}, wait = \"{wait}\" }}")
            })
            .unwrap_or_default(),
    )
}

async fn wait_until(what: &str, timeout: Duration, poll: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(poll).await;
    }
}

/// One gateway run on `system` (SQLite or PostgreSQL).
async fn gateway_run(s: &Settings, system: System) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pg_name, store_url) = match system {
        System::Postgres | System::PostgresNative => {
            let (name, url) = create_pg_database(s.pg_admin.as_deref().expect("pg url")).await;
            (Some(name), url)
        }
        _ => (
            None,
            format!("sqlite://{}/carteiro.db", dir.path().display()),
        ),
    };
    let queue = unique(&format!("bench-pipeline-{}", system.name()));
    let path = dir.path().join("carteiro.toml");
    std::fs::write(&path, gateway_toml(s, &queue, &store_url)).expect("write config");
    let config = config::load(&path).unwrap_or_else(|e| panic!("bench config invalid: {e}"));

    let conn = connect_amqp(&s.amqp).await;
    let declared = topology::declare_route(&conn, &route_topology(&config))
        .await
        .expect("declare the route's topology");
    publish_all(&conn, &queue, s.messages).await;

    let metrics = Arc::new(Metrics::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut native_handlers = BTreeMap::new();
    if system.native() {
        assert_eq!(
            s.plugin, "enrollment",
            "only the Rust enrollment handler has a native twin"
        );
        let handler: Arc<dyn NativeHandler> = Arc::new(native_enrollment::Enrollment);
        native_handlers.insert("enrollment".to_owned(), handler);
    }
    let options = carteiro::gateway::LiveOptions {
        metrics: metrics.clone(),
        config_path: None,
        signals: None,
        native_handlers,
    };
    let gateway = tokio::spawn(carteiro::gateway::run_live(config, options, async move {
        let _ = stopped.await;
    }));
    let n = s.messages as u64;
    wait_until(
        "the first handler run",
        Duration::from_secs(120),
        Duration::from_millis(1),
        || metrics.handler_runs(&queue) > 0 || gateway.is_finished(),
    )
    .await;
    assert!(!gateway.is_finished(), "the gateway stopped early");
    let (started, cpu_start) = (Instant::now(), CpuSample::now());
    let deadline = started + Duration::from_secs(900);
    while metrics.delivered(&queue, Outcome::Acked) < n {
        if Instant::now() > deadline || gateway.is_finished() {
            let text = metrics.encode();
            let lines: Vec<&str> = text.lines().filter(|l| l.contains("deliveries")).collect();
            panic!(
                "{}: {} of {n} acked; deliveries so far:\n{}",
                system.name(),
                metrics.delivered(&queue, Outcome::Acked),
                lines.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    let budget = cpu_start.until(&CpuSample::now(), elapsed, s.messages - 1);
    let text = metrics.encode();
    let _ = stop.send(());
    match tokio::time::timeout(Duration::from_secs(60), gateway).await {
        Ok(Ok(Ok(()))) => {}
        other => eprintln!("warning: gateway shutdown: {other:?}"),
    }
    delete_topology(&conn, &declared).await;
    let _ = conn.close(200, "done".into()).await;
    if let (Some(name), Some(admin)) = (pg_name, s.pg_admin.as_deref()) {
        drop_pg_database(admin, &name).await;
    }
    Run {
        // The first message was already handled when the clock started.
        rate: (s.messages - 1) as f64 / elapsed.as_secs_f64(),
        elapsed,
        budget,
        handler_mean: histogram_mean(&text, "handler_seconds", &queue),
        delivery_mean: histogram_mean(&text, "delivery_seconds", &queue),
    }
}

/// The broker's ceiling: a plain consumer that acks each delivery, same queue shape and N.
async fn baseline_run(s: &Settings) -> Run {
    let queue = unique("bench-pipeline-baseline");
    let topology = RouteTopology {
        queue: queue.clone(),
        queue_type: QueueType::Classic,
        bindings: Vec::new(),
        retry_delays: carteiro::pipeline::RetryConfig::default().backoff,
        max_attempts: carteiro::pipeline::RetryConfig::default().max_attempts,
        message_ttl: None,
        max_length: None,
    };
    let conn = connect_amqp(&s.amqp).await;
    let declared = topology::declare_route(&conn, &topology)
        .await
        .expect("declare");
    publish_all(&conn, &queue, s.messages).await;

    let channel = conn.create_channel().await.expect("channel");
    channel
        .basic_qos(s.prefetch, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "bench-baseline".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut acked = 0usize;
    let mut clock: Option<(Instant, CpuSample)> = None;
    while acked < s.messages {
        let delivery = tokio::time::timeout(Duration::from_secs(60), consumer.next())
            .await
            .expect("baseline delivery within 60 s")
            .expect("consumer open")
            .expect("delivery");
        if clock.is_none() {
            clock = Some((Instant::now(), CpuSample::now()));
        }
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
        acked += 1;
    }
    let (started, cpu_start) = clock.expect("started");
    let elapsed = started.elapsed();
    let budget = cpu_start.until(&CpuSample::now(), elapsed, s.messages - 1);
    let _ = channel.close(200, "done".into()).await;
    delete_topology(&conn, &declared).await;
    let _ = conn.close(200, "done".into()).await;
    Run {
        rate: (s.messages - 1) as f64 / elapsed.as_secs_f64(),
        elapsed,
        budget,
        handler_mean: None,
        delivery_mean: None,
    }
}

fn ms(v: Option<f64>) -> String {
    v.map(|s| format!("{:.2} ms", s * 1e3))
        .unwrap_or_else(|| "-".into())
}

#[tokio::main]
async fn main() {
    let s = settings();
    println!(
        "pipeline: plugin {}, {} messages per run, prefetch {}, {} rounds of [{}], relay off, commit_batch default",
        s.plugin,
        s.messages,
        s.prefetch,
        s.rounds,
        s.systems
            .iter()
            .map(|x| x.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut results: Vec<(System, Vec<f64>)> = s.systems.iter().map(|x| (*x, Vec::new())).collect();
    for round in 1..=s.rounds {
        for (system, rates) in results.iter_mut() {
            let system = *system;
            let run = match system {
                System::Baseline => baseline_run(&s).await,
                other => gateway_run(&s, other).await,
            };
            println!(
                "round {round} {:<15} {:>9.0} msg/s  ({:>6.2} s, host cpu {:.2} cores, handler mean {}, delivery mean {})\n        {}",
                system.name(),
                run.rate,
                run.elapsed.as_secs_f64(),
                run.budget.own_cores,
                ms(run.handler_mean),
                ms(run.delivery_mean),
                run.budget,
            );
            rates.push(run.rate);
        }
    }
    println!("--- medians over {} rounds", s.rounds);
    let baseline = results
        .iter()
        .find(|(x, _)| *x == System::Baseline)
        .map(|(_, r)| median(r));
    for (system, rates) in &results {
        let m = median(rates);
        let ratio = match baseline {
            Some(b) if *system != System::Baseline => format!("  = {:.2} x baseline", m / b),
            _ => String::new(),
        };
        let per_round = rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" / ");
        println!(
            "{:<15} median {:>9.0} msg/s{ratio}   (rounds: {per_round})",
            system.name(),
            m
        );
    }
    for (wasm, native) in [
        (System::Sqlite, System::SqliteNative),
        (System::Postgres, System::PostgresNative),
    ] {
        let find = |x: System| {
            results
                .iter()
                .find(|(y, _)| *y == x)
                .map(|(_, r)| median(r))
        };
        if let (Some(w), Some(n)) = (find(wasm), find(native)) {
            println!(
                "{}: Wasm / native = {:.3} (the sandbox costs {:.1} % of native throughput)",
                wasm.name(),
                w / n,
                (1.0 - w / n) * 100.0
            );
        }
    }
    println!("goal: >= 5000 msg/s per gateway");
    // The gateway runs in this process: its peak is the gateway's plus the publisher's.
    if let Some(peak) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:").map(str::to_owned))
        })
    {
        println!(
            "peak RSS of this process (gateway + publisher): {}",
            peak.trim()
        );
    }
}
