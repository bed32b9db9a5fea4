//! The operator's TOML: types, defaults and loading. Validation lives in `validate`,
//! `${VAR}` interpolation in `env`, units in `units`, the TLS settings' checks in `tls`,
//! `[security]` (the seal key's source) in `security`.

mod env;
mod security;
mod tls;
pub mod units;
mod validate;

pub use env::interpolate;
pub use security::SecurityConfig;
pub use tls::unauthenticated_connections;
pub use validate::{ConfigError, KeySource, load, load_str};

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use toml::Spanned;

/// The whole configuration file (`carteiro.toml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Format version; only `1` exists.
    pub version: u32,
    /// The RabbitMQ connection.
    pub broker: BrokerConfig,
    /// The database holding the inbox, kv state, outbox and dead letters.
    #[serde(default)]
    pub store: StoreConfig,
    /// The wasmtime sandbox shared by every plugin.
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// The outbox relay that runs inside `carteiro run`.
    #[serde(default)]
    pub relay: RelayConfig,
    /// The admin HTTP server (health, metrics, DLQ API).
    #[serde(default)]
    pub admin: AdminConfig,
    /// OpenTelemetry export of delivery and relay spans (off unless `otlp_endpoint` is set).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Where the header-seal key comes from (default: the store's `carteiro_secrets` table).
    #[serde(default)]
    pub security: SecurityConfig,
    /// Handler plugins by name.
    #[serde(default)]
    pub plugins: BTreeMap<String, PluginConfig>,
    /// Queues and the plugin that handles each.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Directory of the config file; relative plugin paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// `[broker]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// AMQP URL; `${VAR}` is replaced from the environment. Never logged with its password.
    #[serde(default)]
    pub url: String,
    /// Instead of `url`: the nodes of a cluster, tried in turn on every (re)connect, so a
    /// route fails over when its node goes away. `${VAR}` is replaced in each.
    #[serde(default)]
    pub urls: Vec<String>,
    /// AMQP heartbeat: how fast a silent dead connection is noticed.
    #[serde(default = "default_heartbeat", with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Bound on connecting (TCP + AMQP handshake).
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Bound on waiting for one publisher confirm (retry tiers, dead letters, outbox).
    #[serde(default = "default_publish_timeout", with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Longest wait between reconnection attempts (jittered exponential backoff).
    #[serde(default = "default_reconnect_max", with = "humantime_serde")]
    pub reconnect_max_backoff: Duration,
    /// `[broker.tls]`: the CA to trust, the name to verify and an optional client certificate
    /// for `amqps://` URLs (see docs/tls.md). When set, every URL must be `amqps://`.
    #[serde(default)]
    pub tls: Option<crate::broker::BrokerTlsConfig>,
}

impl BrokerConfig {
    /// Every broker address to try: `urls`, or the one `url`.
    pub fn addresses(&self) -> Vec<String> {
        if self.urls.is_empty() {
            vec![self.url.clone()]
        } else {
            self.urls.clone()
        }
    }
}

fn default_heartbeat() -> Duration {
    Duration::from_secs(10)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_publish_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_reconnect_max() -> Duration {
    Duration::from_secs(10)
}

/// `[store]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://PATH` (relative to the config file) or `postgres://...`; `${VAR}` allowed.
    #[serde(default = "default_store_url")]
    pub url: String,
    /// Connection pool size.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// How long idempotency records are kept (a redelivery older than this runs again).
    #[serde(default = "default_inbox_retention", with = "humantime_serde")]
    pub inbox_retention: Duration,
    /// Most deliveries committed in one database transaction (group commit).
    #[serde(default = "default_commit_batch")]
    pub commit_batch: usize,
    /// Longest a statement may run. On PostgreSQL every connection sets it as its
    /// `statement_timeout` (an overrun is SQLSTATE 57014: the store counts as unavailable,
    /// the delivery is requeued). On both backends every store operation (a commit batch, a
    /// batched read, a relay claim, ...) is also abandoned client-side after this plus 5 s,
    /// so a database that stops answering cannot hang commits.
    #[serde(default = "default_statement_timeout", with = "humantime_serde")]
    pub statement_timeout: Duration,
}

