//! `[telemetry]`: where spans go and how often, and the checks that concern only them.
//! `config` interpolates `${VAR}` in the endpoint first.

use serde::Deserialize;
use std::time::Duration;

/// `[telemetry]`: OpenTelemetry traces over OTLP/HTTP (protobuf). See docs/telemetry.md.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318` (spans go to
    /// `/v1/traces` under it; a URL already ending in `/v1/traces` is used as is). Unset or
    /// empty: telemetry is off and costs nothing. `${VAR}` allowed. Plain `http://` only.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of every span's resource.
    pub service_name: String,
    /// How often finished spans are sent in one batch.
    #[serde(with = "humantime_serde")]
    pub export_interval: Duration,
    /// Bound on one export request (and on the final flush at shutdown).
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "carteiro".to_owned(),
            export_interval: Duration::from_secs(5),
            export_timeout: Duration::from_secs(10),
        }
    }
}

impl TelemetryConfig {
    /// An empty endpoint turns telemetry off; a set one must be a plain-http OTLP URL.
    /// `Err((key, message))` with the key under `telemetry`.
    pub fn validate(&mut self) -> Result<(), (&'static str, String)> {
        if let Some(endpoint) = self.otlp_endpoint.as_ref() {
            let url = endpoint.trim();
            if url.is_empty() {
                self.otlp_endpoint = None;
            } else if url.starts_with("https://") {
                return Err((
                    "otlp_endpoint",
                    "https is not supported by this build; point it at a collector on a trusted \
                     network or on loopback over plain http, e.g. `http://127.0.0.1:4318`"
                        .into(),
                ));
            } else {
                let host = url.strip_prefix("http://").unwrap_or("");
                let authority = host.split('/').next().unwrap_or("");
                if authority.is_empty() || url.parse::<axum::http::Uri>().is_err() {
                    return Err((
                        "otlp_endpoint",
                        format!(
                            "`{}` is not an OTLP/HTTP URL; write it like `http://HOST:4318`",
                            crate::redact::redact_url(url)
                        ),
                    ));
                }
            }
        }
        if self.service_name.trim().is_empty() {
            return Err((
                "service_name",
                "must not be empty (it names Carteiro in the trace backend)".into(),
            ));
        }
        if self.export_interval.is_zero() || self.export_timeout.is_zero() {
            return Err((
                "export_interval",
                "export_interval and export_timeout must be above zero".into(),
            ));
        }
        Ok(())
    }
}
