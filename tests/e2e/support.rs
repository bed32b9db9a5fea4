//! Shared helpers: real plugins, real services, unique names, bounded waits.

use carteiro::config::{self, Config};
use carteiro::metrics::Metrics;
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where `scripts/build-plugins.sh` puts the components.
pub fn plugins_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins")
}

/// A built plugin; fails with the command to run when it is missing.
pub fn plugin(name: &str) -> PathBuf {
    let path = plugins_dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/build-plugins.sh first",
        path.display()
    );
    path
}

/// The test broker; fails (never skips) when it is not configured.
pub fn amqp_url() -> String {
    std::env::var("CARTEIRO_TEST_AMQP_URL").unwrap_or_else(|_| {
        panic!("CARTEIRO_TEST_AMQP_URL is not set: run `scripts/rabbitmq.sh start` and export the URL it prints (scripts/test.sh does both)")
    })
}

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `cmd` to completion without stdin, panicking with `what`, its status and its output
/// unless it succeeds; returns its stdout.
pub fn run_ok(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `bash scripts/NAME ARGS` with `env` (see [`run_ok`]); returns its last line of stdout,
/// where the service scripts print their URL.
pub fn script(name: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("scripts").join(name)).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_ok(&format!("scripts/{name} {args:?}"), &mut cmd);
    out.lines().last().unwrap_or_default().trim().to_owned()
}

/// Runs `bash scripts/NAME ARGS` and ignores how it ends: for `Drop`, where a failing stop
/// must not hide the test's own failure.
pub fn script_quietly(name: &str, args: &[&str]) {
    let _ = Command::new("bash")
        .arg(repo().join("scripts").join(name))
        .args(args)
        .stdin(Stdio::null())
        .output();
}

/// A unique, readable name for queues and files.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

/// Polls `check` until it returns `Some`, failing after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Per-delivery limits for loading a plugin in-process, without the instance cap, with the
/// default byte totals and a fresh instance per delivery: one place that knows every field
/// of `PluginLimits`.
pub fn plugin_limits(
    timeout: Duration,
    memory_bytes: u64,
    max_host_calls: u32,
    max_events: u32,
) -> carteiro::runtime::PluginLimits {
    carteiro::runtime::PluginLimits {
        timeout,
        memory_bytes,
        max_host_calls,
        max_events,
        totals: carteiro::runtime::DeliveryTotals::default(),
        max_concurrency: None,
        isolation: Some(carteiro::runtime::Isolation::PerDelivery),
    }
}

/// Asserts that `text` (a command's output, a log, a page) contains each of `needles`, and
/// shows the whole text when one is missing.
pub fn assert_contains_all(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} is missing from:\n{text}");
    }
}

/// Waits (`timeout` at most) until something accepts connections on `127.0.0.1:port`.
pub async fn wait_listening(what: &str, port: u16, timeout: Duration) {
    wait_for(what, timeout, || async {
        let connected = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
        connected.ok().map(|_| ())
    })
    .await;
}

/// One HTTP/1.1 exchange with `127.0.0.1:port`: sends `request` (head and body; it asks for
/// `Connection: close`) and reads the response to its end, failing the test after `timeout`
/// (`what` names the request). Returns the status, the head and the body.
pub async fn http_exchange(
    port: u16,
    request: &str,
    timeout: Duration,
    what: &str,
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut bytes = Vec::new();
        stream.read_to_end(&mut bytes).await?;
        Ok::<_, std::io::Error>(bytes)
    };
    let bytes = tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| panic!("{what} timed out"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let response = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response}"));
    (status, head.to_owned(), body.to_owned())
}

/// Writes `toml` into a fresh temp dir and loads it like `carteiro run -c` would.
pub fn load_config(dir: &Path, toml: &str) -> Config {
    let path = dir.join("carteiro.toml");
    std::fs::write(&path, toml).expect("write config");
    config::load(&path).unwrap_or_else(|e| panic!("test config invalid: {e}"))
}

