//! `[broker]`: the RabbitMQ connection's settings and the checks that concern only them
//! (TLS against every URL). `config` interpolates `${VAR}` in the URLs first.

use super::BrokerTlsConfig;
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

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
    pub tls: Option<BrokerTlsConfig>,
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

impl BrokerConfig {
    /// `[broker.tls]` checked (files readable, relative paths resolved) and held against every
    /// broker URL. `Err((key, message))` with the key under `broker`.
    pub fn validate_tls(&mut self, base_dir: &Path) -> Result<(), (String, String)> {
        let addresses = self.addresses();
        if let Some(tls) = self.tls.as_mut() {
            tls.validate(base_dir)
                .map_err(|(key, m)| (format!("tls.{key}"), m))?;
            if let Some(plain) = addresses.iter().find(|u| !is_amqps(u)) {
                return Err((
                    "tls".into(),
                    format!(
                        "[broker.tls] is set but `{}` is plain AMQP; use amqps:// (the broker's TLS \
                         listener, usually port 5671) so nothing is sent in clear, or remove \
                         [broker.tls]",
                        crate::redact::redact_url(plain)
                    ),
                ));
            }
        }
        let has_client_cert = self.tls.as_ref().is_some_and(|t| t.cert_file.is_some());
        if let Some(external) = addresses.iter().find(|u| asks_external(u))
            && (!is_amqps(external) || !has_client_cert)
        {
            return Err((
                "url".into(),
                format!(
                    "`{}` logs in with auth_mechanism=external, which needs amqps:// and a client \
                     certificate: set [broker.tls] cert_file and key_file",
                    crate::redact::redact_url(external)
                ),
            ));
        }
        Ok(())
    }
}

/// Whether `url` is `amqps://` (any case).
pub(crate) fn is_amqps(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("amqps://"))
}

fn asks_external(url: &str) -> bool {
    url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|kv| kv.eq_ignore_ascii_case("auth_mechanism=external"))
    })
}
