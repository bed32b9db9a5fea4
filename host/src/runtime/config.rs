//! `[runtime]` (the sandbox shared by every plugin) and `[plugins.NAME]` (each handler, its
//! limits, isolation, shadow and canary), with the checks that concern only them. `config`
//! interpolates `${VAR}` in plugin variables first and checks routes against plugin names.

use super::language::DEFAULT_REUSE;
use super::{DeliveryTotals, Isolation};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `[runtime]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Plugin instances alive at once across all routes (pooling allocator slots).
    pub max_instances: u32,
    /// Folder for compiled components, reused across starts (`""` turns the cache off;
    /// relative to this file). Default `$XDG_CACHE_HOME/carteiro/compiled` or
    /// `~/.cache/carteiro/compiled`.
    pub compile_cache: Option<PathBuf>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            max_instances: 256,
            compile_cache: crate::runtime::default_compile_cache(),
        }
    }
}

impl RuntimeConfig {
    /// A relative `compile_cache` is relative to the config file.
    pub fn resolve_paths(&mut self, base_dir: &Path) {
        if let Some(cache) = self.compile_cache.as_mut()
            && !cache.as_os_str().is_empty()
            && cache.is_relative()
        {
            *cache = base_dir.join(&*cache);
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
    pub sha256: Option<String>,
    /// Wall-clock budget for one `handle` call.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Linear memory cap per instance.
    #[serde(default = "default_memory", with = "crate::common::units::size")]
    pub memory: u64,
    /// Host calls (kv, outbox, log, config) allowed per delivery.
    #[serde(default = "default_max_host_calls")]
    pub max_host_calls: u32,
    /// Outbox events one delivery may emit.
    #[serde(default = "default_max_events")]
    pub max_events: u32,
    /// Total bytes of kv keys and values one delivery may write (overwrites count again).
    #[serde(default = "default_max_kv_bytes", with = "crate::common::units::size")]
    pub max_kv_bytes: u64,
    /// Total bytes of outbox events (payloads, headers, names) one delivery may emit.
    #[serde(
        default = "default_max_event_bytes",
        with = "crate::common::units::size"
    )]
    pub max_event_bytes: u64,
    /// Instances of this plugin alive at once; deliveries beyond it wait for a free one.
    /// Default: one per CPU core for Python components, two for JavaScript ones (each warm
    /// instance keeps its interpreter's heap), else only the runtime's instance slots.
    pub max_concurrency: Option<u32>,
    /// Total bytes of log messages one delivery may write through the `log` import.
    #[serde(default = "default_max_log_bytes", with = "crate::common::units::size")]
    pub max_log_bytes: u64,
    /// `"per-delivery"`: a fresh instance for every delivery, so no guest state survives
    /// one. `"per-batch"`: one instance serves up to `reuse` deliveries, one after another,
    /// and guest globals survive between them (docs/handler-guide.md, "Isolation"). Unset:
    /// per-batch for a Python or JavaScript component, per-delivery for any other
    /// (`runtime::language`).
    pub isolation: Option<IsolationMode>,
    /// With `isolation = "per-batch"`: deliveries one instance serves before a fresh one
    /// replaces it, 1 to 10,000 (default 64). Refused with `"per-delivery"`.
    pub reuse: Option<u32>,
    /// Variables the plugin reads through the `config` import; `${VAR}` allowed.
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    /// For a wasi:messaging component: the exchange its `producer.send` publishes to,
    /// through the outbox, with the topic as routing key (`""`: the default exchange).
    /// Unset: `client.connect` answers `permission-denied`, so the component cannot send.
    pub standard_exchange: Option<String>,
    /// A new version run beside this one on live traffic (same settings and kv namespace,
    /// a throwaway store): its verdicts and effects are compared and counted, never
    /// committed or published. Relative to the config file.
    pub shadow: Option<PathBuf>,
    /// Optional pin of the shadow component's SHA-256 (hex).
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
    pub canary: Option<CanaryConfig>,
}

/// `isolation` of `[plugins.NAME]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationMode {
    /// A fresh instance per delivery.
    PerDelivery,
    /// An instance reused for up to `reuse` deliveries.
    PerBatch,
}