/// A gateway running in-process on its own queues and database.
pub struct Gateway {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// A second connection to the gateway's store, for assertions.
    pub store: carteiro::store::Store,
    pub dir: tempfile::TempDir,
}

impl Gateway {
    /// Starts `carteiro run` on `toml` (written to a temp dir; `{dir}` is replaced by it).
    pub async fn start(toml: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_in(dir, toml, Arc::new(Metrics::default())).await
    }

    /// Like [`Gateway::start`], in a given folder and recording into `metrics`.
    pub async fn start_in(dir: tempfile::TempDir, toml: &str, metrics: Arc<Metrics>) -> Self {
        test_logs();
        let toml = toml.replace("{dir}", &dir.path().display().to_string());
        let config = load_config(dir.path(), &toml);
        let store = carteiro::services::open_store(&config)
            .await
            .expect("store");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        // With its config file, so `POST /admin/reload` re-reads it as `carteiro run -c` would.
        let options = carteiro::gateway::LiveOptions {
            metrics,
            config_path: Some(dir.path().join("carteiro.toml")),
            signals: None,
            native_handlers: Default::default(),
        };
        let task = tokio::spawn(carteiro::gateway::run_live(config, options, shutdown));
        Self {
            stop: Some(stop),
            task,
            store,
            dir,
        }
    }

    /// Graceful shutdown, bounded; hands back the folder (config and SQLite file).
    pub async fn stop(mut self) -> tempfile::TempDir {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = tokio::time::timeout(Duration::from_secs(60), &mut self.task)
            .await
            .expect("gateway stops within 60s");
        result
            .expect("gateway task")
            .expect("gateway ran without error");
        self.dir
    }
}

/// `CARTEIRO_TEST_LOG=<filter>` (e.g. `info,carteiro=debug`) shows the in-process gateways'
/// logs in a failing test's output, for a failure that does not say why.
fn test_logs() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        if let Ok(filter) = std::env::var("CARTEIRO_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_test_writer()
                .try_init();
        }
    });
}

/// The top of a config on the test broker and a SQLite store in the gateway's directory, with
/// an admin server on `listen` (`""`: none); the caller appends the rest.
pub fn sqlite_config_head(listen: &str) -> String {
    format!(
        r##"
version = 1
[broker]
url = "{amqp}"
[store]
url = "sqlite://{{dir}}/carteiro.db"
[admin]
listen = "{listen}"
"##,
        amqp = amqp_url(),
    )
}

/// A `[plugins.NAME]` table running the built `fixture` with `variables` (lines of its
/// variables table), and a route on `queue` running it, bound to `exchange`. It ends inside
/// the binding, so a caller can append `routing_key = ...`.
pub fn plugin_route(
    name: &str,
    fixture: &str,
    variables: &str,
    queue: &str,
    exchange: &str,
) -> String {
    plugin_route_with(name, fixture, "", variables, queue, "", exchange)
}

/// [`plugin_route`] with more lines in the plugin table (`plugin_extra`) and in the route
/// table (`route_extra`): the one template of a plugin and its route that every config uses.
fn plugin_route_with(
    name: &str,
    fixture: &str,
    plugin_extra: &str,
    variables: &str,
    queue: &str,
    route_extra: &str,
    exchange: &str,
) -> String {
    format!(
        r#"
[plugins.{name}]
path = "{path}"
{plugin_extra}
[plugins.{name}.variables]
{variables}
[[routes]]
queue = "{queue}"
plugin = "{name}"
{route_extra}
[[routes.bindings]]
exchange = "{exchange}"
"#,
        path = plugin(fixture).display(),
    )
}

/// A config for one route; `extra` is appended inside the route table.
pub fn route_config(
    queue: &str,
    plugin_name: &str,
    exchange: &str,
    vars: &str,
    extra: &str,
) -> String {
    route_config_with(queue, plugin_name, exchange, vars, "", extra)
}

