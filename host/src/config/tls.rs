//! Validation of the TLS settings of both connections: `[broker.tls]` against the broker
//! URLs, and the libpq-style `ssl*` parameters of a PostgreSQL `[store] url`.

use super::BrokerConfig;
use std::path::Path;

/// `[broker.tls]` checked (files readable, relative paths resolved) and held against every
/// broker URL. `Err((key, message))` with the key under `broker`.
pub(super) fn validate_broker(
    broker: &mut BrokerConfig,
    base_dir: &Path,
) -> Result<(), (String, String)> {
    let addresses = broker.addresses();
    if let Some(tls) = broker.tls.as_mut() {
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
    let has_client_cert = broker.tls.as_ref().is_some_and(|t| t.cert_file.is_some());
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

fn is_amqps(url: &str) -> bool {
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
}
