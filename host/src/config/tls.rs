//! Connections whose TLS does not authenticate the server, across `[broker]` and `[store]`
//! (a cross-section warning). Each section's own TLS checks live with it:
//! `BrokerConfig::validate_tls`, `store::check_tls_params`.

use super::Config;
use crate::broker::is_amqps;

/// Connections to a host off loopback whose TLS does not authenticate the server, or that
/// have none: each a sentence for the start-up log and `carteiro check`, so a production
/// deployment notices what a local one may ignore.
pub fn unauthenticated_connections(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let store = &config.store.url;
    if store.starts_with("postgres://") || store.starts_with("postgresql://") {
        let parsed = url::Url::parse(store).ok();
        let host = parsed
            .as_ref()
            .and_then(|u| u.host_str().map(str::to_owned));
        let mode = parsed.as_ref().and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == "sslmode" || k == "ssl-mode")
                .map(|(_, v)| v.into_owned())
        });
        let host = host.filter(|h| !is_loopback(h));
        if let Some(host) = &host
            && mode.as_deref() == Some("verify-ca")
        {
            out.push(format!(
                "store: sslmode=verify-ca to {host} also accepts a certificate any public CA \
                 issued for any name (sqlx trusts its bundled roots beside sslrootcert); use \
                 sslmode=verify-full (docs/tls.md)"
            ));
        }
        let verified = matches!(mode.as_deref(), Some("verify-ca" | "verify-full"));
        if let Some(host) = host
            && !verified
        {
            out.push(format!(
                "store: sslmode={} to {host} does not check the server's certificate{}; use \
                 sslmode=verify-full with sslrootcert (docs/tls.md)",
                mode.as_deref().unwrap_or("prefer (the default)"),
                if matches!(mode.as_deref(), Some("require")) {
                    ""
                } else {
                    " and may send everything in clear"
                }
            ));
        }
    }
    for address in config.broker.addresses() {
        let host = url::Url::parse(&address)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned));
        if let Some(host) = host.filter(|h| !is_loopback(h))
            && !is_amqps(&address)
        {
            out.push(format!(
                "broker: {} is plain AMQP to {host}: the password and every message cross the \
                 network in clear; use amqps:// (docs/tls.md)",
                crate::redact::redact_url(&address)
            ));
        }
    }
    out
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::super::load_str;
    use std::path::Path;

    fn load(broker: &str) -> Result<super::super::Config, super::super::ConfigError> {
        load_str(
            &format!("version = 1\n[broker]\n{broker}\n"),
            Path::new("t.toml"),
            Path::new("/nonexistent"),
        )
    }

    #[test]
    fn broker_tls_refuses_plain_urls_and_names_missing_files() {
        let err = load("url = \"amqp://h/v\"\n[broker.tls]\nserver_name = \"h\"").unwrap_err();
        assert_eq!(err.key, "broker.tls");
        assert!(err.message.contains("plain AMQP"), "{err}");

        let err = load("url = \"amqps://h/v\"\n[broker.tls]\nca_file = \"ca.pem\"").unwrap_err();
        assert_eq!(err.key, "broker.tls.ca_file");
        assert!(err.message.contains("/nonexistent/ca.pem"), "{err}");

        let err = load("url = \"amqps://h/v\"\n[broker.tls]\ncolour = 1").unwrap_err();
        assert!(err.message.contains("unknown field"), "{err}");

        let err = load("url = \"amqps://h/v?auth_mechanism=external\"").unwrap_err();
        assert_eq!(err.key, "broker.url");
        assert!(err.message.contains("client certificate"), "{err}");

        load("url = \"amqps://h/v\"\n[broker.tls]\nserver_name = \"h\"").expect("valid");
    }

    #[test]
    fn unauthenticated_connections_off_loopback_are_named() {
        let with = |broker: &str, store: &str| {
            let text =
                format!("version = 1\n[broker]\nurl = \"{broker}\"\n[store]\nurl = \"{store}\"\n");
            let config = load_str(&text, Path::new("t.toml"), Path::new("/")).expect("valid");
            super::unauthenticated_connections(&config)
        };
        assert!(with("amqp://u:p@127.0.0.1/v", "postgres://localhost/c").is_empty());
        assert!(
            with(
                "amqps://mq.example/v",
                "postgres://db.example/c?sslmode=verify-full"
            )
            .is_empty()
        );
        let warned = with(
            "amqp://u:s3cret@mq.example/v",
            "postgres://db.example/c?sslmode=require",
        );
        assert_eq!(warned.len(), 2, "{warned:?}");
        assert!(
            warned[0].contains("sslmode=require to db.example"),
            "{warned:?}"
        );
        assert!(warned[1].contains("plain AMQP to mq.example"), "{warned:?}");
        assert!(!warned[1].contains("s3cret"), "{warned:?}");
        let default = with("amqps://mq.example/v", "postgres://db.example/c");
        assert!(default[0].contains("prefer (the default)"), "{default:?}");
        let ca_only = with(
            "amqps://mq.example/v",
            "postgres://db.example/c?sslmode=verify-ca",
        );
        assert!(
            ca_only[0].contains("use sslmode=verify-full"),
            "{ca_only:?}"
        );
    }
}