/// [`route_config`] with more lines in the plugin table (`plugin_extra`), after its limits
/// (`timeout` and `memory` there replace the test defaults).
pub fn route_config_with(
    queue: &str,
    plugin_name: &str,
    exchange: &str,
    vars: &str,
    plugin_extra: &str,
    extra: &str,
) -> String {
    // The test limits, unless `plugin_extra` sets its own (a Python component needs more).
    let sets = |key: &str| {
        plugin_extra
            .lines()
            .any(|l| l.split('=').next().is_some_and(|k| k.trim() == key))
    };
    let mut plugin_lines: Vec<&str> = [
        ("timeout", "timeout = \"2s\""),
        ("memory", "memory = \"32MiB\""),
    ]
    .into_iter()
    .filter(|(key, _)| !sets(key))
    .map(|(_, line)| line)
    .collect();
    if !plugin_extra.is_empty() {
        plugin_lines.push(plugin_extra);
    }
    let plugin_lines = plugin_lines.join("\n");
    let route = plugin_route_with(
        plugin_name,
        plugin_name,
        &plugin_lines,
        vars,
        queue,
        &format!("prefetch = 16\n{extra}"),
        exchange,
    );
    format!(
        r##"
version = 1
[broker]
url = "{amqp}"
heartbeat = "5s"
[store]
url = "sqlite://{{dir}}/carteiro.db"
[admin]
listen = ""
[relay]
poll_interval = "200ms"{route}routing_key = "#"
"##,
        amqp = amqp_url(),
    )
}

/// A [`route_config`] route on `plugin` whose failures are dead-lettered at once, without
/// retries: the usual way to fill a dead-letter archive.
pub fn dead_letter_route(queue: &str, plugin: &str, exchange: &str) -> String {
    route_config(
        queue,
        plugin,
        exchange,
        "",
        "on_plugin_failure = \"dead-letter\"",
    )
}

/// A route's `[routes.retry]` table (an `extra` of [`route_config`]): `max_attempts` and the
/// backoff tiers, so a test states its retry policy as numbers rather than TOML text.
pub fn retry_table(max_attempts: u32, backoff: &[&str]) -> String {
    let tiers: Vec<String> = backoff.iter().map(|tier| format!("\"{tier}\"")).collect();
    format!(
        "[routes.retry]\nmax_attempts = {max_attempts}\nbackoff = [{}]",
        tiers.join(", ")
    )
}

/// Waits (30 s at most) until `namespace`/`key` is in the kv store: the sign a handler committed.
pub async fn committed(
    store: &carteiro::store::Store,
    namespace: &str,
    key: &str,
) -> carteiro::store::KvEntry {
    wait_for(
        &format!("{namespace}/{key} committed"),
        Duration::from_secs(30),
        || async { store.kv_get(namespace, key).await.ok().flatten() },
    )
    .await
}

/// Asserts that the counter plugin, running as plugin `namespace`, applied message `id`
/// exactly once: its `seen/ID` entry is `1`.
pub async fn assert_applied_once(store: &carteiro::store::Store, namespace: &str, id: &str) {
    let seen = store
        .kv_get(namespace, &format!("seen/{id}"))
        .await
        .expect("kv")
        .unwrap_or_else(|| panic!("{namespace} never applied {id}"));
    assert_eq!(seen.value, b"1", "{namespace} applied {id} once");
}

/// A dead letter of the counter plugin on `route` (consumed from `ROUTE.dlq`), archived now
/// after `attempts` for `reason`, with no headers and an empty body for the test to fill in.
pub fn counter_dead_letter(
    route: &str,
    reason: &str,
    attempts: i64,
) -> carteiro::store::NewDeadLetter {
    carteiro::store::NewDeadLetter {
        route: route.to_owned(),
        queue: format!("{route}.dlq"),
        reason: reason.to_owned(),
        plugin: Some("counter".to_owned()),
        attempts,
        headers: Vec::new(),
        body: Vec::new(),
        first_failed_at: None,
        dead_lettered_at: carteiro::common::now_ms(),
    }
}