fn default_store_url() -> String {
    "sqlite://carteiro.db".to_owned()
}
fn default_max_connections() -> u32 {
    8
}
fn default_inbox_retention() -> Duration {
    Duration::from_secs(7 * 24 * 3600)
}
fn default_commit_batch() -> usize {
    256
}
fn default_statement_timeout() -> Duration {
    Duration::from_secs(30)
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: default_store_url(),
            max_connections: default_max_connections(),
            inbox_retention: default_inbox_retention(),
            commit_batch: default_commit_batch(),
            statement_timeout: default_statement_timeout(),
        }
    }
}

/// `[runtime]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Plugin instances alive at once across all routes (pooling allocator slots).
    #[serde(default = "default_max_instances")]
    pub max_instances: u32,
    /// Folder for compiled components, reused across starts (`""` turns the cache off;
    /// relative to this file). Default `$XDG_CACHE_HOME/carteiro/compiled` or
    /// `~/.cache/carteiro/compiled`.
    #[serde(default = "crate::runtime::default_compile_cache")]
    pub compile_cache: Option<PathBuf>,
}

fn default_max_instances() -> u32 {
    256
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            max_instances: default_max_instances(),
            compile_cache: crate::runtime::default_compile_cache(),
        }
    }
}

/// `[relay]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// Run the outbox relay inside `carteiro run`.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The relay's window: rows leased and not yet settled (waiting behind their ordering
    /// key, publishing, or confirmed but not yet marked published) at once. Bounds the
    /// rows republished after a crash. A larger window means larger claims (fewer
    /// transactions per row): 1,024 drained PostgreSQL ~1.5x faster than 256 here.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// The relay's window in bytes (payload plus headers of the rows it holds in memory):
    /// a claim takes rows only while they fit, and always at least one row, so the relay
    /// holds at most this much plus one row. Accepts sizes like `64MiB`.
    #[serde(default = "default_max_in_flight_bytes", with = "units::size")]
    pub max_in_flight_bytes: u64,
    /// Backstop poll when no commit woke the relay.
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Published rows are deleted after this long.
    #[serde(default = "default_relay_retention", with = "humantime_serde")]
    pub retention: Duration,
    /// How long a claim leases its rows: a relay that stops (crash, SIGSTOP, lost database)
    /// hands its rows to another after this. Never below three publish timeouts.
    #[serde(default = "default_relay_lease", with = "humantime_serde")]
    pub lease: Duration,
}

fn default_true() -> bool {
    true
}
fn default_max_in_flight() -> usize {
    1024
}
fn default_max_in_flight_bytes() -> u64 {
    64 << 20
}
fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_relay_retention() -> Duration {
    Duration::from_secs(24 * 3600)
}
fn default_relay_lease() -> Duration {
    Duration::from_secs(30)
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_in_flight: default_max_in_flight(),
            max_in_flight_bytes: default_max_in_flight_bytes(),
            poll_interval: default_poll_interval(),
            retention: default_relay_retention(),
            lease: default_relay_lease(),
        }
    }
}

/// `[admin]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin HTTP server; empty disables it. Loopback by default. A
    /// non-loopback address needs `token` or `basic`: every page then asks for them.
    #[serde(default = "default_admin_listen")]
    pub listen: String,
    /// Bearer token (`Authorization: Bearer ...`) for state changes (and every page off
    /// loopback); `${VAR}` is replaced from the environment. Never printed.
    #[serde(default)]
    pub token: Option<Secret>,
    /// Basic auth for the console in a browser; `${VAR}` is replaced in the password.
    #[serde(default)]
    pub basic: Option<BasicAuth>,
    /// What needs credentials: `"writes"` (state changes; every page too off loopback) or
    /// `"all"` (every page and JSON read as well, on loopback too; `/healthz` and the
    /// status line of `/readyz` stay open for probes).
    #[serde(default)]
    pub require_auth: RequireAuth,
    /// Host names (`Host` header, without the port) the admin server answers to besides
    /// loopback names and IP addresses, e.g. `["carteiro.internal"]`. Any other name is
    /// refused (403): a DNS-rebinding page cannot reach the console.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

