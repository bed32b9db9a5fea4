//! `[[routes]]`: a queue, the plugin that handles it and how its deliveries are treated
//! (key, gates, retries, dead-letter alert), with the checks that concern one route alone.
//! The route's topology is derived here ([`RouteConfig::topology`]), so `topology` knows
//! nothing of the config. `config` checks what spans sections: plugin names, queues routed
//! twice. Whether a route's plugin can take `batch` is checked where routes meet loaded
//! plugins (`live::supervisor`).

use crate::runtime::StandardErrorPolicy;
use crate::topology::{Binding, QueueType, RouteTopology};
use serde::Deserialize;
use std::time::Duration;
use toml::Spanned;

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
    #[serde(default = "default_max_body", with = "crate::common::units::size")]
    pub max_body_size: u64,
    /// If set, messages with another content type are dead-lettered before the plugin runs.
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
    /// What a wasi:messaging component's `permission-denied` and `other` errors become:
    /// `retry` (default: retried until the attempt limit, then dead-lettered) or
    /// `dead-letter` (at once). Its `timeout` and `connection` are always retried.
    #[serde(default)]
    pub standard_errors: StandardErrorPolicy,
    /// Optional `x-message-ttl` on the work queue (expired messages are dead-lettered).
    #[serde(default, with = "humantime_serde")]
    pub message_ttl: Option<std::time::Duration>,
    /// Optional `x-max-length` on the work queue (overflow is dead-lettered).
    pub max_length: Option<u64>,
    /// Optional alert: an ERROR log, a gauge and a `/readyz` note when the route's dead
    /// letters within `window` reach `count`.
    pub dead_letter_alert: Option<DeadLetterAlertConfig>,
    /// Optional batching: up to `max` deliveries gathered for `wait` and handed to the
    /// plugin's `handle-batch` in one call (the plugin must export it).
    pub batch: Option<BatchConfig>,
}

/// `batch = { max = 16, wait = "20ms" }`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Most deliveries per `handle-batch` call (1 to the route's `prefetch`).
    pub max: u16,
    /// How long the first delivery of a batch waits for more (at most 5s).
    #[serde(default = "default_batch_wait", with = "humantime_serde")]
    pub wait: Duration,
}

/// Longest `batch.wait`: a gathered delivery is held unprocessed meanwhile.
pub const MAX_BATCH_WAIT: Duration = Duration::from_secs(5);

fn default_batch_wait() -> Duration {
    Duration::from_millis(20)
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
    #[serde(
        default = "default_backoff",
        with = "crate::common::units::duration_list"
    )]
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

impl RouteConfig {
    /// The checks on this route alone. `Err((key, message))` with the key under
    /// `routes[i]`. The queue name is checked by `config`, with its uniqueness.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        KeySource::parse(&self.idempotency_key).map_err(|m| ("idempotency_key", m.to_string()))?;
        if self.prefetch == 0 {
            return Err(("prefetch", "must be at least 1".into()));
        }
        if self.retry.max_attempts == 0 || self.retry.backoff.is_empty() {
            return Err((
                "retry",
                "max_attempts must be at least 1 and backoff must list at least one delay".into(),
            ));
        }
        if let Some(alert) = &self.dead_letter_alert
            && (alert.count == 0 || alert.window < Duration::from_secs(1))
        {
            return Err((
                "dead_letter_alert",
                format!(
                    "count must be at least 1 and window at least 1s (got count = {}, window = {:?}); \
                     e.g. dead_letter_alert = {{ count = 10, window = \"1h\" }}",
                    alert.count, alert.window
                ),
            ));
        }
        if self.retry.backoff.iter().any(|d| d.is_zero()) {
            return Err(("retry.backoff", "delays must be above zero".into()));
        }
        if let Some(batch) = &self.batch {
            if batch.max == 0 || batch.max > self.prefetch {
                return Err((
                    "batch.max",
                    format!(
                        "must be between 1 and the route's prefetch ({}), got {}; a batch is \
                         gathered from the deliveries in flight",
                        self.prefetch, batch.max
                    ),
                ));
            }
            if batch.wait > MAX_BATCH_WAIT {
                return Err((
                    "batch.wait",
                    format!(
                        "must be at most {MAX_BATCH_WAIT:?} (got {:?}): gathered deliveries wait \
                         unprocessed meanwhile",
                        batch.wait
                    ),
                ));
            }
        }
        Ok(())
    }

    /// What this route needs from the broker: the one definition the gateway,
    /// `carteiro check`, tests and benchmarks all declare.
    pub fn topology(&self) -> RouteTopology {
        RouteTopology {
            queue: self.queue.clone(),
            queue_type: match self.queue_type {
                QueueKind::Classic => QueueType::Classic,
                QueueKind::Quorum => QueueType::Quorum,
            },
            bindings: self
                .bindings
                .iter()
                .map(|b| Binding {
                    exchange: b.exchange.clone(),
                    exchange_type: b.exchange_type.clone(),
                    routing_key: b.routing_key.clone(),
                })
                .collect(),
            retry_delays: self.retry.backoff.clone(),
            max_attempts: self.retry.max_attempts,
            message_ttl: self.message_ttl,
            max_length: self.max_length,
        }
    }
}

/// Where a route's idempotency key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The AMQP `message_id` property.
    MessageId,
    /// A header, by name.
    Header(String),
    /// A JSON pointer (RFC 6901) into the body.
    JsonPointer(String),
}

/// An `idempotency_key` that names no key source; holds the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a key source; use `message_id`, `header:NAME` or `json:/pointer`")]
pub struct KeySourceError(pub String);

impl KeySource {
    /// Parses `message_id`, `header:NAME` or `json:/pointer`.
    pub fn parse(text: &str) -> Result<Self, KeySourceError> {
        if text == "message_id" {
            Ok(Self::MessageId)
        } else if let Some(name) = text.strip_prefix("header:").filter(|n| !n.is_empty()) {
            Ok(Self::Header(name.to_owned()))
        } else if let Some(pointer) = text.strip_prefix("json:").filter(|p| p.starts_with('/')) {
            Ok(Self::JsonPointer(pointer.to_owned()))
        } else {
            Err(KeySourceError(text.to_owned()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_sources_parse() {
        assert_eq!(KeySource::parse("message_id"), Ok(KeySource::MessageId));
        assert_eq!(
            KeySource::parse("header:x-id"),
            Ok(KeySource::Header("x-id".into()))
        );
        assert_eq!(
            KeySource::parse("json:/a/b"),
            Ok(KeySource::JsonPointer("/a/b".into()))
        );
        assert_eq!(
            KeySource::parse("json:a").unwrap_err().to_string(),
            "`json:a` is not a key source; use `message_id`, `header:NAME` or `json:/pointer`"
        );
    }

    #[test]
    fn standard_errors_defaults_to_retry_and_refuses_other_words() {
        let route = |extra: &str| {
            toml::from_str::<RouteConfig>(&format!("queue = \"q\"\nplugin = \"p\"\n{extra}"))
        };
        let default = route("").expect("parses");
        assert_eq!(default.standard_errors, StandardErrorPolicy::Retry);
        let dead = route("standard_errors = \"dead-letter\"").expect("parses");
        assert_eq!(dead.standard_errors, StandardErrorPolicy::DeadLetter);
        let err = route("standard_errors = \"drop\"").expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("drop") && text.contains("retry") && text.contains("dead-letter"),
            "{text}"
        );
    }
}