/// The longest exchange name AMQP carries (a short string).
const MAX_EXCHANGE_BYTES: usize = 255;

/// The most deliveries `reuse` may give one instance.
const MAX_REUSE: u32 = 10_000;

/// `[plugins.NAME.canary]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryConfig {
    /// The new component, relative to the config file.
    pub path: PathBuf,
    /// Optional pin of its SHA-256 (hex).
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
#[serde(default, deny_unknown_fields)]
pub struct RollbackConfig {
    /// Roll back when the canary's failure rate (retry, dead-letter and trap verdicts)
    /// exceeds the stable version's by more than this (0.05: five points).
    pub failure_rate: f64,
    /// ... once the canary handled at least this many deliveries within the window.
    pub min_deliveries: u64,
    /// The sliding window both rates are measured over.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

impl Default for RollbackConfig {
    fn default() -> Self {
        Self {
            failure_rate: 0.05,
            min_deliveries: 200,
            window: Duration::from_secs(300),
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
    DeliveryTotals::default().kv_bytes
}
fn default_max_event_bytes() -> u64 {
    DeliveryTotals::default().event_bytes
}
fn default_max_log_bytes() -> u64 {
    DeliveryTotals::default().log_bytes
}

impl PluginConfig {
    /// How the plugin's instances are shared between its deliveries; `None`: the default
    /// for the component's language, decided when it loads.
    pub fn isolation(&self) -> Option<Isolation> {
        self.isolation.map(|mode| match mode {
            IsolationMode::PerDelivery => Isolation::PerDelivery,
            IsolationMode::PerBatch => Isolation::PerBatch {
                reuse: self.reuse.unwrap_or(DEFAULT_REUSE),
            },
        })
    }

    /// Resolves relative paths against `base_dir` and checks the pin, the shadow, the canary
    /// and the limits, so a bad plugin stops start-up. `Err((key, message))` with the key
    /// under `plugins.NAME` (empty: the table itself).
    pub fn validate(&mut self, base_dir: &Path) -> Result<(), (&'static str, String)> {
        if let Some(digest) = &self.sha256
            && (digest.len() != 64 || !digest.chars().all(|c| c.is_ascii_hexdigit()))
        {
            return Err((
                "sha256",
                "must be 64 hex characters (run `sha256sum FILE.wasm`)".into(),
            ));
        }
        if self.path.is_relative() {
            self.path = base_dir.join(&self.path);
        }
        if let Some(shadow) = &mut self.shadow {
            if shadow.is_relative() {
                *shadow = base_dir.join(&*shadow);
            }
            if !shadow.is_file() {
                return Err((
                    "shadow",
                    format!("no shadow plugin file at {}", shadow.display()),
                ));
            }
        }
        if let Some(canary) = &mut self.canary {
            if canary.path.is_relative() {
                canary.path = base_dir.join(&canary.path);
            }
            let rule = &canary.rollback_on;
            let problem = if !canary.path.is_file() {
                Some(format!(
                    "no canary plugin file at {}",
                    canary.path.display()
                ))
            } else if !(0.0..=100.0).contains(&canary.percent) {
                Some("percent must be within 0..=100".to_owned())
            } else if !(0.0..=1.0).contains(&rule.failure_rate) || rule.window.is_zero() {
                Some("rollback_on: failure_rate within 0.0..=1.0 and a window above zero".into())
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(("canary", problem));
            }
        }
        if !(0.0..=1.0).contains(&self.shadow_sample) || self.shadow_max_in_flight == 0 {
            return Err((
                "shadow_sample",
                "shadow_sample must be within 0.0..=1.0 and shadow_max_in_flight above zero".into(),
            ));
        }
        if !self.path.is_file() {
            return Err((
                "path",
                format!(
                    "no plugin file at {}; build plugins with scripts/build-plugins.sh or fix the path",
                    self.path.display()
                ),
            ));
        }
        if let Some(exchange) = &self.standard_exchange
            && (exchange.len() > MAX_EXCHANGE_BYTES || exchange.contains('\0'))
        {
            return Err((
                "standard_exchange",
                format!(
                    "an exchange name is at most {MAX_EXCHANGE_BYTES} bytes, without NUL \
                     (got {} bytes)",
                    exchange.len()
                ),
            ));
        }
        if self.timeout.is_zero() || self.memory < (1 << 20) {
            return Err((
                "",
                "timeout must be above zero and memory at least 1MiB".into(),
            ));
        }
        if let Some(reuse) = self.reuse {
            if self.isolation != Some(IsolationMode::PerBatch) {
                return Err((
                    "reuse",
                    "applies only with isolation = \"per-batch\" set beside it: add that line \
                     to let one instance serve that many deliveries, or remove `reuse`"
                        .into(),
                ));
            }
            if !(1..=MAX_REUSE).contains(&reuse) {
                return Err((
                    "reuse",
                    format!("must be within 1..={MAX_REUSE} deliveries per instance, not {reuse}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `[plugins.p]` table of `lines` beside a component file, resolved and checked.
    fn plugin(lines: &str) -> Result<PluginConfig, (&'static str, String)> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("p.wasm"), b"\0asm").expect("write");
        let text = format!("path = \"p.wasm\"\n{lines}");
        let mut plugin: PluginConfig = toml::from_str(&text).expect("parses");
        plugin.validate(dir.path()).map(|()| plugin)
    }

    #[test]
    fn isolation_is_left_to_the_language_unless_set() {
        let default = plugin("").expect("valid");
        assert_eq!(default.isolation(), None);
        let batch = plugin("isolation = \"per-batch\"").expect("valid");
        assert_eq!(batch.isolation(), Some(Isolation::PerBatch { reuse: 64 }));
        let four = plugin("isolation = \"per-batch\"\nreuse = 4").expect("valid");
        assert_eq!(four.isolation(), Some(Isolation::PerBatch { reuse: 4 }));
        let named = plugin("isolation = \"per-delivery\"").expect("valid");
        assert_eq!(named.isolation(), Some(Isolation::PerDelivery));
    }

    #[test]
    fn reuse_needs_per_batch_and_a_count_within_bounds() {
        let (key, why) = plugin("reuse = 4").expect_err("refused");
        assert_eq!(key, "reuse");
        assert!(why.contains("per-batch"), "{why}");
        let named = "isolation = \"per-delivery\"\nreuse = 4";
        let (key, why) = plugin(named).expect_err("refused");
        assert_eq!(key, "reuse");
        assert!(why.contains("only with"), "{why}");
        for bad in [0, 10_001] {
            let lines = format!("isolation = \"per-batch\"\nreuse = {bad}");
            let (key, why) = plugin(&lines).expect_err("refused");
            assert_eq!(key, "reuse");
            assert!(why.contains("1..=10000"), "{why}");
        }
        plugin("isolation = \"per-batch\"\nreuse = 10000").expect("the most");
        plugin("isolation = \"per-batch\"\nreuse = 1").expect("the least");
        let unknown = "path = \"p.wasm\"\nisolation = \"per-message\"";
        assert!(toml::from_str::<PluginConfig>(unknown).is_err());
    }

    #[test]
    fn standard_exchange_is_unset_by_default_and_must_be_an_amqp_name() {
        assert_eq!(plugin("").expect("valid").standard_exchange, None);
        let set = plugin("standard_exchange = \"standard.out\"").expect("valid");
        assert_eq!(set.standard_exchange.as_deref(), Some("standard.out"));
        let long = format!("standard_exchange = \"{}\"", "x".repeat(256));
        let (key, why) = plugin(&long).expect_err("refused");
        assert_eq!(key, "standard_exchange");
        assert!(why.contains("255 bytes"), "{why}");
    }
}