/// A route of the test's own: its input exchange declared and a gateway consuming it.
pub struct Route {
    pub client: Client,
    pub queue: String,
    pub exchange: String,
    pub gw: Gateway,
}

impl Route {
    /// One [`route_config`] route on `plugin`, on SQLite or on the store at `store_url`.
    pub async fn start(prefix: &str, plugin: &str, extra: &str, store_url: Option<&str>) -> Self {
        Self::start_from(prefix, Arc::default(), |queue, exchange| {
            let toml = route_config(queue, plugin, exchange, "", extra);
            match store_url {
                Some(url) => with_store(&toml, url),
                None => toml,
            }
        })
        .await
    }

    /// [`Route::start`] on SQLite, recording into `metrics`.
    pub async fn start_with_metrics(
        prefix: &str,
        plugin: &str,
        extra: &str,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self::start_from(prefix, metrics, |queue, exchange| {
            route_config(queue, plugin, exchange, "", extra)
        })
        .await
    }

    /// A route on the config `toml(queue, exchange)` writes.
    pub async fn start_from(
        prefix: &str,
        metrics: Arc<Metrics>,
        toml: impl FnOnce(&str, &str) -> String,
    ) -> Self {
        let (queue, exchange) = (unique(prefix), unique("in"));
        let client = Client::connect().await;
        client.sink(&exchange).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let gw = Gateway::start_in(dir, &toml(&queue, &exchange), metrics).await;
        client.wait_for_consumer(&queue).await;
        Self {
            client,
            queue,
            exchange,
            gw,
        }
    }

    /// Publishes to the route's exchange with routing key `k`.
    pub async fn publish(&self, props: lapin::BasicProperties, body: &[u8]) {
        self.client.publish(&self.exchange, "k", props, body).await;
    }

    /// Waits (30 s at most) until the route has at least `at_least` dead letters.
    pub async fn dead_letters(&self, at_least: usize) -> Vec<carteiro::store::DeadLetter> {
        dead_letters(&self.gw.store, &self.queue, at_least).await
    }

    /// Publishes one message and waits (30 s at most) until the route dead-lettered it;
    /// returns the route's dead letters and the time from the publish.
    pub async fn dead_letter_timed(
        &self,
        props: lapin::BasicProperties,
        body: &[u8],
    ) -> (Vec<carteiro::store::DeadLetter>, Duration) {
        let started = Instant::now();
        self.publish(props, body).await;
        let rows = self.dead_letters(1).await;
        (rows, started.elapsed())
    }
}

/// A [`route_config`] for the `counter` plugin, emitting its events to `events`.
pub fn counter_config(queue: &str, exchange: &str, events: &str) -> String {
    route_config(
        queue,
        "counter",
        exchange,
        &format!("out_exchange = \"{events}\""),
        "",
    )
}

/// A plain AMQP client for tests.
pub struct Client {
    pub conn: lapin::Connection,
    pub channel: lapin::Channel,
}

impl Client {
    pub async fn connect() -> Self {
        Self::connect_to(&amqp_url()).await
    }

    /// A client of another broker (e.g. a dedicated instance a test restarts).
    pub async fn connect_to(url: &str) -> Self {
        let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .expect("test client connects");
        let channel = conn.create_channel().await.expect("channel");
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        Self { conn, channel }
    }

    /// Declares a durable topic exchange and a durable queue bound to it with `#` (both
    /// survive a broker restart); returns the queue name.
    pub async fn sink(&self, exchange: &str) -> String {
        self.bound_sink(exchange, lapin::ExchangeKind::Topic, "#")
            .await
    }

    /// Declares a durable exchange of `kind` and a durable queue bound to it with `key`
    /// (what no binding takes is unroutable); returns the queue name.
    pub async fn bound_sink(&self, exchange: &str, kind: lapin::ExchangeKind, key: &str) -> String {
        let queue = self.unbound_sink(exchange, kind).await;
        self.bind(&queue, exchange, key).await;
        queue
    }