/// `[admin] require_auth`
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequireAuth {
    /// Credentials for state changes; reads are open on a loopback `listen`.
    #[default]
    Writes,
    /// Credentials for everything but `/healthz` and `/readyz`'s status line.
    All,
}

/// `[admin] basic = { user = "...", password = "..." }`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    /// User name.
    pub user: String,
    /// Password (`${VAR}` from the environment). Never printed.
    pub password: Secret,
}

/// A secret from the config: `Debug` never shows it.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl AdminConfig {
    /// Whether `listen` is a loopback address (`127.0.0.0/8`, `[::1]`, `localhost`).
    pub fn is_loopback(&self) -> bool {
        if let Ok(addr) = self.listen.parse::<std::net::SocketAddr>() {
            return addr.ip().is_loopback();
        }
        let host = self
            .listen
            .rsplit_once(':')
            .map_or(self.listen.as_str(), |(h, _)| h);
        host.eq_ignore_ascii_case("localhost")
    }

    /// Whether any credentials are configured.
    pub fn has_credentials(&self) -> bool {
        self.token.is_some() || self.basic.is_some()
    }
}

fn default_admin_listen() -> String {
    "127.0.0.1:9090".to_owned()
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: default_admin_listen(),
            token: None,
            basic: None,
            require_auth: RequireAuth::default(),
            allowed_hosts: Vec::new(),
        }
    }
}

/// `[telemetry]`: OpenTelemetry traces over OTLP/HTTP (protobuf). See docs/telemetry.md.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318` (spans go to
    /// `/v1/traces` under it; a URL already ending in `/v1/traces` is used as is). Unset or
    /// empty: telemetry is off and costs nothing. `${VAR}` allowed. Plain `http://` only.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// `service.name` of every span's resource.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// How often finished spans are sent in one batch.
    #[serde(default = "default_export_interval", with = "humantime_serde")]
    pub export_interval: Duration,
    /// Bound on one export request (and on the final flush at shutdown).
    #[serde(default = "default_export_timeout", with = "humantime_serde")]
    pub export_timeout: Duration,
}

fn default_service_name() -> String {
    "carteiro".to_owned()
}
fn default_export_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_export_timeout() -> Duration {
    Duration::from_secs(10)
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: default_service_name(),
            export_interval: default_export_interval(),
            export_timeout: default_export_timeout(),
        }
    }
}

/// `[plugins.NAME]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// Path to the `.wasm` component, relative to the config file.
    pub path: PathBuf,
    /// Optional pin: the component's SHA-256 (hex). A mismatch refuses to load it.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Wall-clock budget for one `handle` call.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Linear memory cap per instance.
    #[serde(default = "default_memory", with = "units::size")]
    pub memory: u64,
    /// Host calls (kv, outbox, log, config) allowed per delivery.
    #[serde(default = "default_max_host_calls")]
    pub max_host_calls: u32,
    /// Outbox events one delivery may emit.
    #[serde(default = "default_max_events")]
    pub max_events: u32,
    /// Total bytes of kv keys and values one delivery may write (overwrites count again).
    #[serde(default = "default_max_kv_bytes", with = "units::size")]
    pub max_kv_bytes: u64,
    /// Total bytes of outbox events (payloads, headers, names) one delivery may emit.
    #[serde(default = "default_max_event_bytes", with = "units::size")]
    pub max_event_bytes: u64,
    /// Instances of this plugin alive at once. Default: two per CPU core for components of
    /// 4 MiB or more (a Python or JavaScript runtime inside), else only the instance pool.
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Total bytes of log messages one delivery may write through the `log` import.
    #[serde(default = "default_max_log_bytes", with = "units::size")]
    pub max_log_bytes: u64,
    /// Variables the plugin reads through the `config` import; `${VAR}` allowed.
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    /// A new version run beside this one on live traffic (same settings and kv namespace,
    /// a throwaway store): its verdicts and effects are compared and counted, never
    /// committed or published. Relative to the config file.
    #[serde(default)]
    pub shadow: Option<PathBuf>,
    /// Optional pin of the shadow component's SHA-256 (hex).
    #[serde(default)]
    pub shadow_sha256: Option<String>,
    /// Share of deliveries also run on the shadow, 0.0 to 1.0.
    #[serde(default = "default_shadow_sample")]
    pub shadow_sample: f64,
    /// CPU budget of the shadow: runs at once. A sampled delivery arriving while all are
    /// busy is not shadowed (counted as `skipped`).
    #[serde(default = "default_shadow_max_in_flight")]
    pub shadow_max_in_flight: u32,
    /// A canary: a new version that takes a share of the deliveries and is rolled back
    /// automatically when it fails more than the stable one.
    #[serde(default)]
    pub canary: Option<CanaryConfig>,
}

