//! The outbox relay against the classic polling publisher, side by side (alternating rounds,
//! fresh database, exchange and sink queue per run), on SQLite and PostgreSQL.
//!
//! (a) Drain rate: `BENCH_RELAY_ROWS` (default 20,000) rows are committed with
//!     `commit_batch` (`BENCH_RELAY_KEYS` ordering keys, default 50), then the publisher runs until nothing is pending.
//!     Rows/s, every row confirmed by the broker.
//! (b) Commit-to-publish latency: one row at a time is committed through a `GroupCommitter`
//!     at a steady rate (`BENCH_LATENCY_RATE`/s, default 200, for `BENCH_LATENCY_SECS`,
//!     default 10); a consumer on a queue bound to the rows' exchange records when each
//!     `message_id` arrives. Latency = arrival − return of `commit`. p50 / p99 / max.
//! (c) CDC against polling (part `cdc`, PostgreSQL only, not in the default parts): per round,
//!     each of `BENCH_CDC_SYSTEMS` (default `cdc,relay,poller`) in turn, alternating:
//!     - stream drain: the system runs (the CDC relay holds its slot), then
//!       `BENCH_RELAY_ROWS` rows are committed as fast as `commit_batch` takes batches of 256;
//!       rows/s from the first commit until no row is pending;
//!     - the latency run of (b) on it;
//!     and, for both, the PostgreSQL server's CPU per row: utime + stime from
//!     `/proc/<pid>/stat` of the postmaster listening on the port of
//!     `CARTEIRO_TEST_POSTGRES_URL`, its living children, and (its cutime + cstime) the
//!     children it reaped inside the window; the commits' own cost is in it, the same for
//!     every system.
//!
//! Compared systems:
//! - `relay`: `carteiro::relay::Relay` (max_in_flight 1,024, the default), woken by the committer's
//!   `outbox_committed()` notify, 1 s poll backstop (the default).
//! - `cdc` (PostgreSQL, part `cdc` only): the same `Relay` with `[relay] mode = "cdc"`: rows
//!   read from a logical replication slot of its own (`bench_cdc_<uuid>`, dropped after the
//!   run), not polled. It publishes a backlog already in the table through the polling path
//!   before it reads the slot, so it is measured on rows committed while it runs.
//! - `lanes` (drain only): no store at all, just the ceiling of the relay's publishing rule on
//!   this box: one task per ordering key publishing its rows one after another through a
//!   `ConfirmedPublisher` sized like the relay's, each row awaiting its own confirm before
//!   the next. The relay cannot drain faster than this.
//! - `pipelined` (drain only, opt-in): no store and no ordering rule, `BENCH_PIPE_CHANNELS`
//!   (4) channels publishing batches of `BENCH_PIPE_BATCH` (64) back to back: what the
//!   broker and lapin take on this box at all.
//! - `poller`: the classic approach, implemented here: every 1 s select the unpublished rows
//!   (id order, up to 5,000), publish them all, wait for every confirm, then mark the batch
//!   published with one UPDATE. When draining a backlog it loops without sleeping while a
//!   poll came back full.
//!
//! Every system publishes the messages the relay would (`message_id`, persistent, the commit
//! time, the row's headers, the content type: `carteiro::relay::event_properties`, the
//! relay's own function), since a header table alone costs the broker ~20 µs a message here.
//!
//! Run: `bench/run.sh`, or with the services up and the URLs exported:
//! `CARTEIRO_TEST_AMQP_URL=... CARTEIRO_TEST_POSTGRES_URL=... cargo bench -p carteiro --bench relay`
//! Knobs: `BENCH_ROUNDS` (default 3), `BENCH_BACKENDS` (default `sqlite,postgres`),
//! `BENCH_RELAY_ROWS`, `BENCH_LATENCY_RATE`, `BENCH_LATENCY_SECS`, `BENCH_RELAY_PARTS`
//! (default `drain,latency`; `cdc` for (c)), `BENCH_MAX_IN_FLIGHT` (the relay's window,
//! default 1,024), `BENCH_DRAIN_SYSTEMS` (default `relay,lanes,poller`; also `pipelined`),
//! `BENCH_RELAY_KEYS`, `BENCH_CDC_SYSTEMS` (default `cdc,relay,poller`).

mod common;

use carteiro::metrics::Metrics;
use carteiro::relay::{Relay, event_properties};
use carteiro::store::{CommitOutcome, CommitRequest, GroupCommitter, NewOutboxRow, Store};
use common::{
    Backend, CpuBudget, CpuSample, Named, amqp_url, backends, connect_amqp, create_pg_database,
    delete_queues_and_exchange, drop_pg_database, env_list, env_or, median,
    postgres_server_seconds, unique,
};
use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ExchangeKind};
use sqlx::Connection as _;
use sqlx::Row;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const POLL_INTERVAL: Duration = Duration::from_secs(1);
const POLL_LIMIT: i64 = 5_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Publisher {
    Relay,
    Lanes,
    Poller,
    Pipelined,
    Cdc,
}