    /// Declares a durable exchange of `kind` and a durable queue bound to nothing yet (see
    /// [`Client::bind`]); returns the queue name.
    pub async fn unbound_sink(&self, exchange: &str, kind: lapin::ExchangeKind) -> String {
        self.exchange(exchange, kind, true).await;
        let queue = unique("sink");
        self.durable_queue(&queue).await;
        queue
    }

    /// Declares a durable queue `queue`, bound to nothing.
    pub async fn durable_queue(&self, queue: &str) {
        let options = lapin::options::QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        self.channel
            .queue_declare(queue.into(), options, Default::default())
            .await
            .unwrap_or_else(|e| panic!("declare queue {queue}: {e}"));
    }

    /// Declares an exchange of `kind` and no queue.
    pub async fn exchange(&self, exchange: &str, kind: lapin::ExchangeKind, durable: bool) {
        let options = lapin::options::ExchangeDeclareOptions {
            durable,
            ..Default::default()
        };
        self.channel
            .exchange_declare(exchange.into(), kind, options, Default::default())
            .await
            .expect("declare exchange");
    }

    /// Declares a topic exchange named after `prefix` that no queue is bound to (yet), so what
    /// is published there comes back unroutable; returns its name.
    pub async fn unbound_exchange(&self, prefix: &str, durable: bool) -> String {
        let exchange = unique(prefix);
        self.exchange(&exchange, lapin::ExchangeKind::Topic, durable)
            .await;
        exchange
    }

    /// Binds `queue` to `exchange` with `key`.
    pub async fn bind(&self, queue: &str, exchange: &str, key: &str) {
        self.channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                key.into(),
                lapin::options::QueueBindOptions::default(),
                Default::default(),
            )
            .await
            .expect("bind sink");
    }

    /// The broker's view of `queue`: a passive declare, on a fresh channel because a failed
    /// one closes its channel.
    pub async fn queue_state(&self, queue: &str) -> lapin::Result<lapin::Queue> {
        let channel = self.conn.create_channel().await?;
        let passive = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let state = channel
            .queue_declare(queue.into(), passive, Default::default())
            .await?;
        let _ = channel.close(200, "probe".into()).await;
        Ok(state)
    }

    /// Waits until the gateway consumes `queue`.
    pub async fn wait_for_consumer(&self, queue: &str) {
        wait_for(
            &format!("a consumer on {queue}"),
            Duration::from_secs(60),
            || async {
                let state = self.queue_state(queue).await.ok()?;
                (state.consumer_count() > 0).then_some(())
            },
        )
        .await;
    }

    /// Publishes and waits for the broker's confirm.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        props: lapin::BasicProperties,
        body: &[u8],
    ) {
        let confirm = self
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                Default::default(),
                body,
                props,
            )
            .await
            .expect("publish");
        confirm.await.expect("confirm");
    }

    /// Publishes `count` messages `body` with ids `PREFIX-0`, `PREFIX-1`, ... to `exchange`
    /// (routing key `k`), each confirmed: the load most tests put on a route.
    pub async fn publish_numbered(&self, exchange: &str, prefix: &str, count: usize, body: &[u8]) {
        for i in 0..count {
            let props = json_props(&format!("{prefix}-{i}"));
            self.publish(exchange, "k", props, body).await;
        }
    }

    /// Takes every message currently in `queue` (basic.get until empty).
    pub async fn drain(&self, queue: &str) -> Vec<lapin::message::BasicGetMessage> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(
                queue.into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .expect("basic.get")
        {
            out.push(m);
        }
        out
    }
}