/// `[plugins.NAME.canary]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryConfig {
    /// The new component, relative to the config file.
    pub path: PathBuf,
    /// Optional pin of its SHA-256 (hex).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Share of deliveries (0 to 100, by a hash of the idempotency key: a redelivery meets
    /// the same version) that run on the canary.
    pub percent: f64,
    /// When to roll it back.
    #[serde(default)]
    pub rollback_on: RollbackConfig,
}

/// `rollback_on = { failure_rate = 0.05, min_deliveries = 200, window = "5m" }`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackConfig {
    /// Roll back when the canary's failure rate (retry, dead-letter and trap verdicts)
    /// exceeds the stable version's by more than this (0.05: five points).
    #[serde(default = "default_failure_rate")]
    pub failure_rate: f64,
    /// ... once the canary handled at least this many deliveries within the window.
    #[serde(default = "default_min_deliveries")]
    pub min_deliveries: u64,
    /// The sliding window both rates are measured over.
    #[serde(default = "default_canary_window", with = "humantime_serde")]
    pub window: Duration,
}

fn default_failure_rate() -> f64 {
    0.05
}
fn default_min_deliveries() -> u64 {
    200
}
fn default_canary_window() -> Duration {
    Duration::from_secs(300)
}

impl Default for RollbackConfig {
    fn default() -> Self {
        Self {
            failure_rate: default_failure_rate(),
            min_deliveries: default_min_deliveries(),
            window: default_canary_window(),
        }
    }
}

fn default_shadow_sample() -> f64 {
    1.0
}
fn default_shadow_max_in_flight() -> u32 {
    2
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_memory() -> u64 {
    64 << 20
}
fn default_max_host_calls() -> u32 {
    10_000
}
fn default_max_events() -> u32 {
    100
}
fn default_max_kv_bytes() -> u64 {
    crate::runtime::DeliveryTotals::default().kv_bytes
}
fn default_max_event_bytes() -> u64 {
    crate::runtime::DeliveryTotals::default().event_bytes
}
fn default_max_log_bytes() -> u64 {
    crate::runtime::DeliveryTotals::default().log_bytes
}

/// `[[routes]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The work queue this route consumes.
    pub queue: String,
    /// `classic` or `quorum`.
    #[serde(default)]
    pub queue_type: QueueKind,
    /// Name of the plugin (a key of `[plugins]`).
    pub plugin: Spanned<String>,
    /// Deliveries processed concurrently (AMQP prefetch).
    #[serde(default = "default_prefetch")]
    pub prefetch: u16,
    /// Where the idempotency key comes from: `message_id`, `header:NAME` or `json:/pointer`.
    #[serde(default = "default_key_source")]
    pub idempotency_key: String,
    /// What to do with a message without a key: `dead-letter` (default) or `process`
    /// (run the handler without deduplication).
    #[serde(default)]
    pub on_missing_key: MissingKeyPolicy,
    /// Larger bodies go to the dead-letter queue before the plugin runs.
    #[serde(default = "default_max_body", with = "units::size")]
    pub max_body_size: u64,
    /// If set, messages with another content type are dead-lettered before the plugin runs.
    #[serde(default)]
    pub content_type: Option<String>,
    /// Exchanges and routing keys bound to the work queue.
    #[serde(default)]
    pub bindings: Vec<BindingConfig>,
    /// Attempts and backoff.
    #[serde(default)]
    pub retry: RetryConfig,
    /// What a trap, timeout or limit hit in the plugin counts as.
    #[serde(default)]
    pub on_plugin_failure: FailurePolicy,
    /// Optional `x-message-ttl` on the work queue (expired messages are dead-lettered).
    #[serde(default, with = "humantime_serde")]
    pub message_ttl: Option<std::time::Duration>,
    /// Optional `x-max-length` on the work queue (overflow is dead-lettered).
    #[serde(default)]
    pub max_length: Option<u64>,
    /// Optional alert: an ERROR log, a gauge and a `/readyz` note when the route's dead
    /// letters within `window` reach `count`.
    #[serde(default)]
    pub dead_letter_alert: Option<DeadLetterAlertConfig>,
}