/// The publishers of `BENCH_DRAIN_SYSTEMS`.
impl Named for Publisher {
    const ALL: &'static [Publisher] = &[
        Publisher::Relay,
        Publisher::Lanes,
        Publisher::Poller,
        Publisher::Pipelined,
        Publisher::Cdc,
    ];

    fn name(self) -> &'static str {
        match self {
            Publisher::Relay => "relay",
            Publisher::Lanes => "lanes",
            Publisher::Poller => "poller",
            Publisher::Pipelined => "pipelined",
            Publisher::Cdc => "cdc",
        }
    }
}

struct Settings {
    amqp: String,
    pg_admin: Option<String>,
    backends: Vec<Backend>,
    rounds: usize,
    rows: usize,
    rate: u64,
    secs: u64,
    parts: String,
    max_in_flight: usize,
    keys: usize,
    drain_systems: Vec<Publisher>,
    /// The systems of part `cdc`.
    cdc_systems: Vec<Publisher>,
    /// The port of the PostgreSQL server, to find its processes in `/proc`.
    pg_port: Option<u16>,
}

fn settings() -> Settings {
    let amqp = amqp_url();
    let (backends, pg_admin) = backends();
    let mut drain_systems = env_list(
        "BENCH_DRAIN_SYSTEMS",
        "relay,lanes,poller",
        Publisher::parse,
    );
    if drain_systems.contains(&Publisher::Cdc) {
        // It would publish the backlog through the polling path: not the slot's figure.
        println!(
            "BENCH_DRAIN_SYSTEMS: cdc left out of the backlog drain; BENCH_RELAY_PARTS=cdc measures it"
        );
        drain_systems.retain(|p| *p != Publisher::Cdc);
    }
    let cdc_systems = env_list("BENCH_CDC_SYSTEMS", "cdc,relay,poller", Publisher::parse)
        .into_iter()
        .filter(|p| matches!(p, Publisher::Cdc | Publisher::Relay | Publisher::Poller))
        .collect();
    let pg_port = pg_admin.as_deref().map(|admin| {
        url::Url::parse(admin)
            .ok()
            .and_then(|u| u.port())
            .unwrap_or(5432)
    });
    Settings {
        amqp,
        pg_admin,
        cdc_systems,
        pg_port,
        backends,
        rounds: env_or("BENCH_ROUNDS", 3),
        rows: env_or("BENCH_RELAY_ROWS", 20_000),
        rate: env_or("BENCH_LATENCY_RATE", 200),
        secs: env_or("BENCH_LATENCY_SECS", 10),
        max_in_flight: env_or("BENCH_MAX_IN_FLIGHT", 1024),
        keys: env_or("BENCH_RELAY_KEYS", 50usize).max(1),
        drain_systems,
        parts: std::env::var("BENCH_RELAY_PARTS").unwrap_or_else(|_| "drain,latency".into()),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------- environment of one run

/// A fresh database, exchange and sink queue.
struct Fixture {
    _dir: tempfile::TempDir,
    store_url: String,
    pg_name: Option<String>,
    store: Store,
    conn: Connection,
    exchange: String,
    sink: String,
    config: carteiro::config::Config,
    /// `cdc`: the run's replication slot (and publication), dropped by [`Fixture::close`].
    slot: Option<String>,
}

impl Fixture {
    async fn new(s: &Settings, backend: Backend) -> Fixture {
        Self::open(s, backend, false).await
    }

    /// The fixture `which` runs on: for `cdc`, a relay config with `mode = "cdc"`.
    async fn for_publisher(s: &Settings, backend: Backend, which: Publisher) -> Fixture {
        Self::open(s, backend, which == Publisher::Cdc).await
    }

    async fn open(s: &Settings, backend: Backend, cdc: bool) -> Fixture {
        assert!(
            !cdc || backend == Backend::Postgres,
            "the CDC relay reads a PostgreSQL slot"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let (pg_name, store_url) = match backend {
            Backend::Postgres => {
                let (name, url) = create_pg_database(s.pg_admin.as_deref().expect("pg url")).await;
                (Some(name), url)
            }
            Backend::Sqlite => (None, format!("sqlite://{}/relay.db", dir.path().display())),
        };
        let store = Store::connect(&store_url, 8).await.expect("store");
        store.migrate().await.expect("migrate");
        let conn = connect_amqp(&s.amqp).await;
        let exchange = unique("bench-relay-out");
        let sink = unique("bench-relay-sink");
        declare_sink(&conn, &exchange, &sink).await;
        let slot = cdc.then(|| format!("bench_cdc_{}", uuid::Uuid::now_v7().simple()));
        let mode = match &slot {
            Some(slot) => format!("mode = \"cdc\"\nslot = \"{slot}\"\npublication = \"{slot}\"\n"),
            None => String::new(),
        };
        let path = dir.path().join("carteiro.toml");
        std::fs::write(
            &path,
            format!(
                "version = 1\n[broker]\nurl = \"{}\"\n[store]\nurl = \"{store_url}\"\n[relay]\nmax_in_flight = {}\npoll_interval = \"1s\"\n{mode}",
                s.amqp, s.max_in_flight
            ),
        )
        .expect("write config");
        let config = carteiro::config::load(&path).unwrap_or_else(|e| panic!("config: {e}"));
        Fixture {
            _dir: dir,
            store_url,
            pg_name,
            store,
            conn,
            exchange,
            sink,
            config,
            slot,
        }
    }

    async fn sink_depth(&self) -> u32 {
        let channel = self.conn.create_channel().await.expect("channel");
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let sink = self.sink.as_str().into();
        let q = channel
            .queue_declare(sink, passive, FieldTable::default())
            .await
            .expect("passive declare");
        let _ = channel.close(200, "probe".into()).await;
        q.message_count()
    }

    /// Checks that every row reached the sink, closes the fixture and returns rows/s over
    /// `elapsed`; `name` says which system fell short.
    async fn rows_per_second(self, s: &Settings, name: &str, elapsed: Duration) -> f64 {
        let depth = self.sink_depth().await;
        assert!(
            depth as usize >= s.rows,
            "{name}: only {depth} of {} rows reached the sink",
            s.rows
        );
        self.close(s).await;
        s.rows as f64 / elapsed.as_secs_f64()
    }

    async fn close(self, s: &Settings) {
        delete_queues_and_exchange(&self.conn, &[self.sink.as_str()], &self.exchange).await;
        let _ = self.conn.close(200, "done".into()).await;
        drop(self.store);
        // Before the database: PostgreSQL refuses to drop a database a slot belongs to.
        if let Some(slot) = &self.slot {
            drop_slot(&self.store_url, slot).await;
        }
        if let (Some(name), Some(admin)) = (self.pg_name, s.pg_admin.as_deref()) {
            drop_pg_database(admin, &name).await;
        }
    }
}

/// Drops a run's replication slot, retrying while its WAL sender is still going away after
/// the relay stopped: a slot left behind holds the server's WAL (and its database).
async fn drop_slot(store_url: &str, slot: &str) {
    for _ in 0..30 {
        if let Ok(mut conn) = sqlx::PgConnection::connect(store_url).await {
            let dropped = sqlx::query(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1",
            )
            .bind(slot)
            .execute(&mut conn)
            .await;
            let _ = conn.close().await;
            if dropped.is_ok() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "could not drop replication slot {slot}: run SELECT pg_drop_replication_slot('{slot}') \
         or it keeps the server's WAL"
    );
}

/// Declares `exchange` (durable, topic) and the queue `sink` bound to it with `#`.
async fn declare_sink(conn: &Connection, exchange: &str, sink: &str) {
    let channel = conn.create_channel().await.expect("channel");
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let no_args = FieldTable::default;
    channel
        .exchange_declare(exchange.into(), ExchangeKind::Topic, durable, no_args())
        .await
        .expect("declare exchange");
    channel
        .queue_declare(sink.into(), QueueDeclareOptions::default(), no_args())
        .await
        .expect("declare sink");
    channel
        .queue_bind(
            sink.into(),
            exchange.into(),
            "#".into(),
            QueueBindOptions::default(),
            no_args(),
        )
        .await
        .expect("bind sink");
    let _ = channel.close(200, "declared".into()).await;
}

/// The properties the relay gives row `i` of a storeless run: a fresh event id, committed now.
fn seq_properties(i: usize) -> lapin::BasicProperties {
    let headers = [("x-seq".to_owned(), i.to_string())];
    event_properties(
        &uuid::Uuid::now_v7().to_string(),
        unix_ms_now(),
        &headers,
        Some("application/json"),
    )
    .expect("bench rows are publishable")
}

fn row(exchange: &str, keys: usize, i: usize) -> CommitRequest {
    let key = format!("key-{}", i % keys);
    CommitRequest {
        route: "bench".into(),
        inbox_key: unique("bench"),
        namespace: "bench".into(),
        reads: Vec::new(),
        writes: Vec::new(),
        outbox: vec![NewOutboxRow {
            event_id: uuid::Uuid::now_v7().to_string(),
            route: "bench".into(),
            plugin: "bench".into(),
            exchange: exchange.into(),
            routing_key: "bench.event".into(),
            headers: vec![("x-seq".into(), i.to_string())],
            content_type: Some("application/json".into()),
            payload: format!(r#"{{"key":"{key}","seq":{i}}}"#).into_bytes(),
            ordering_key: key,
        }],
    }
}

/// Commits rows `0..rows` ([`row`]) in batches of 256, each batch checked (`what` names the
/// commit in a failure).
async fn commit_rows(store: &Store, exchange: &str, keys: usize, rows: usize, what: &str) {
    let mut batch = Vec::with_capacity(256);
    for i in 0..rows {
        batch.push(row(exchange, keys, i));
        if batch.len() == 256 || i + 1 == rows {
            let outcomes = store.commit_batch(&batch).await.expect(what);
            assert!(outcomes.iter().all(|o| *o == CommitOutcome::Committed));
            batch.clear();
        }
    }
}

/// A one-connection pool for the clock's "anything pending?" probe, which must stay cheap:
/// `outbox_status` counts every pending row, which on a 20,000-row backlog every 20 ms took a
/// good share of a core from the systems measured.
async fn pending_probe(store_url: &str) -> sqlx::AnyPool {
    sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(store_url)
        .await
        .expect("probe connects to the store")
}

/// Looks through `probe` every 20 ms until `finished()` (asked before each look) and no row
/// is pending; past `deadline`, fails with `stuck(the first row still pending)`.
async fn wait_none_pending(
    probe: &sqlx::AnyPool,
    deadline: Instant,
    finished: impl Fn() -> bool,
    stuck: impl Fn(Option<i64>) -> String,
) {
    loop {
        let finished = finished();
        let first: Option<i64> =
            sqlx::query_scalar("SELECT id FROM outbox WHERE published_at IS NULL LIMIT 1")
                .fetch_optional(probe)
                .await
                .expect("probe");
        if finished && first.is_none() {
            return;
        }
        assert!(Instant::now() < deadline, "{}", stuck(first));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

// ---------------------------------------------------------------- the polling baseline

/// The classic polling publisher: every `POLL_INTERVAL`, take the unpublished rows in id
/// order, publish them all, wait for every confirm, then mark the batch with one UPDATE.
async fn run_poller(store_url: String, amqp: String, stop: CancellationToken) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(2)
        .connect(&store_url)
        .await
        .expect("poller connects to the store");
    let conn = connect_amqp(&amqp).await;
    let channel = conn.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        loop {
            let rows = sqlx::query(
                "SELECT id, event_id, exchange, routing_key, headers, content_type, payload, \
                 created_at FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT $1",
            )
            .bind(POLL_LIMIT)
            .fetch_all(&pool)
            .await
            .expect("poll");
            if rows.is_empty() {
                break;
            }
            let mut confirms = Vec::with_capacity(rows.len());
            let mut ids = Vec::with_capacity(rows.len());
            for r in &rows {
                let id: i64 = r.get("id");
                let event_id: String = r.get("event_id");
                let exchange: String = r.get("exchange");
                let routing_key: String = r.get("routing_key");
                let headers: String = r.get("headers");
                let headers: Vec<(String, String)> =
                    serde_json::from_str(&headers).expect("stored headers are JSON");
                let content_type: Option<String> = r.get("content_type");
                let payload: Vec<u8> = r.get("payload");
                let created_at: i64 = r.get("created_at");
                let props =
                    event_properties(&event_id, created_at, &headers, content_type.as_deref())
                        .expect("bench rows are publishable");
                let confirm = channel
                    .basic_publish(
                        exchange.into(),
                        routing_key.into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..Default::default()
                        },
                        &payload,
                        props,
                    )
                    .await
                    .expect("publish");
                confirms.push(confirm);
                ids.push(id);
            }
            for c in confirms {
                let confirmation = c.await.expect("confirm");
                assert!(!confirmation.is_nack(), "broker nacked");
            }
            let list = ids
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE outbox SET published_at = $1 WHERE id IN ({list})"
            )))
            .bind(now)
            .execute(&pool)
            .await
            .expect("mark published");
            if (rows.len() as i64) < POLL_LIMIT {
                break;
            }
        }
    }
    let _ = channel.close(200, "done".into()).await;
    let _ = conn.close(200, "done".into()).await;
    pool.close().await;
}

/// The publishing rule alone, no store: one task per ordering key publishes its share of
/// `rows` one message after another, each awaiting its own confirm. Returns rows/s.
async fn lanes_run(s: &Settings, backend: Backend) -> (f64, CpuBudget) {
    let f = Fixture::new(s, backend).await;
    let conn = Arc::new(connect_amqp(&s.amqp).await);
    let publisher = carteiro::broker::ConfirmedPublisher::open(
        conn.clone(),
        carteiro::broker::PublisherOptions::for_in_flight(s.max_in_flight),
    )
    .await
    .expect("publisher");
    let (started, cpu) = (Instant::now(), CpuSample::now());
    let tasks: Vec<_> = (0..s.keys)
        .map(|k| {
            let publisher = publisher.clone();
            let exchange = f.exchange.clone();
            let n = s.rows / s.keys + usize::from(k < s.rows % s.keys);
            tokio::spawn(async move {
                for i in 0..n {
                    let msg = carteiro::broker::Outgoing {
                        exchange: exchange.clone(),
                        routing_key: "bench.event".into(),
                        properties: seq_properties(i),
                        body: format!(r#"{{"key":"key-{k}","seq":{i}}}"#).into_bytes(),
                        mandatory: true,
                    };
                    publisher
                        .publish(msg, Duration::from_secs(30))
                        .await
                        .expect("confirmed");
                }
            })
        })
        .collect();
    finish_storeless("lanes", s, f, &conn, tasks, (started, cpu)).await
}

/// Batches pipelined on a few confirm channels, no store, no ordering: the box's ceiling.
async fn pipelined_run(s: &Settings, backend: Backend) -> (f64, CpuBudget) {
    let f = Fixture::new(s, backend).await;
    let conn = connect_amqp(&s.amqp).await;
    let channels: usize = env_or("BENCH_PIPE_CHANNELS", 4);
    let batch: usize = env_or("BENCH_PIPE_BATCH", 64);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (started, cpu) = (Instant::now(), CpuSample::now());
    let mut tasks = Vec::new();
    for _ in 0..channels {
        let ch = conn.create_channel().await.expect("channel");
        ch.confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .expect("confirm");
        let next = next.clone();
        let exchange = f.exchange.clone();
        let rows = s.rows;
        tasks.push(tokio::spawn(async move {
            loop {
                let from = next.fetch_add(batch, std::sync::atomic::Ordering::Relaxed);
                if from >= rows {
                    break;
                }
                let mut confirms = Vec::new();
                for i in from..(from + batch).min(rows) {
                    let props = seq_properties(i);
                    let body = format!(r#"{{"seq":{i}}}"#).into_bytes();
                    confirms.push(
                        ch.basic_publish(
                            exchange.as_str().into(),
                            "bench.event".into(),
                            lapin::options::BasicPublishOptions {
                                mandatory: true,
                                immediate: false,
                            },
                            &body,
                            props,
                        )
                        .await
                        .expect("publish"),
                    );
                }
                for c in futures::future::join_all(confirms).await {
                    assert!(matches!(c, Ok(lapin::Confirmation::Ack(None))));
                }
            }
        }));
    }
    finish_storeless("pipelined", s, f, &conn, tasks, (started, cpu)).await
}

/// Ends a run with no store: waits for its publishing tasks, stops the clock, checks every
/// row reached the sink. Returns rows/s and the CPU budget.
async fn finish_storeless(
    name: &str,
    s: &Settings,
    f: Fixture,
    conn: &Connection,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    (started, cpu): (Instant, CpuSample),
) -> (f64, CpuBudget) {
    for t in tasks {
        t.await.expect("publishing task");
    }
    let elapsed = started.elapsed();
    let budget = cpu.until(&CpuSample::now(), elapsed, s.rows);
    let _ = conn.close(200, "done".into()).await;
    (f.rows_per_second(s, name, elapsed).await, budget)
}

/// Starts `which` on the fixture, recording into `metrics`; returns its stop token and task.
fn start(
    which: Publisher,
    f: &Fixture,
    amqp: &str,
    wake: Option<Arc<tokio::sync::Notify>>,
    metrics: Arc<Metrics>,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let task = match which {
        Publisher::Relay | Publisher::Cdc => {
            // The fixture's `[relay] mode` picks polling or the slot.
            assert_eq!(
                f.slot.is_some(),
                which == Publisher::Cdc,
                "{which:?} on a fixture made for another system"
            );
            let relay = Relay::new(
                &f.config.broker,
                &f.config.relay,
                &f.config.store.url,
                f.store.clone(),
                metrics,
                wake,
            );
            let stop = stop.clone();
            tokio::spawn(async move {
                relay.run(stop).await.expect("relay");
            })
        }
        Publisher::Lanes | Publisher::Pipelined => unreachable!("no store to watch"),
        Publisher::Poller => tokio::spawn(run_poller(
            f.store_url.clone(),
            amqp.to_owned(),
            stop.clone(),
        )),
    };
    (stop, task)
}

/// [`start`], then waits until `which` can publish: a CDC relay holds its slot (made, and the
/// table's backlog drained); the others get the half second they always had to connect.
async fn start_ready(
    which: Publisher,
    f: &Fixture,
    amqp: &str,
    wake: Option<Arc<tokio::sync::Notify>>,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let metrics = Arc::new(Metrics::default());
    let publisher = start(which, f, amqp, wake, metrics.clone());
    if which == Publisher::Cdc {
        let deadline = Instant::now() + Duration::from_secs(60);
        while metrics.outbox.cdc_active.get() != 1 {
            assert!(
                !publisher.1.is_finished(),
                "the CDC relay ended before it took its slot"
            );
            assert!(
                Instant::now() < deadline,
                "the CDC relay did not take its slot within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    } else {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    publisher
}

async fn finish(publisher: (CancellationToken, tokio::task::JoinHandle<()>)) {
    publisher.0.cancel();
    tokio::time::timeout(Duration::from_secs(30), publisher.1)
        .await
        .expect("publisher stops within 30 s")
        .expect("publisher task");
}

// ---------------------------------------------------------------- (a) drain

async fn drain_run(s: &Settings, backend: Backend, which: Publisher) -> (f64, CpuBudget) {
    let f = Fixture::for_publisher(s, backend, which).await;
    commit_rows(&f.store, &f.exchange, s.keys, s.rows, "seed").await;
    assert_eq!(
        f.store.outbox_status().await.expect("status").pending,
        s.rows as i64
    );
    let probe = pending_probe(&f.store_url).await;
    let (started, cpu) = (Instant::now(), CpuSample::now());
    let publisher = start(which, &f, &s.amqp, None, Arc::new(Metrics::default()));
    let deadline = started + Duration::from_secs(600);
    wait_none_pending(
        &probe,
        deadline,
        || true,
        |first| format!("{which:?} did not drain: row {first:?} still pending"),
    )
    .await;
    let elapsed = started.elapsed();
    let budget = cpu.until(&CpuSample::now(), elapsed, s.rows);
    probe.close().await;
    assert_eq!(f.store.outbox_status().await.expect("status").pending, 0);
    finish(publisher).await;
    let name = format!("{which:?}");
    (f.rows_per_second(s, &name, elapsed).await, budget)
}

// ---------------------------------------------------------------- (b) latency

struct Latency {
    p50: Duration,
    p99: Duration,
    max: Duration,
    commit_p50: Duration,
    rows: usize,
    /// The PostgreSQL server's CPU per row, µs, from the first commit until every row
    /// arrived (NaN on SQLite or when its processes were not found).
    pg_us: f64,
}

async fn latency_run(s: &Settings, backend: Backend, which: Publisher) -> Latency {
    let f = Fixture::for_publisher(s, backend, which).await;
    let committer = GroupCommitter::spawn(f.store.clone(), 256);

    // Arrival times, recorded by a consumer on the sink.
    let arrivals: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let channel = f.conn.create_channel().await.expect("channel");
    let mut consumer = channel
        .basic_consume(
            f.sink.as_str().into(),
            "bench-latency".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let recorder = {
        let arrivals = arrivals.clone();
        tokio::spawn(async move {
            while let Some(Ok(delivery)) = consumer.next().await {
                let now = Instant::now();
                if let Some(id) = delivery.properties.message_id() {
                    arrivals.lock().expect("lock").insert(id.to_string(), now);
                }
            }
        })
    };

    // Let the publisher connect before the clock matters.
    let publisher = start_ready(which, &f, &s.amqp, Some(committer.outbox_committed())).await;

    let total = (s.rate * s.secs) as usize;
    let pg_before = pg_seconds(s, backend);
    let mut committed: Vec<(String, Instant)> = Vec::with_capacity(total);
    let mut commit_times = Vec::with_capacity(total);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / s.rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0..total {
        tick.tick().await;
        let req = row(&f.exchange, s.keys, i);
        let id = req.outbox[0].event_id.to_string();
        let t = Instant::now();
        let outcome = committer.commit(req).await.expect("commit");
        let done = Instant::now();
        assert_eq!(outcome, CommitOutcome::Committed);
        commit_times.push(done - t);
        committed.push((id, done));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while arrivals.lock().expect("lock").len() < total {
        assert!(
            Instant::now() < deadline,
            "{which:?}: only {} of {total} rows arrived",
            arrivals.lock().expect("lock").len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pg_us = pg_us_per_row(pg_before, pg_seconds(s, backend), total);
    finish(publisher).await;
    let _ = channel.close(200, "done".into()).await;
    recorder.abort();
    drop(committer);

    let arrivals = arrivals.lock().expect("lock").clone();
    let mut latencies: Vec<Duration> = committed
        .iter()
        .map(|(id, done)| {
            let arrived = arrivals.get(id).expect("every row arrived");
            // An arrival before `commit` returned (the relay is that fast) counts as zero.
            arrived.saturating_duration_since(*done)
        })
        .collect();
    latencies.sort();
    commit_times.sort();
    f.close(s).await;
    Latency {
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
        max: *latencies.last().expect("rows"),
        commit_p50: percentile(&commit_times, 0.5),
        rows: total,
        pg_us,
    }
}

// ---------------------------------------------------------------- (c) cdc against polling

/// CPU seconds of the PostgreSQL server so far ([`postgres_server_seconds`] on the port of
/// `CARTEIRO_TEST_POSTGRES_URL`); `None` on SQLite or when its postmaster is not found here.
fn pg_seconds(s: &Settings, backend: Backend) -> Option<f64> {
    match backend {
        Backend::Postgres => s.pg_port.and_then(postgres_server_seconds),
        Backend::Sqlite => None,
    }
}

/// µs of server CPU per row between two [`pg_seconds`] readings; NaN when either is missing.
fn pg_us_per_row(before: Option<f64>, after: Option<f64>, rows: usize) -> f64 {
    match (before, after) {
        (Some(a), Some(b)) => (b - a).max(0.0) * 1e6 / rows.max(1) as f64,
        _ => f64::NAN,
    }
}

/// Stream drain: `which` runs (a CDC relay on its slot), then `s.rows` rows are committed as
/// fast as `commit_batch` takes batches of 256; the clock runs from the first commit until
/// every row is committed and none is pending. Returns rows/s, the CPU budget and the
/// PostgreSQL server's µs per row.
async fn stream_run(s: &Settings, which: Publisher) -> (f64, CpuBudget, f64) {
    let backend = Backend::Postgres;
    let f = Fixture::for_publisher(s, backend, which).await;
    let publisher = start_ready(which, &f, &s.amqp, None).await;
    let probe = pending_probe(&f.store_url).await;
    let pg_before = pg_seconds(s, backend);
    let (started, cpu) = (Instant::now(), CpuSample::now());
    let writer = {
        let (store, exchange, rows, keys) = (f.store.clone(), f.exchange.clone(), s.rows, s.keys);
        tokio::spawn(async move { commit_rows(&store, &exchange, keys, rows, "commit").await })
    };
    let deadline = started + Duration::from_secs(600);
    wait_none_pending(
        &probe,
        deadline,
        || writer.is_finished(),
        |first| format!("{which:?} did not keep up: row {first:?} still pending after 600 s"),
    )
    .await;
    let elapsed = started.elapsed();
    let budget = cpu.until(&CpuSample::now(), elapsed, s.rows);
    let pg_us = pg_us_per_row(pg_before, pg_seconds(s, backend), s.rows);
    writer.await.expect("writer");
    probe.close().await;
    assert_eq!(f.store.outbox_status().await.expect("status").pending, 0);
    finish(publisher).await;
    let name = format!("{which:?}");
    (f.rows_per_second(s, &name, elapsed).await, budget, pg_us)
}

/// The CDC relay needs `wal_level = logical`: say how to get it rather than time out.
async fn require_logical_wal(admin: &str) {
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .expect("connect to PostgreSQL");
    let level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
        .fetch_one(&mut conn)
        .await
        .expect("wal_level");
    let _ = conn.close().await;
    assert_eq!(
        level, "logical",
        "the cdc part needs wal_level = logical: restart the test server \
         (scripts/postgres.sh stop && scripts/postgres.sh start) to pick up its settings"
    );
}

/// (c): per round, each of `s.cdc_systems` in turn on the stream drain, then each on the
/// latency run, on PostgreSQL; medians of the rounds at the end.
async fn cdc_against_polling(s: &Settings) {
    let admin = s.pg_admin.as_deref().expect("PostgreSQL");
    require_logical_wal(admin).await;
    if pg_seconds(s, Backend::Postgres).is_none() {
        println!(
            "no postgres process listening on port {:?} found in /proc: PostgreSQL CPU per row reads NaN",
            s.pg_port
        );
    }
    let names: Vec<&str> = s.cdc_systems.iter().map(|p| p.name()).collect();
    println!(
        "cdc against polling [postgres]: {}; stream drain of {} rows (batches of 256 committed while the system runs, {} ordering keys), then latency at {} rows/s for {} s; {} alternating rounds",
        names.join(", "),
        s.rows,
        s.keys,
        s.rate,
        s.secs,
        s.rounds
    );
    // "system/figure" → one value a round.
    let mut figures: HashMap<String, Vec<f64>> = HashMap::new();
    let mut add = |which: Publisher, figure: &str, value: f64| {
        let key = format!("{}/{figure}", which.name());
        figures.entry(key).or_default().push(value);
    };
    for round in 1..=s.rounds {
        for which in s.cdc_systems.iter().copied() {
            let (rate, budget, pg_us) = stream_run(s, which).await;
            println!(
                "round {round} stream  {:<7} {rate:>9.0} rows/s  postgresql {pg_us:>6.0} µs/row  ({budget})",
                which.name()
            );
            add(which, "rate", rate);
            add(which, "drain_pg", pg_us);
        }
        for which in s.cdc_systems.iter().copied() {
            let l = latency_run(s, Backend::Postgres, which).await;
            println!(
                "round {round} latency {:<7} p50 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms  postgresql {:>6.0} µs/row  ({} rows; commit p50 {:.2} ms)",
                which.name(),
                ms(l.p50),
                ms(l.p99),
                ms(l.max),
                l.pg_us,
                l.rows,
                ms(l.commit_p50),
            );
            add(which, "p50", ms(l.p50));
            add(which, "p99", ms(l.p99));
            add(which, "latency_pg", l.pg_us);
        }
    }
    let get = |name: &str, figure: &str| {
        figures
            .get(&format!("{name}/{figure}"))
            .map_or(f64::NAN, |v| median(v))
    };
    for name in names.iter().copied() {
        println!(
            "cdc [postgres] median of rounds: {name:<7} drain {:.0} rows/s, postgresql {:.0} µs/row; latency p50 {:.2} ms, p99 {:.2} ms, postgresql {:.0} µs/row",
            get(name, "rate"),
            get(name, "drain_pg"),
            get(name, "p50"),
            get(name, "p99"),
            get(name, "latency_pg"),
        );
    }
}

#[tokio::main]
async fn main() {
    let s = settings();
    let systems = [Publisher::Relay, Publisher::Poller];
    for backend in s.backends.clone() {
        let b = format!("{backend:?}").to_lowercase();
        if s.parts.contains("drain") {
            drain(&s, backend, &b).await;
        }
        if s.parts.contains("latency") {
            latency(&s, backend, &b, &systems).await;
        }
        if s.parts.contains("cdc") && backend == Backend::Postgres {
            cdc_against_polling(&s).await;
        }
    }
    if s.parts.contains("cdc") && !s.backends.contains(&Backend::Postgres) {
        println!(
            "part cdc skipped: it runs on PostgreSQL only (BENCH_BACKENDS=postgres and CARTEIRO_TEST_POSTGRES_URL)"
        );
    }
}

async fn drain(s: &Settings, backend: Backend, b: &str) {
    println!(
        "relay drain [{b}]: {} rows, {} ordering keys, max_in_flight {} vs lanes vs poller (1 s, up to {POLL_LIMIT} rows a poll); {} alternating rounds",
        s.rows, s.keys, s.max_in_flight, s.rounds
    );
    let mut drain: HashMap<&str, Vec<f64>> = HashMap::new();
    for round in 1..=s.rounds {
        for which in s.drain_systems.iter().copied() {
            let (rate, budget) = match which {
                Publisher::Lanes => lanes_run(s, backend).await,
                Publisher::Pipelined => pipelined_run(s, backend).await,
                _ => drain_run(s, backend, which).await,
            };
            println!(
                "round {round} {:<7} {rate:>9.0} rows/s  ({budget})",
                which.name()
            );
            drain.entry(which.name()).or_default().push(rate);
        }
    }
    let get = |name: &str| drain.get(name).map_or(f64::NAN, |v| median(v));
    let (relay, lanes, poller) = (get("relay"), get("lanes"), get("poller"));
    println!(
        "drain [{b}] median: relay {relay:.0} rows/s, lanes {lanes:.0} rows/s, poller {poller:.0} rows/s, relay/lanes = {:.2}, relay/poller = {:.2}",
        relay / lanes,
        relay / poller
    );
}

async fn latency(s: &Settings, backend: Backend, b: &str, systems: &[Publisher]) {
    println!(
        "commit-to-publish latency [{b}]: {} rows/s for {} s, one row per commit through a GroupCommitter; {} alternating rounds",
        s.rate, s.secs, s.rounds
    );
    let mut p50s: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut p99s: HashMap<&str, Vec<f64>> = HashMap::new();
    for round in 1..=s.rounds {
        for &which in systems {
            let l = latency_run(s, backend, which).await;
            let pg = if l.pg_us.is_nan() {
                String::new()
            } else {
                format!("; postgresql {:.0} µs/row", l.pg_us)
            };
            println!(
                "round {round} {:<7} p50 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms  ({} rows; commit p50 {:.2} ms{pg})",
                which.name(),
                ms(l.p50),
                ms(l.p99),
                ms(l.max),
                l.rows,
                ms(l.commit_p50),
            );
            p50s.entry(which.name()).or_default().push(ms(l.p50));
            p99s.entry(which.name()).or_default().push(ms(l.p99));
        }
    }
    let (r50, r99) = (median(&p50s["relay"]), median(&p99s["relay"]));
    let (q50, q99) = (median(&p50s["poller"]), median(&p99s["poller"]));
    println!(
        "latency [{b}] median of rounds: relay p50 {r50:.2} ms p99 {r99:.2} ms; poller p50 {q50:.2} ms p99 {q99:.2} ms; poller/relay p50 = {:.0}x, p99 = {:.0}x",
        q50 / r50,
        q99 / r99
    );
}