/// Properties with a message id and JSON content type.
pub fn json_props(message_id: &str) -> lapin::BasicProperties {
    lapin::BasicProperties::default()
        .with_message_id(message_id.into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
}

/// Creates a database `PREFIX_<uuid>` through the PostgreSQL server at `admin_url` (plain or
/// TLS, as the URL says); returns its name.
pub async fn create_database(admin_url: &str, prefix: &str) -> String {
    use sqlx::{Connection, Executor};
    let name = format!("{prefix}_{}", uuid::Uuid::now_v7().simple());
    let mut admin = sqlx::PgConnection::connect(admin_url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL to create {name}: {e}"));
    let create = format!("CREATE DATABASE {name}");
    admin
        .execute(sqlx::AssertSqlSafe(create))
        .await
        .expect("create database");
    let _ = admin.close().await;
    name
}

/// A fresh PostgreSQL database for one test, on the server of `CARTEIRO_TEST_POSTGRES_URL`;
/// returns its URL. Fails (never skips) when the variable is unset.
pub async fn pg_database() -> String {
    let admin = std::env::var("CARTEIRO_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("CARTEIRO_TEST_POSTGRES_URL is not set: run `scripts/postgres.sh start` and export the URL it prints (scripts/test.sh does both)")
    });
    let name = create_database(&admin, "e2e").await;
    match admin.rfind('/') {
        Some(slash) => format!("{}/{name}", &admin[..slash]),
        None => panic!("unexpected PostgreSQL URL {admin}"),
    }
}

/// A store at `url` (4 connections), migrated.
pub async fn migrated_store(url: &str) -> carteiro::store::Store {
    let store = carteiro::store::Store::connect(url, 4)
        .await
        .expect("store");
    store.migrate().await.expect("migrate");
    store
}

/// The URL of a SQLite file `relay.db` in `dir`.
pub fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}/relay.db", dir.display())
}

/// A relay running in the background and the token that stops it.
pub type RelayTask = (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
);

/// Runs `relay` in the background until [`stop_relay`].
pub fn run_relay(relay: carteiro::relay::Relay) -> RelayTask {
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    (stop, task)
}

/// Runs the relay of `config` on `store` in the background, recording into fresh metrics.
pub fn spawn_relay(config: &Config, store: carteiro::store::Store) -> RelayTask {
    let (metrics, wake) = (Arc::new(Metrics::default()), None);
    let relay = carteiro::relay::Relay::new(
        &config.broker,
        &config.relay,
        &config.store.url,
        store,
        metrics,
        wake,
    );
    run_relay(relay)
}

/// Stops a relay and waits (30 s at most) for it to end without error.
pub async fn stop_relay((stop, task): RelayTask) {
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("relay stops")
        .expect("join")
        .expect("relay ok");
}

/// Waits (`timeout` at most; `what` names it) until the relay has marked every outbox row of
/// `store` published.
pub async fn wait_published(what: &str, store: &carteiro::store::Store, timeout: Duration) {
    wait_for(what, timeout, || async {
        (store.outbox_status().await.ok()?.pending == 0).then_some(())
    })
    .await;
}

/// Drains `sink` until `n` messages arrived (within `timeout`), then briefly for stragglers.
pub async fn receive(
    client: &Client,
    sink: &str,
    n: usize,
    timeout: Duration,
) -> Vec<lapin::message::BasicGetMessage> {
    let got = std::sync::Mutex::new(Vec::new());
    wait_for(&format!("{n} messages on {sink}"), timeout, || async {
        let batch = client.drain(sink).await;
        let mut all = got.lock().expect("lock");
        all.extend(batch);
        (all.len() >= n).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut all = got.into_inner().expect("lock");
    all.extend(client.drain(sink).await);
    all
}

/// Replaces the SQLite store of a [`route_config`] with `url`.
pub fn with_store(toml: &str, url: &str) -> String {
    toml.replace(
        "url = \"sqlite://{dir}/carteiro.db\"",
        &format!("url = \"{url}\""),
    )
}

/// Runs `carteiro COMMAND -c CONFIG` with the test-only fault point `fault`, waits until it
/// hangs there, and SIGKILLs it: a crash at exactly that point.
pub fn crash_at_fault(command: &str, config: &Path, fault: &str) {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_carteiro"))
        .args([command, "-c"])
        .arg(config)
        .env("CARTEIRO_FAULT", fault)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn carteiro");
    let stderr = child.stderr.take().expect("stderr");
    let (hung_tx, hung_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("fault injection: hanging") {
                let _ = hung_tx.send(());
            }
        }
    });
    let reached = hung_rx.recv_timeout(Duration::from_secs(60));
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    reached.unwrap_or_else(|_| panic!("carteiro {command} never reached fault point {fault}"));
}