/// `dead_letter_alert = { count = 10, window = "1h" }`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterAlertConfig {
    /// Dead letters within `window` that raise the alert.
    pub count: u64,
    /// The sliding window they are counted over.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

fn default_prefetch() -> u16 {
    32
}
fn default_key_source() -> String {
    "message_id".to_owned()
}
fn default_max_body() -> u64 {
    1 << 20
}

/// Queue type of a route's queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueKind {
    /// Classic queue (single node).
    #[default]
    Classic,
    /// Quorum queue (replicated; gets `x-delivery-limit` as a safety net).
    Quorum,
}

/// A route's policy for messages that carry no idempotency key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MissingKeyPolicy {
    /// Dead-letter with reason "missing idempotency key".
    #[default]
    DeadLetter,
    /// Run the handler anyway, without deduplication.
    Process,
}

/// What a classified plugin failure (trap, timeout, limit) becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// Retry with backoff; dead-letter once attempts are exhausted.
    #[default]
    Retry,
    /// Dead-letter at once.
    DeadLetter,
}

/// `[[routes.bindings]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingConfig {
    /// Exchange to bind from (declared durable if missing).
    pub exchange: String,
    /// Exchange type used when declaring it.
    #[serde(default = "default_exchange_type")]
    pub exchange_type: String,
    /// Binding key.
    #[serde(default = "default_routing_key")]
    pub routing_key: String,
}

fn default_exchange_type() -> String {
    "topic".to_owned()
}
fn default_routing_key() -> String {
    "#".to_owned()
}

/// `[routes.retry]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Total attempts including the first; then the message is dead-lettered.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Delay before attempt 2, 3, ...; the last tier repeats. One delay queue per tier.
    #[serde(default = "default_backoff", with = "units::duration_list")]
    pub backoff: Vec<Duration>,
}

fn default_max_attempts() -> u32 {
    5
}
fn default_backoff() -> Vec<Duration> {
    vec![
        Duration::from_secs(1),
        Duration::from_secs(10),
        Duration::from_secs(60),
    ]
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: default_max_attempts(),
            backoff: default_backoff(),
        }
    }
}

impl RetryConfig {
    /// The backoff tier for the attempt that failed (`attempt` is 1-based).
    pub fn delay_after(&self, attempt: u32) -> Duration {
        let index = (attempt.max(1) as usize - 1).min(self.backoff.len().saturating_sub(1));
        self.backoff.get(index).copied().unwrap_or_default()
    }

    /// The smallest configured tier not shorter than `requested` (or the longest tier).
    pub fn tier_for(&self, requested: Duration) -> Duration {
        let mut tiers = self.backoff.clone();
        tiers.sort();
        tiers
            .iter()
            .copied()
            .find(|t| *t >= requested)
            .or_else(|| tiers.last().copied())
            .unwrap_or_default()
    }
}

impl RouteConfig {
    /// The plugin name without its span.
    pub fn plugin_name(&self) -> &str {
        self.plugin.get_ref()
    }
}