/// A request that only emits row `key/seq` (payload `key/seq`, header `x-seq`) of ordering key
/// `key` to `exchange`.
pub fn seed_request(exchange: &str, key: &str, seq: usize) -> carteiro::store::CommitRequest {
    carteiro::store::CommitRequest {
        route: "seed".into(),
        inbox_key: unique("seed"),
        namespace: "seed".into(),
        reads: Vec::new(),
        writes: Vec::new(),
        outbox: vec![carteiro::store::NewOutboxRow {
            event_id: uuid::Uuid::now_v7().to_string(),
            route: "seed".into(),
            plugin: "seed".into(),
            exchange: exchange.into(),
            routing_key: "seeded".into(),
            headers: vec![("x-seq".into(), seq.to_string())],
            content_type: Some("text/plain".into()),
            payload: format!("{key}/{seq}").into_bytes(),
            ordering_key: key.into(),
        }],
    }
}

/// Commits `rows` outbox rows straight into the store: `keys` ordering keys round-robin, the
/// payload is `key/sequence`.
pub async fn seed_outbox(store: &carteiro::store::Store, exchange: &str, keys: usize, rows: usize) {
    seed_outbox_from(store, exchange, keys, rows, 0).await;
}

/// [`seed_outbox`] whose sequence numbers per key start at `first` (a second seeding that
/// continues the keys of a first one).
pub async fn seed_outbox_from(
    store: &carteiro::store::Store,
    exchange: &str,
    keys: usize,
    rows: usize,
    first: usize,
) {
    let mut batch = Vec::new();
    for i in 0..rows {
        batch.push(seed_request(
            exchange,
            &format!("key-{}", i % keys),
            first + i / keys,
        ));
        if batch.len() == 500 || i + 1 == rows {
            let outcomes = store.commit_batch(&batch).await.expect("seed commit");
            assert!(
                outcomes
                    .iter()
                    .all(|o| matches!(o, carteiro::store::CommitOutcome::Committed))
            );
            batch.clear();
        }
    }
}

/// A `counter` route on a fresh queue named after `prefix`, declared (durable) with nobody
/// consuming it, so what arrives there is what a `carteiro dlq` command published: the queue,
/// the folder holding the route's `carteiro.toml` and database, and its store.
pub async fn unconsumed_route(
    client: &Client,
    prefix: &str,
) -> (String, tempfile::TempDir, carteiro::store::Store) {
    let queue = unique(prefix);
    client.durable_queue(&queue).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = route_config(&queue, "counter", &unique("in"), "", "")
        .replace("{dir}", &dir.path().display().to_string());
    let config = load_config(dir.path(), &toml);
    let store = carteiro::services::open_store(&config)
        .await
        .expect("store");
    (queue, dir, store)
}

/// Dead letter `id`, which must be archived.
pub async fn archived(store: &carteiro::store::Store, id: i64) -> carteiro::store::DeadLetter {
    store.dead_letter_get(id).await.expect("get").expect("row")
}

/// Waits (30 s at most) until `route` has at least `at_least` archived dead letters.
pub async fn dead_letters(
    store: &carteiro::store::Store,
    route: &str,
    at_least: usize,
) -> Vec<carteiro::store::DeadLetter> {
    dead_letters_within(store, route, at_least, Duration::from_secs(30)).await
}

/// [`dead_letters`] with the test's own bound, for tests whose dead letters wait on an outage
/// or a slow component.
pub async fn dead_letters_within(
    store: &carteiro::store::Store,
    route: &str,
    at_least: usize,
    timeout: Duration,
) -> Vec<carteiro::store::DeadLetter> {
    let filter = carteiro::store::DeadLetterFilter {
        route: Some(route.to_owned()),
        ..Default::default()
    };
    wait_for(
        &format!("{at_least} dead letters on {route}"),
        timeout,
        || async {
            let rows = store.dead_letters_list(&filter).await.ok()?;
            (rows.len() >= at_least).then_some(rows)
        },
    )
    .await
}

/// Asserts that a dead letter's `reason` starts with `prefix`, and shows it when not.
pub fn assert_reason_starts_with(reason: &str, prefix: &str) {
    assert!(reason.starts_with(prefix), "{reason}");
}

/// Asserts that one of `rows` was dead-lettered for a reason containing every one of `parts`.
pub fn assert_any_reason(rows: &[carteiro::store::DeadLetter], parts: &[&str]) {
    let reasons: Vec<&str> = rows.iter().map(|r| r.letter.reason.as_str()).collect();
    assert!(
        reasons.iter().any(|r| parts.iter().all(|p| r.contains(p))),
        "no reason with all of {parts:?}: {reasons:?}"
    );
}

/// A header of the message a plugin is handed.
pub fn message_header(name: &str, value: &str) -> carteiro::runtime::Header {
    carteiro::runtime::Header {
        name: name.into(),
        value: value.into(),
    }
}

/// What reached `sink` from a gateway just SIGKILLed (its relay may have published some of
/// its events), once the broker has routed the last frames it sent.
pub async fn drain_after_kill(client: &Client, sink: &str) -> Vec<lapin::message::BasicGetMessage> {
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.drain(sink).await
}

/// After a SIGKILL: `expected` distinct events arrived, each once, or twice when the first
/// copy came from the killed gateway (`before_kill`, [`drain_after_kill`] before the restart) and the
/// restarted relay sent it again because the kill fell between its confirm and its mark
/// (G3, at least once).
pub fn assert_once_or_resent(
    what: &str,
    expected: usize,
    before_kill: &[lapin::message::BasicGetMessage],
    after: &[lapin::message::BasicGetMessage],
) {
    let early: Vec<String> = before_kill.iter().map(message_id).collect();
    let mut copies: HashMap<String, usize> = HashMap::new();
    for id in early.iter().cloned().chain(after.iter().map(message_id)) {
        *copies.entry(id).or_default() += 1;
    }
    assert_eq!(
        copies.len(),
        expected,
        "{what}: every event, none extra: {copies:?}"
    );
    for (id, n) in &copies {
        let allowed = 1 + usize::from(early.contains(id));
        assert!(
            *n <= allowed,
            "{what}: event {id} arrived {n} times ({} before the kill)",
            allowed - 1
        );
    }
}

/// The AMQP `message-id` of a received message (`""` when it has none).
/// `all` are `n` seeded rows (`key/seq`, see [`seed_request`]), each published once, every
/// key's rows in sequence order.
pub fn assert_once_in_key_order(all: &[lapin::message::BasicGetMessage], n: usize) {
    let ids: std::collections::HashSet<String> = all.iter().map(message_id).collect();
    assert_eq!(
        ids.len(),
        n,
        "every row published, each with its own event id"
    );
    assert_eq!(all.len(), n, "no row published twice");
    let mut last: std::collections::BTreeMap<String, i64> = Default::default();
    for m in all {
        let text = String::from_utf8(m.delivery.data.clone()).expect("utf8");
        let (key, seq) = text.split_once('/').expect("key/seq");
        let seq: i64 = seq.parse().expect("seq");
        let previous = last.insert(key.to_owned(), seq).unwrap_or(-1);
        assert!(seq > previous, "{key}: {seq} arrived after {previous}");
    }
}

pub fn message_id(m: &lapin::message::BasicGetMessage) -> String {
    m.delivery
        .properties
        .message_id()
        .as_ref()
        .map(|s| s.to_string())
        .unwrap_or_default()
}
